// Database outage: every endpoint that needs the database answers 503 with Retry-After (the webhook
// too, so MinIO retries from its queue), nothing is half-written, and the same process recovers
// when the database is back, without a restart.
import {
  API_LOGIN,
  demoRowId,
  demoSites,
  enterpriseMigrations,
  devRolePasswords,
  seedEnterprise,
  urlForLogin,
} from '@platform/enterprise-db';
import { PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { createDb, createLogger, migrateToLatest } from '@platform/service-kit';
import { startIssuer, startPostgres, startS3 } from '@platform/testkit';
import type { Issuer, PostgresServer, S3Server } from '@platform/testkit';
import type { Express } from 'express';
import type { Kysely } from 'kysely';
import request from 'supertest';
import { buildApp } from '../src/app.js';
import { createTokenVerifier } from '../src/auth/token-verifier.js';
import type { WorkflowDb } from '../src/db/database.js';
import { createS3Storage } from '../src/storage/s3-store.js';
import type { MediaStorage } from '../src/domain/ports.js';

let pg: PostgresServer;
let issuer: Issuer;
let s3: S3Server;
let storage: MediaStorage;
let db: Kysely<WorkflowDb>;
let app: Express;
let token: string;

beforeAll(async () => {
  [pg, issuer, s3] = await Promise.all([startPostgres(), startIssuer(), startS3()]);
  const admin = createDb<WorkflowDb>(pg.url, { max: 1 });
  await migrateToLatest(admin, [enterpriseMigrations]);
  await seedEnterprise(admin);
  await admin.destroy();
  db = createDb<WorkflowDb>(urlForLogin(pg.url, API_LOGIN, devRolePasswords.enterpriseApi), {
    max: 4,
    statementTimeoutMs: 800,
    queryTimeoutMs: 1000,
    connectionTimeoutMs: 700,
    logger: { warn: () => undefined },
  });
  storage = createS3Storage({
    endpoint: s3.endpoint,
    publicEndpoint: undefined,
    region: s3.region,
    bucket: s3.bucket,
    accessKeyId: s3.accessKeyId,
    secretAccessKey: s3.secretAccessKey,
    forcePathStyle: true,
  });
  app = buildApp({
    config: {
      media: { maxImageBytes: 1000, maxVideoBytes: 1000, uploadUrlTtlS: 60, downloadUrlTtlS: 60 },
      idempotencyTtlS: 60,
      webhookTokens: ['hook'],
    },
    logger: createLogger({ service: 'outage-test', level: 'error' }),
    db,
    storage,
    verifier: createTokenVerifier({
      issuerUrl: issuer.issuerUrl,
      clientId: issuer.clientId,
      requiredRole: 'enterprise_portal_role',
      clockToleranceS: 5,
      jwksCooldownMs: 30_000,
      jwksCacheMaxAgeMs: 600_000,
      jwksTimeoutMs: 2000,
      tokenCacheTtlMs: 60_000,
      tokenCacheMaxEntries: 100,
    }),
  });
  token = await issuer.demoToken('alice');
  // The webhook asks the store before the database: an object must stand behind MEDIA_KEY.
  const client = new S3Client({
    endpoint: s3.endpoint,
    region: s3.region,
    forcePathStyle: true,
    credentials: { accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey },
  });
  await client.send(
    new PutObjectCommand({ Bucket: s3.bucket, Key: MEDIA_KEY, Body: 'x', ContentType: 'image/png' }),
  );
  client.destroy();
});

afterAll(async () => {
  storage.destroy();
  await db.destroy();
  await Promise.all([issuer.stop(), s3.stop()]);
  await pg.destroy();
});

const hq = demoSites.acmeHq.id;
/** A media-shaped key of no item, its object stored: the webhook looks such keys up, so it needs the database. */
const MEDIA_KEY = `sites/${hq}/media/0d2a2b56-6a43-4c39-9f0e-0f2f5a1b2c3d.png`;
const itemId = demoRowId('work_item', 'acmeHq', 1);

const calls = {
  intent: () =>
    request(app)
      .post(`/sites/${hq}/media/upload-intents`)
      .set('Authorization', `Bearer ${token}`)
      .send({ filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 10 }),
  download: () =>
    request(app)
      .get(`/sites/${hq}/media/${demoRowId('media_item', 'acmeHq', 1)}/download`)
      .set('Authorization', `Bearer ${token}`),
  decision: () =>
    request(app)
      .post(`/sites/${hq}/work-items/${itemId}/decision`)
      .set('Authorization', `Bearer ${token}`)
      .send({ decision: 'accept' }),
  webhook: () =>
    request(app)
      .post('/internal/media/object-created')
      .set('Authorization', 'Bearer hook')
      .send({
        EventName: 's3:ObjectCreated:Put',
        Key: `${s3.bucket}/${MEDIA_KEY}`,
        Records: [
          {
            eventName: 's3:ObjectCreated:Put',
            s3: {
              bucket: { name: s3.bucket },
              object: { key: MEDIA_KEY, size: 1, contentType: 'image/png' },
            },
          },
        ],
      }),
};

it('answers 503 with Retry-After while the database is down and recovers without a restart', async () => {
  // Warm up: keys fetched, pool connected.
  expect((await calls.download()).status).toBe(200);

  await pg.stop();
  for (const [name, call] of Object.entries(calls)) {
    const res = await call();
    expect({ name, status: res.status, code: res.body.code, retryAfter: res.headers['retry-after'] }).toEqual(
      {
        name,
        status: 503,
        code: 'backend_unavailable',
        retryAfter: '5',
      },
    );
    expect(JSON.stringify(res.body)).not.toMatch(/ECONNREFUSED|password|postgres:\/\//i);
  }
  const ready = await request(app).get('/ready');
  expect(ready.status).toBe(503);
  expect(ready.body.detail).toContain('database');
  expect((await request(app).get('/health')).status).toBe(200);

  await pg.start();
  expect((await request(app).get('/ready')).status).toBe(200);
  const decided = await calls.decision();
  expect(decided.status).toBe(200);
  expect(decided.body.status).toBe('accepted');
  expect((await calls.intent()).status).toBe(201);
  expect((await calls.webhook()).status).toBe(200);

  // The failed decision during the outage left no trace: exactly one audit row.
  expect(await decisionRows(itemId)).toBe(1);
});

async function decisionRows(workItemId: string): Promise<number> {
  const admin = createDb<WorkflowDb>(pg.url, { max: 1 });
  try {
    const rows = await admin
      .selectFrom('enterprise.work_item_decisions')
      .select('id')
      .where('work_item_id', '=', workItemId)
      .execute();
    return rows.length;
  } finally {
    await admin.destroy();
  }
}

it('answers 503 within the deadline while the database is frozen, and recovers after it resumes', async () => {
  const frozenItem = demoRowId('work_item', 'acmeHq', 2);
  const decide = () =>
    request(app)
      .post(`/sites/${hq}/work-items/${frozenItem}/decision`)
      .set('Authorization', `Bearer ${token}`)
      .send({ decision: 'decline', note: 'frozen' });
  expect((await calls.download()).status).toBe(200);
  const before = await decisionRows(frozenItem);

  await pg.freeze();
  try {
    // Concurrently, more than the pool holds: the pool's open connections meet the statement deadline, the
    // rest the connect deadline (the server accepts TCP and never answers the startup).
    const started = performance.now();
    const answers = await Promise.all([
      ...Object.entries(calls).map(async ([name, call]) => ({ name, res: await call() })),
      ...[1, 2, 3].map(async () => ({ name: 'decision', res: await decide() })),
    ]);
    const elapsedMs = performance.now() - started;
    for (const { name, res } of answers) {
      expect({
        name,
        status: res.status,
        code: res.body.code,
        retryAfter: res.headers['retry-after'],
      }).toEqual({
        name,
        status: 503,
        code: 'backend_unavailable',
        retryAfter: '5',
      });
      expect(JSON.stringify(res.body)).not.toMatch(/timeout|postgres|stack/i);
    }
    // One statement deadline (1 s) after one connect deadline at most, with scheduling slack.
    expect(elapsedMs).toBeLessThan(3500);
  } finally {
    await pg.thaw();
  }
  // The same app and pool serve again; the decisions cut short committed nothing.
  const decided = await decide();
  expect(decided.status).toBe(200);
  expect(await decisionRows(frozenItem)).toBe(before + 1);
});
