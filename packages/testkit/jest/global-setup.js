// Runs once in jest's parent process before any test file: one embedded PostgreSQL cluster per run,
// shared by every worker through TEST_DATABASE_URL (workers inherit the parent's environment).
// Each test file then gets its own database from createTestDatabase(). With TEST_DATABASE_URL
// already set (CI service, a developer's server), nothing is started.
// Plain JS on the compiled testkit: `npm test` runs `tsc -b` first.
import { existsSync } from 'node:fs';

const compiled = new URL('../dist/postgres.js', import.meta.url);

export default async function globalSetup() {
  // Jest calls the root config's and each project's globalSetup; start one cluster only.
  if (globalThis.__testkitPostgres !== undefined) return;
  if (process.env.TEST_DATABASE_URL) return;
  if (!existsSync(compiled)) {
    throw new Error('packages/testkit is not compiled: run `npx tsc -b` at the repository root first');
  }
  const { startPostgres } = await import(compiled.href);
  const server = await startPostgres();
  globalThis.__testkitPostgres = server;
  process.env.TEST_DATABASE_URL = server.url;
}
