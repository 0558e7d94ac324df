// Issue 39 §5, the first hour: an upload the service rejected (its size or type broke the intent) downloaded as
// 404 "No such media item", so its uploader looked for a mistake in the id. The download now says it was
// rejected and why: 409 `media_rejected` with the reason (design §4.4). Real PostgreSQL and s3rver; the store's
// event is delivered to the webhook by the test.
import { PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { demoSites } from '@platform/enterprise-db';
import request from 'supertest';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';

const hq = demoSites.acmeHq.id;

let h: Harness;
let store: S3Client;
let bob: string;
let carol: string;

beforeAll(async () => {
  h = await startHarness();
  store = new S3Client({
    endpoint: h.s3.endpoint,
    region: h.s3.region,
    forcePathStyle: true,
    credentials: { accessKeyId: h.s3.accessKeyId, secretAccessKey: h.s3.secretAccessKey },
  });
  [bob, carol] = await Promise.all([h.issuer.demoToken('bob'), h.issuer.demoToken('carol')]);
});
afterAll(async () => {
  store.destroy();
  await h.close();
});

/** An intent, the object its uploader actually stored, and the store's event for it. */
async function uploaded(declared: { type: string; size: number }, body: Buffer, storedType: string) {
  const intent = await request(h.app)
    .post(`/sites/${hq}/media/upload-intents`)
    .set('Authorization', `Bearer ${bob}`)
    .send({ filename: 'photo.png', content_type: declared.type, size_bytes: declared.size });
  expect(intent.status).toBe(201);
  const mediaId = intent.body.media_id as string;
  const key = new URL(intent.body.upload.url as string).pathname.split('/').slice(2).join('/');
  await store.send(
    new PutObjectCommand({ Bucket: h.s3.bucket, Key: key, Body: body, ContentType: storedType }),
  );
  const hook = await request(h.app)
    .post('/internal/media/object-created')
    .set('Authorization', `Bearer ${WEBHOOK_TOKENS[0]}`)
    .send({
      Records: [
        {
          eventName: 'ObjectCreated:Put',
          s3: { bucket: { name: h.s3.bucket }, object: { key, size: body.length } },
        },
      ],
    });
  expect(hook.body.results).toEqual([{ key, outcome: 'rejected' }]);
  return mediaId;
}

function download(token: string, mediaId: string) {
  return request(h.app).get(`/sites/${hq}/media/${mediaId}/download`).set('Authorization', `Bearer ${token}`);
}

it.each([
  [
    'a size other than the declared one',
    { type: 'image/png', size: 10 },
    Buffer.from('123456789012'),
    'image/png',
    'The uploaded file was rejected: size 12 bytes differs from the declared 10 bytes. Upload it again with a new intent.',
  ],
  [
    'a content type other than the declared one',
    { type: 'image/png', size: 4 },
    Buffer.from('<p/>'),
    'text/html',
    'The uploaded file was rejected: content type text/html differs from the declared image/png. Upload it again with a new intent.',
  ],
] as const)(
  'a rejected upload (%s) downloads as 409 media_rejected, saying why',
  async (_what, declared, body, storedType, detail) => {
    const mediaId = await uploaded(declared, body, storedType);
    const res = await download(bob, mediaId);
    expect(res.status).toBe(409);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body).toMatchObject({
      status: 409,
      code: 'media_rejected',
      title: 'Media upload rejected',
      detail,
    });
    // Another tenant still learns nothing about it.
    const stranger = await download(carol, mediaId);
    expect({ status: stranger.status, code: stranger.body.code }).toEqual({ status: 404, code: 'not_found' });
  },
);
