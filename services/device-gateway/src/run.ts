// The gateway process (loaded by main.ts once SIGHUPs are held): load config, bind CoAP and HTTP, load the
// registry (retrying until the database answers; /api/ready says 503 meanwhile), re-read API keys on SIGHUP,
// shut down cleanly on SIGTERM/SIGINT.
import {
  closeHttpServer,
  ConfigError,
  createDb,
  createLogger,
  createMetrics,
  errorMessage,
  installSecretReload,
  installShutdown,
  listenHttp,
  type Logger,
  type SecretSet,
} from '@platform/service-kit';
import type { Kysely } from 'kysely';
import { buildApp } from './app.js';
import { loadGatewayConfig, readApiKeys, type GatewayConfig } from './config.js';
import {
  connectionReserveGap,
  lockTableGap,
  readConnectionReserve,
  roleSettingsGap,
  preparedTransactionsGap,
  tempFileGap,
} from './db/connection-reserve.js';
import type { GatewayDatabase } from './db/tables.js';

/**
 * Says once, after the first load, when other logins could take every connection slot or fill the lock table and
 * lock this gateway's login out (migrations 0022, 0031; operations §7 "Connections the gateway keeps").
 */
async function reportConnectionReserve(db: Kysely<GatewayDatabase>, logger: Logger): Promise<void> {
  try {
    const reserve = await readConnectionReserve(db as Kysely<unknown>);
    const gap = connectionReserveGap(reserve);
    if (gap !== undefined)
      logger.warn('database: other logins can take every connection slot and lock this gateway out', {
        reason: gap,
        databases_open_to_public: reserve.openToPublic,
        see: 'docs/operations.md section 7, connections the gateway keeps',
      });
    const locks = lockTableGap(reserve);
    if (locks !== undefined)
      logger.warn("database: other logins can fill the cluster's lock table and lock this gateway out", {
        reason: locks,
        see: 'docs/operations.md section 7, connections the gateway keeps',
      });
    const disk = tempFileGap(reserve);
    if (disk !== undefined)
      logger.warn("database: other logins can fill the cluster's disk with temporary files", {
        reason: disk,
        see: 'docs/operations.md section 7, connections the gateway keeps',
      });
    const prepared = preparedTransactionsGap(reserve);
    if (prepared !== undefined)
      logger.warn('database: prepared transactions are enabled', {
        reason: prepared,
        see: 'docs/operations.md section 7, connections the gateway keeps',
      });
    // The connections pin what they rely on (service-kit PINNED_SESSION_OPTIONS); a default of the login's own
    // still says someone changed it (the sixth cold review's read-only default kept new replicas unready).
    const own = roleSettingsGap(reserve);
    if (own !== undefined)
      logger.warn("database: this gateway's login has session defaults of its own", {
        reason: own,
        see: "docs/operations.md section 7, a login's own defaults",
      });
  } catch (err) {
    logger.warn('database: connection reserve not read', { error: errorMessage(err) });
  }
}

