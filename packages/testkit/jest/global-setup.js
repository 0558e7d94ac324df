// Placeholder replaced by the testkit work: starts embedded PostgreSQL once per run.
export default async function globalSetup() {}
