// Stops the cluster globalSetup started (nothing when TEST_DATABASE_URL came from outside).
// Jest may call this once per project; the first call stops it, later ones find nothing to do.
export default async function globalTeardown() {
  const server = globalThis.__testkitPostgres;
  if (server === undefined) return;
  globalThis.__testkitPostgres = undefined;
  delete process.env.TEST_DATABASE_URL;
  await server.destroy();
}
