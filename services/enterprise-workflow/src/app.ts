// buildApp(deps): the workflow's HTTP application, without listening (tests use it directly).
import { addRoutes, createHttpApp, finishHttpApp } from '@platform/service-kit';
import type { Logger, Registry, SecretSet } from '@platform/service-kit';
import type { Express } from 'express';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import type { TokenVerifier } from './auth/token-verifier.js';
import { WebhookTokens } from './config.js';
import type { WorkflowConfig } from './config.js';
import type { WorkflowDb } from './db/database.js';
import type { WorkflowContext } from './domain/context.js';
import { createWorkflowMetrics } from './domain/counters.js';
import { defaultMultipartSettings } from './domain/multipart-uploads.js';
import type { MultipartSettings } from './domain/context.js';
import { workflowRoutes } from './http/routes.js';
import type { MediaStorage } from './domain/ports.js';

export interface AppDeps {
  config: Pick<WorkflowConfig, 'media' | 'idempotencyTtlS' | 'webhookTokens'> & {
    http?: Pick<WorkflowConfig['http'], 'trustProxy'>;
    /** Default: defaultMultipartSettings. */
    multipart?: MultipartSettings;
  };
  logger: Logger;
  db: Kysely<WorkflowDb>;
  storage: MediaStorage;
  verifier: TokenVerifier;
  /** Serve /metrics from this registry (and record HTTP metrics on it). */
  metrics?: Registry;
  /** Clock; tests may fix it. */
  now?: () => Date;
  /**
   * The webhook tokens valid now, asked on every webhook request so a SIGHUP reload (main.ts) takes effect at
   * once. Default: `config.webhookTokens`, fixed.
   */
  webhookTokens?: () => SecretSet;
}

/** Bound on the readiness probe's database round trip, in milliseconds. */
const READY_DB_TIMEOUT_MS = 2000;

async function databaseAnswers(db: Kysely<WorkflowDb>): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      sql`SELECT 1`.execute(db),
      new Promise((_resolve, reject) => {
        timer = setTimeout(() => reject(new Error('timeout')), READY_DB_TIMEOUT_MS);
      }),
    ]);
    return true;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

/** The HTTP application, without listening (tests use it directly). */
export function buildApp(deps: AppDeps): Express {
  return buildWorkflow(deps).app;
}

/**
 * The HTTP application and the context its use cases run in, which main.ts also hands to the work that runs
 * beside the app (the multipart sweep accepts through the webhook's path with it; one set of counters).
 */
export function buildWorkflow(deps: AppDeps): { app: Express; ctx: WorkflowContext } {
  const ctx: WorkflowContext = {
    db: deps.db,
    storage: deps.storage,
    media: deps.config.media,
    multipart: deps.config.multipart ?? defaultMultipartSettings,
    idempotencyTtlS: deps.config.idempotencyTtlS,
    metrics: deps.metrics,
    counters: createWorkflowMetrics(deps.metrics),
    now: deps.now ?? (() => new Date()),
  };
  const fixedTokens = new WebhookTokens(deps.config.webhookTokens);
  const webhookTokens = deps.webhookTokens ?? (() => fixedTokens);
  const app = createHttpApp({
    logger: deps.logger,
    trustProxy: deps.config.http?.trustProxy ?? 0,
    // Never routed by the Ingress (design §5): the store's webhook, the kubelet's probes, Prometheus. Whatever
    // they answer (a 404 under /internal too), the log names the peer, never a forwarded address.
    directPaths: ['/internal', '/health', '/ready', '/metrics'],
    ...(deps.metrics === undefined ? {} : { metrics: deps.metrics }),
  });
  addRoutes(
    app,
    workflowRoutes({
      ctx,
      verifier: deps.verifier,
      webhookTokens,
      checkReady: async () => {
        const [database, keys] = await Promise.all([databaseAnswers(deps.db), deps.verifier.keysLoaded()]);
        return { database: database ? 'ok' : 'failed', signing_keys: keys ? 'ok' : 'failed' };
      },
    }),
  );
  return { app: finishHttpApp(app, deps.logger), ctx };
}
