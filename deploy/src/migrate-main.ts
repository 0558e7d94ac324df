// `npm run migrate` and the platform-ops image's CMD (`node deploy/dist/migrate-main.js`): applies every
// migration set to DATABASE_URL (an owner login). Idempotent.
import { errorMessage } from '@platform/service-kit';
import { migrateAll, requireDatabaseUrl } from './platform-database.js';

try {
  await migrateAll(requireDatabaseUrl(process.env), process.env);
  console.log('migrations applied');
} catch (err) {
  console.error(`migrate failed: ${errorMessage(err)}`);
  process.exitCode = 1;
}
