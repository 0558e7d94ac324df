// A frozen object store (design §6): a TCP peer that accepts connections and never answers stands in
// for S3. The webhook's HEAD must give up at its deadline and answer 503 with Retry-After, not wait for as
// long as the store stays frozen.
import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { demoSites } from '@platform/enterprise-db';
import { createLogger } from '@platform/service-kit';
import request from 'supertest';
import { buildApp } from '../src/app.js';
import { createS3Storage } from '../src/storage/s3-store.js';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
let blackHole: Server;
const held: Socket[] = [];

beforeAll(async () => {
  h = await startHarness();
  blackHole = createServer((socket) => {
    held.push(socket); // accepted, never read from or answered
  });
  await new Promise<void>((resolve) => blackHole.listen(0, '127.0.0.1', resolve));
});
afterAll(async () => {
  for (const socket of held) socket.destroy();
  await new Promise<void>((resolve) => blackHole.close(() => resolve()));
  await h.close();
});

it('a webhook whose HEAD meets a frozen store answers 503 with Retry-After within the deadline', async () => {
  const hq = demoSites.acmeHq.id;
  const bob = await h.issuer.demoToken('bob');
  const intent = await request(h.app)
    .post(`/sites/${hq}/media/upload-intents`)
    .set('Authorization', `Bearer ${bob}`)
    .send({ filename: 'a.png', content_type: 'image/png', size_bytes: 5 });
  expect(intent.status).toBe(201);
  const row = await h.admin
    .selectFrom('enterprise.media_items')
    .select('object_key')
    .where('id', '=', intent.body.media_id as string)
    .executeTakeFirstOrThrow();

  const { port } = blackHole.address() as AddressInfo;
  const frozen = createS3Storage({
    endpoint: `http://127.0.0.1:${port}`,
    publicEndpoint: undefined,
    region: h.s3.region,
    bucket: h.s3.bucket,
    accessKeyId: h.s3.accessKeyId,
    secretAccessKey: h.s3.secretAccessKey,
    forcePathStyle: true,
    connectTimeoutMs: 300,
    requestTimeoutMs: 300,
  });
  const app = buildApp({
    config: {
      media: { maxImageBytes: 1000, maxVideoBytes: 5000, uploadUrlTtlS: 900, downloadUrlTtlS: 300 },
      idempotencyTtlS: 60,
      webhookTokens: WEBHOOK_TOKENS,
    },
    logger: createLogger({ service: 'frozen-store-test', level: 'error' }),
    db: h.db,
    storage: frozen,
    verifier: h.verifier,
  });
  try {
    const started = performance.now();
    const res = await request(app)
      .post('/internal/media/object-created')
      .set('Authorization', `Bearer ${WEBHOOK_TOKENS[0]!}`)
      .send({
        Records: [
          {
            eventName: 'ObjectCreated:Put',
            s3: { bucket: { name: h.s3.bucket }, object: { key: row.object_key, size: 5 } },
          },
        ],
      });
    const elapsedMs = performance.now() - started;
    expect(res.status).toBe(503);
    expect(res.body).toMatchObject({ code: 'backend_unavailable' });
    expect(res.headers['retry-after']).toBe('5');
    // Two attempts of 300 ms each, and backoff: far below the seconds a frozen store would hold it.
    expect(elapsedMs).toBeLessThan(5000);
    expect(held.length).toBeGreaterThanOrEqual(1);
    // Nothing was recorded: the item is still pending.
    const after = await h.admin
      .selectFrom('enterprise.media_items')
      .select('status')
      .where('id', '=', intent.body.media_id as string)
      .executeTakeFirstOrThrow();
    expect(after.status).toBe('pending_upload');
  } finally {
    frozen.destroy();
  }
});
