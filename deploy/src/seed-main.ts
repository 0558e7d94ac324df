// `npm run seed [-- --scale N]` and `node deploy/dist/seed-main.js` in the platform-ops image: loads the
// demo data set into DATABASE_URL (idempotent). `--scale N` adds N generated companies of 100 sites ×
// 1,000 work items each, for benchmarks.
import { errorMessage } from '@platform/service-kit';
import { parseArgs } from 'node:util';
import { requireDatabaseUrl, seedAll } from './platform-database.js';

try {
  const { values } = parseArgs({ options: { scale: { type: 'string', default: '0' } } });
  const scale = Number(values.scale);
  if (!Number.isSafeInteger(scale) || scale < 0) throw new Error('--scale takes a non-negative integer');
  const started = Date.now();
  await seedAll(requireDatabaseUrl(process.env), { scale });
  console.log(`seed loaded in ${Date.now() - started} ms`);
} catch (err) {
  console.error(`seed failed: ${errorMessage(err)}`);
  process.exitCode = 1;
}
