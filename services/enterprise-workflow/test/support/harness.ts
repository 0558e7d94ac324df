// A real workflow app for tests: its own database (enterprise migrations + demo seed), connected as
// enterprise_api_login; a local S3 (s3rver, or Ceph's RADOS Gateway for the store-facing suites, which run
// against both); a Keycloak-style issuer with real keys. Nothing mocked.
import { PassThrough } from 'node:stream';
import {
  API_LOGIN,
  enterpriseMigrations,
  devRolePasswords,
  seedEnterprise,
  urlForLogin,
} from '@platform/enterprise-db';
import { createDb, createLogger, createMetrics } from '@platform/service-kit';
import type { Registry } from '@platform/service-kit';
import { createTestDatabase, startIssuer, startObjectStore } from '@platform/testkit';
import type { Issuer, ObjectStoreKind, TestDatabase, TestObjectStore } from '@platform/testkit';
import type { Express } from 'express';
import type { Kysely } from 'kysely';
import { buildApp } from '../../src/app.js';
import { createTokenVerifier } from '../../src/auth/token-verifier.js';
import type { TokenVerifier } from '../../src/auth/token-verifier.js';
import type { WorkflowDb } from '../../src/db/database.js';
import type { MultipartSettings } from '../../src/domain/context.js';
import { createS3Storage } from '../../src/storage/s3-store.js';
import type { MediaStorage } from '../../src/domain/ports.js';

export const WEBHOOK_TOKENS = ['webhook-token-old', 'webhook-token-new'];

export interface Harness {
  app: Express;
  issuer: Issuer;
  /** The store: s3rver or the RADOS Gateway (HarnessOptions.store). Presigned URLs are checked by both. */
  s3: TestObjectStore;
  storage: MediaStorage;
  verifier: TokenVerifier;
  database: TestDatabase;
  /** enterprise_api_login pool (what the app uses). */
  db: Kysely<WorkflowDb>;
  /** Superuser pool, for arranging and asserting state around RLS. */
  admin: Kysely<WorkflowDb>;
  metrics: Registry;
  /** Every log line the app wrote, parsed. */
  logs: Array<Record<string, unknown>>;
  /** Where forwarded events go (the listening app's webhook URL); undefined: nowhere (events are lost). */
  setEventTarget(url: string | undefined): void;
  /** Webhook answers to forwarded events, in order. */
  forwarded: number[];
  close(): Promise<void>;
}

export interface HarnessOptions {
  /** The object store (default s3rver). */
  store?: ObjectStoreKind;
  /** Presigned URLs point here instead of at the store. */
  publicEndpoint?: string;
  media?: Partial<{
    maxImageBytes: number;
    maxVideoBytes: number;
    uploadUrlTtlS: number;
    downloadUrlTtlS: number;
  }>;
  /** The app's database URL instead of the test database's enterprise_api_login URL. */
  databaseUrl?: string;
  jwksCooldownMs?: number;
  now?: () => Date;
  /**
   * Forward the store's ObjectCreated records under `sites/` to this webhook with a webhook token (as the local
   * stack's bridge does for s3rver; the RADOS Gateway's HTTP push cannot send a bearer token).
   */
  forwardEvents?: boolean;
  /** When files are uploaded in parts (default: the service's defaults). */
  multipart?: MultipartSettings;
  /** Browser origins the bucket's CORS rule allows. */
  corsOrigins?: string[];
  /** Deadline for a connection from the app's pool of 10, ms (default 2000, as the service's default). */
  dbConnectTimeoutMs?: number;
}

export async function startHarness(options: HarnessOptions = {}): Promise<Harness> {
  const database = await createTestDatabase({ migrations: [enterpriseMigrations] });
  const admin = createDb<WorkflowDb>(database.url, { max: 2 });
  await seedEnterprise(admin);
  const apiUrl = urlForLogin(database.url, API_LOGIN, devRolePasswords.enterpriseApi);
  const db = createDb<WorkflowDb>(options.databaseUrl ?? apiUrl, {
    max: 10,
    connectionTimeoutMs: options.dbConnectTimeoutMs ?? 2000,
    logger: { warn: () => undefined },
  });
  let eventTarget: string | undefined;
  const forwarded: number[] = [];
  const [issuer, s3] = await Promise.all([
    startIssuer(),
    startObjectStore(options.store ?? 's3rver', {
      ...(options.corsOrigins === undefined ? {} : { corsOrigins: options.corsOrigins }),
      ...(options.forwardEvents === true
        ? {
            // As deploy/minio/setup.sh configures MinIO: uploads only, not the workflow's accepted copies.
            eventPrefix: 'sites/',
            onObjectCreated: async (record) => {
              if (eventTarget === undefined) return;
              // As MinIO with a queue_dir: an event whose delivery failed on the way (a keep-alive
              // connection the app closed just then) is sent again; every answer counts, 503s included.
              for (let attempt = 1; ; attempt++) {
                try {
                  const res = await fetch(eventTarget, {
                    method: 'POST',
                    headers: {
                      'Content-Type': 'application/json',
                      Authorization: `Bearer ${WEBHOOK_TOKENS[0]}`,
                    },
                    body: JSON.stringify({ Records: [record] }),
                  });
                  forwarded.push(res.status);
                  return;
                } catch (err) {
                  if (attempt >= 3) throw err;
                  await new Promise((resolve) => setTimeout(resolve, 50 * attempt));
                }
              }
            },
          }
        : {}),
    }),
  ]);
  const storage = createS3Storage({
    endpoint: s3.endpoint,
    publicEndpoint: options.publicEndpoint,
    region: s3.region,
    bucket: s3.bucket,
    accessKeyId: s3.accessKeyId,
    secretAccessKey: s3.secretAccessKey,
    forcePathStyle: true,
  });
  const verifier = createTokenVerifier({
    issuerUrl: issuer.issuerUrl,
    clientId: issuer.clientId,
    requiredRole: 'enterprise_portal_role',
    clockToleranceS: 5,
    jwksCooldownMs: options.jwksCooldownMs ?? 30_000,
    jwksCacheMaxAgeMs: 600_000,
    jwksTimeoutMs: 2000,
    tokenCacheTtlMs: 60_000,
    tokenCacheMaxEntries: 10_000,
  });
  const logs: Array<Record<string, unknown>> = [];
  const stream = new PassThrough();
  stream.on('data', (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n'))
      if (line.trim() !== '') logs.push(JSON.parse(line) as Record<string, unknown>);
  });
  const logger = createLogger({ service: 'enterprise-workflow-test', level: 'info', stream });
  const metrics = createMetrics({ service: 'enterprise-workflow', defaultMetrics: false });
  const app = buildApp({
    config: {
      media: {
        maxImageBytes: 25 * 1024 * 1024,
        maxVideoBytes: 2 * 1024 * 1024 * 1024,
        uploadUrlTtlS: 900,
        downloadUrlTtlS: 300,
        ...options.media,
      },
      idempotencyTtlS: 86400,
      webhookTokens: WEBHOOK_TOKENS,
      ...(options.multipart === undefined ? {} : { multipart: options.multipart }),
    },
    logger,
    db,
    storage,
    verifier,
    metrics,
    ...(options.now === undefined ? {} : { now: options.now }),
  });
  return {
    app,
    issuer,
    s3,
    storage,
    verifier,
    database,
    db,
    admin,
    metrics,
    logs,
    forwarded,
    setEventTarget(url) {
      eventTarget = url;
    },
    async close() {
      storage.destroy();
      await Promise.all([db.destroy(), admin.destroy(), issuer.stop(), s3.stop()]);
      await database.drop();
    },
  };
}
