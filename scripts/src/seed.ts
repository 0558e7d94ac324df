// `npm run seed [-- --scale N]`: loads the demo data set into DATABASE_URL (idempotent). `--scale N`
// adds N generated companies of 100 sites × 1,000 work items each, for benchmarks.
import { parseArgs } from 'node:util';
import { seedAll } from './lib/database.js';
import { requireDatabaseUrl } from './lib/local.js';

try {
  const { values } = parseArgs({ options: { scale: { type: 'string', default: '0' } } });
  const scale = Number(values.scale);
  if (!Number.isSafeInteger(scale) || scale < 0) throw new Error('--scale takes a non-negative integer');
  const started = Date.now();
  await seedAll(requireDatabaseUrl(process.env), { scale });
  console.log(`seed loaded in ${Date.now() - started} ms`);
} catch (err) {
  console.error(`seed failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
