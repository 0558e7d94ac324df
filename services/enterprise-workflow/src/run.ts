// The workflow process (loaded by main.ts once SIGHUPs are held): configuration, connections, HTTP listener and
// graceful shutdown.
import { API_LOGIN } from '@platform/enterprise-db';
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
  redactUrl,
} from '@platform/service-kit';
import type { SecretSet } from '@platform/service-kit';
import { buildWorkflow } from './app.js';
import { createTokenVerifier } from './auth/token-verifier.js';
import { loadWorkflowConfig, readWebhookTokens, WebhookTokens } from './config.js';
import type { WorkflowDb } from './db/database.js';
import { createSweepMetrics } from './domain/counters.js';
import { acceptThroughWebhookPath, startExpiredUploadSweep } from './domain/multipart-sweep.js';
import { createS3Storage } from './storage/s3-store.js';

const SERVICE = 'enterprise-workflow';

async function main(): Promise<void> {
  let config;
  try {
    config = loadWorkflowConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${SERVICE}: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  const logger = createLogger({ service: SERVICE, level: config.logLevel });
  // Installed before anything is bound, as the gateway does for its API keys: SIGHUP's default action ends
  // the process, so a token rotation that signals a replica still starting must not kill it.
  let webhookTokens: SecretSet = new WebhookTokens(config.webhookTokens);
  // Kept until the process exits: a SIGHUP while it drains must not end it either.
  installSecretReload({
    logger,
    what: 'webhook tokens',
    read: () => new WebhookTokens(readWebhookTokens(config.webhookTokenSource)),
    apply: (tokens) => {
      webhookTokens = tokens;
    },
  });
  const dbUser = decodeURIComponent(new URL(config.database.url).username);
  if (dbUser !== API_LOGIN) {
    // design §4.2: runtime logins never own tables; another login would bypass the intended grants.
    logger.warn('DATABASE_URL does not use the workflow login', { expected: API_LOGIN, user: dbUser });
  }
  const metrics = createMetrics({ service: SERVICE });
  const db = createDb<WorkflowDb>(config.database.url, {
    max: config.database.poolMax,
    applicationName: SERVICE,
    statementTimeoutMs: config.database.statementTimeoutMs,
    queryTimeoutMs: config.database.queryTimeoutMs,
    connectionTimeoutMs: config.database.connectionTimeoutMs,
    logger,
    metrics,
  });
  const storage = createS3Storage(config.s3);
  const verifier = createTokenVerifier(config.oidc);
  const { app, ctx } = buildWorkflow({
    config,
    logger,
    db,
    storage,
    verifier,
    metrics,
    webhookTokens: () => webhookTokens,
  });
  const sweep = startExpiredUploadSweep(ctx, logger, {
    intervalS: config.multipart.sweepIntervalS,
    graceS: config.multipart.sweepGraceS,
    outcomes: createSweepMetrics(metrics),
    accept: acceptThroughWebhookPath(ctx),
  });

  // Deadlines on reading a request (design §6, service-kit listenHttp).
  const server = await listenHttp(app, config.http.port, config.http.host, logger);
  const address = server.address();
  const port = typeof address === 'object' && address !== null ? address.port : config.http.port;
  logger.info('listening', {
    port,
    database: redactUrl(config.database.url),
    issuer: config.oidc.issuerUrl,
    bucket: config.s3.bucket,
    s3_endpoint: config.s3.endpoint ?? 'aws',
    webhook_tokens: webhookTokens.size,
  });
  // Warm the key cache so the first request does not wait for the issuer (failure is not fatal:
  // /ready reports it and verification retries).
  void verifier.keysLoaded().then((ok) => {
    if (!ok) logger.warn('signing keys not loaded yet', { jwks_url: verifier.jwksUrl });
  });

  installShutdown({
    logger,
    timeoutMs: config.shutdownTimeoutMs,
    steps: [
      { name: 'http', close: () => closeHttpServer(server, Math.floor(config.shutdownTimeoutMs / 2)) },
      { name: 'multipart sweep', close: () => sweep.stop() },
      { name: 'db pool', close: () => db.destroy() },
      { name: 's3 client', close: () => Promise.resolve(storage.destroy()) },
    ],
  });
}

main().catch((err: unknown) => {
  process.stderr.write(`${SERVICE}: failed to start: ${errorMessage(err)}\n`);
  process.exit(1);
});