async function main(): Promise<void> {
  let config: GatewayConfig;
  try {
    config = loadGatewayConfig();
  } catch (err) {
    // ConfigError never echoes secret values.
    process.stderr.write(`${err instanceof ConfigError ? err.message : String(err)}\n`);
    process.exit(1);
  }
  const logger = createLogger({ service: 'device-gateway', level: config.logLevel });
  let apiKeys: SecretSet;
  try {
    apiKeys = readApiKeys(config);
  } catch (err) {
    logger.error('refusing to start', { error: errorMessage(err) });
    process.exit(1);
  }
  // Installed before anything is bound (and SIGHUPs that came while the process loaded are held by main.ts and
  // handed over here): SIGHUP's default action ends the process, so a key rotation that signals a replica
  // still starting must not kill it. The workflow re-reads its webhook tokens the same way.
  installSecretReload({
    logger,
    what: 'API keys',
    read: () => readApiKeys(config),
    apply: (keys) => {
      apiKeys = keys;
    },
  });
  process.on('unhandledRejection', (reason) => {
    logger.error('unhandled rejection', { error: errorMessage(reason) });
  });

  const metrics = createMetrics({ service: 'device-gateway' });
  const db = createDb<GatewayDatabase>(config.database.url, {
    max: config.database.poolMax,
    applicationName: 'device-gateway',
    statementTimeoutMs: config.database.statementTimeoutMs,
    queryTimeoutMs: config.database.queryTimeoutMs,
    connectionTimeoutMs: config.database.connectionTimeoutMs,
    // Asynchronous commit for what this pool writes on the hot paths: replica-bus messages (design §3.6) and
    // delivery-record batches (§3.8). notify-settings answers `updated` once the message is committed:
    // visible to every replica's resync and NOTIFYed, both at commit. It need not survive a PostgreSQL crash:
    // the override it carries is memory-only state by design, which a gateway restart forgets too. Waiting
    // for the WAL flush was most of a cross-replica notify's latency with fsync on (bench:gateway
    // --replicas 2). Rollout writes must survive a crash once answered: each rollout function makes its own
    // transaction's commit synchronous (migration 0008, design §3.9), whatever this setting says.
    synchronousCommit: 'off',
    logger,
    metrics,
  });
  const app = buildApp({ config, logger, db, apiKeys: () => apiKeys, metrics });

  if (config.coap.security !== 'dtls' && config.nodeEnv === 'production') {
    // Chosen explicitly (production's default is dtls): say so at every start, where on-call will look.
    logger.warn(
      'PLAIN CoAP IS ON: devices on port GATEWAY_COAP_PORT are not authenticated and anyone on the device network can read any device and forge notifications; keep the port on a closed device network or set GATEWAY_COAP_SECURITY=dtls',
      { coap_security: config.coap.security, coap_port: config.coap.port },
    );
  }
  await app.coap.listen(config.coap.port, config.coap.host);
  logger.info('coap transports listening', {
    coap_security: config.coap.security,
    transports: app.coap.transports.map((t) => ({ kind: t.kind, port: t.address().port })),
  });
  // Deadlines on reading a request (design §6, service-kit listenHttp). Without GATEWAY_HTTP_HOST, node's default:
  // every interface (IPv6 and IPv4 where available).
  const server = await listenHttp(app.http, config.http.port, config.http.host, logger);
  const address = server.address();
  logger.info('http listening', {
    port: typeof address === 'object' && address !== null ? address.port : address,
  });

  app.delivery?.start();
  let stopping = false;
  installShutdown({
    logger,
    timeoutMs: config.shutdownTimeoutMs,
    steps: [
      {
        name: 'http',
        close: () => {
          stopping = true;
          return closeHttpServer(server, 3000);
        },
      },
      { name: 'coap', close: () => app.coap.close(2000) },
      {
        name: 'sites refresh',
        close: () => {
          app.registry.stopSitesRefresh();
          return Promise.resolve();
        },
      },
      // After CoAP (no report arrives any more): reports still queued are answered unavailable (the device retries).
      {
        name: 'device reports',
        close: () => {
          app.reports?.stop();
          return Promise.resolve();
        },
      },
      // Gives the driver lease up, so another replica drives at its next tick instead of after the lease.
      { name: 'rollout driver', close: () => app.rollouts.driver.stop() },
      // The audit rows of the last notifies and clears, before the pool closes.
      { name: 'audit rows', close: () => app.audit.flush({ final: true }) },
      {
        name: 'rollout assignment reads',
        close: () => {
          app.rollouts.assignments.stop();
          return Promise.resolve();
        },
      },
      { name: 'cluster bus', close: () => app.bus?.stop() ?? Promise.resolve() },
      // After CoAP (nothing more to record) and the bus (no replica can be reaped while its bus session is
      // up): writes what is left and takes this replica out of every device's observed_by (design §3.8).
      { name: 'delivery record', close: () => app.delivery?.stop() ?? Promise.resolve() },
      { name: 'db pool', close: () => db.destroy() },
    ],
  });

  // Company scopes follow the portal's sites between reloads (design §3.2).
  app.registry.refreshSitesEvery(config.sitesRefreshMs);
  if (app.bus !== undefined) {
    // Replicas (design §3.6): the bus LISTENs, then loads the registry and the retained overrides (retrying with backoff
    // until the database answers); /api/ready is 503 until that first resync is done.
    await app.bus.start();
    if (!stopping) logger.info('registry loaded; cluster bus listening', { origin: app.bus.origin });
    if (!stopping) await reportConnectionReserve(db, logger);
    if (!stopping && config.rollouts.driver) app.rollouts.driver.start();
    return;
  }
  // Single process: initial load, retried with backoff (0.5 s doubling to 10 s) until the database answers.
  for (let delayMs = 500; !stopping; delayMs = Math.min(delayMs * 2, 10_000)) {
    try {
      // Rollout assignments first, so every device enters the registry with its effective settings (§3.9).
      await app.rollouts.assignments.sync();
      const summary = await app.service.reload();
      logger.info('registry loaded', { ...summary, rejected: summary.rejected.length });
      break;
    } catch (err) {
      logger.warn('registry load failed; retrying', {
        error: errorMessage(err),
        retry_in_ms: delayMs,
      });
      await new Promise((r) => setTimeout(r, delayMs));
    }
  }
  if (!stopping) await reportConnectionReserve(db, logger);
  if (!stopping && config.rollouts.driver) app.rollouts.driver.start();
}

await main();
