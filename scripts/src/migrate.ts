// `npm run migrate`: applies every migration set to DATABASE_URL (an owner login). Idempotent.
import { migrateAll } from './lib/database.js';
import { requireDatabaseUrl } from './lib/local.js';

try {
  await migrateAll(requireDatabaseUrl(process.env), process.env);
  console.log('migrations applied');
} catch (err) {
  console.error(`migrate failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
