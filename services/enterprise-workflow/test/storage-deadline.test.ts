// A frozen object store (design §6): a TCP peer that accepts connections and never answers stands in
// for S3. The webhook's HEAD must give up at its deadline and answer 503 with Retry-After, not wait for as
// long as the store stays frozen.
import { request as httpRequest, createServer as createHttpServer } from 'node:http';
import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { demoSites } from '@platform/enterprise-db';
import { createLogger } from '@platform/service-kit';
import request from 'supertest';
import { buildApp } from '../src/app.js';
import { createS3Storage } from '../src/storage/s3-store.js';
import type { S3Settings } from '../src/storage/s3-client.js';
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

// A store that takes its time to assemble (CompleteMultipartUpload answers after 4 s, as a large video does):
// the request deadline of every other call (here 2 s, room for the other calls on a loaded machine) must not
// end it; the long-call deadline does.
it('CompleteMultipartUpload has the long-call deadline, not the request deadline', async () => {
  const target = new URL(h.s3.endpoint);
  const slow = createHttpServer((req, res) => {
    const completing = req.method === 'POST' && (req.url ?? '').includes('uploadId=');
    setTimeout(
      () => {
        const upstream = httpRequest(
          {
            host: target.hostname,
            port: target.port,
            method: req.method,
            path: req.url,
            headers: req.headers,
          },
          (answer) => {
            res.writeHead(answer.statusCode ?? 502, answer.headers);
            answer.pipe(res);
          },
        );
        upstream.on('error', () => res.destroy());
        req.pipe(upstream);
      },
      completing ? 4000 : 0,
    );
  });
  await new Promise<void>((resolve) => slow.listen(0, '127.0.0.1', resolve));
  const { port } = slow.address() as AddressInfo;
  const settings = (longRequestTimeoutMs: number): S3Settings => ({
    endpoint: `http://127.0.0.1:${port}`,
    publicEndpoint: undefined,
    region: h.s3.region,
    bucket: h.s3.bucket,
    accessKeyId: h.s3.accessKeyId,
    secretAccessKey: h.s3.secretAccessKey,
    forcePathStyle: true,
    connectTimeoutMs: 2000,
    requestTimeoutMs: 2000,
    longRequestTimeoutMs,
  });
  const upload = async (storage: ReturnType<typeof createS3Storage>, key: string) => {
    const uploadId = await storage.createMultipartUpload({ key, contentType: 'video/mp4' });
    const body = Buffer.alloc(1024, 7);
    const url = await storage.presignPart({
      key,
      uploadId,
      partNumber: 1,
      sizeBytes: body.length,
      expiresInS: 60,
    });
    const put = await fetch(url.url, { method: 'PUT', body, headers: url.headers });
    expect(put.status).toBe(200);
    return { uploadId, etag: (put.headers.get('etag') ?? '').replaceAll('"', '') };
  };
  const patient = createS3Storage(settings(10_000));
  const hasty = createS3Storage(settings(2500));
  try {
    const a = await upload(patient, 'sites/deadline/a.mp4');
    await expect(
      patient.completeMultipartUpload({
        key: 'sites/deadline/a.mp4',
        uploadId: a.uploadId,
        parts: [{ partNumber: 1, etag: a.etag }],
      }),
    ).resolves.toBe(true);
    // The long-call deadline still holds: a store slower than it is unavailable, not waited for.
    const b = await upload(hasty, 'sites/deadline/b.mp4');
    await expect(
      hasty.completeMultipartUpload({
        key: 'sites/deadline/b.mp4',
        uploadId: b.uploadId,
        parts: [{ partNumber: 1, etag: b.etag }],
      }),
    ).rejects.toThrow();
  } finally {
    patient.destroy();
    hasty.destroy();
    await new Promise<void>((resolve) => slow.close(() => resolve()));
  }
});
