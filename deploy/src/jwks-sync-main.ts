// Entry point of the JWKS sync (platform-ops image): `node deploy/dist/jwks-sync-main.js`.
// Configuration: see jwksSyncConfigSchema. Exits 1 when the first sync cannot succeed in time.
import { ConfigError, createDb, createLogger, errorMessage } from '@platform/service-kit';
import { loadJwksSyncConfig, runSyncLoop, targetFromConfig } from './jwks-sync.js';
import type { JwksSyncConfig } from './jwks-sync.js';

let config: JwksSyncConfig;
try {
  config = loadJwksSyncConfig();
} catch (err) {
  process.stderr.write(`${err instanceof ConfigError ? err.message : String(err)}\n`);
  process.exit(1);
}
const logger = createLogger({ service: 'jwks-sync', level: config.LOG_LEVEL });
const db = createDb(config.DATABASE_URL, { max: 1, applicationName: 'jwks-sync', logger });
const stop = new AbortController();
for (const signal of ['SIGTERM', 'SIGINT'] as const) process.once(signal, () => stop.abort());
try {
  await runSyncLoop({
    db,
    target: targetFromConfig(config),
    logger,
    intervalS: config.JWKS_SYNC_INTERVAL_S,
    startupTimeoutMs: config.JWKS_SYNC_STARTUP_TIMEOUT_S * 1000,
    readyFile: config.JWKS_SYNC_READY_FILE,
    signal: stop.signal,
  });
} catch (err) {
  logger.error('JWKS sync gave up', { error: errorMessage(err) });
  process.exitCode = 1;
} finally {
  await db.destroy();
}
