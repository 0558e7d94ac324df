// Upload intents, downloads and the object-created webhook against real PostgreSQL (RLS), real JWTs and each
// test store (s3rver and Ceph's RADOS Gateway).
import { createHash, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { ListObjectsV2Command, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import {
  validateDownloadResponse,
  validateProblemDocument,
  validateUploadIntentResponse,
} from '@platform/contracts';
import { demoRowId, demoSites, demoUserSubs } from '@platform/enterprise-db';
import { createLogger } from '@platform/service-kit';
import { encodeEventKey, OBJECT_STORE_KINDS } from '@platform/testkit';
import request from 'supertest';
import { buildApp } from '../src/app.js';
import { createS3Storage } from '../src/storage/s3-store.js';
import { startAwsCopyStore } from './support/aws-copy-store.js';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
let alice: string;
let bob: string;
let carol: string;
let s3client: S3Client;

describe.each(OBJECT_STORE_KINDS)('media against %s', (store) => {
  beforeAll(async () => {
    h = await startHarness({ store, media: { maxImageBytes: 1000, maxVideoBytes: 5000 } });
    [alice, bob, carol] = await Promise.all([
      h.issuer.demoToken('alice'),
      h.issuer.demoToken('bob'),
      h.issuer.demoToken('carol'),
    ]);
    s3client = new S3Client({
      endpoint: h.s3.endpoint,
      region: h.s3.region,
      forcePathStyle: true,
      credentials: { accessKeyId: h.s3.accessKeyId, secretAccessKey: h.s3.secretAccessKey },
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    });
  }, 60_000);
  afterAll(async () => {
    s3client?.destroy();
    await h?.close();
  });

  const hq = demoSites.acmeHq.id;
  const warehouse = demoSites.acmeWarehouse.id;
  const tower = demoSites.borealisTower.id;

  function intent(token: string, siteId: string, body: Record<string, unknown>) {
    return request(h.app)
      .post(`/sites/${siteId}/media/upload-intents`)
      .set('Authorization', `Bearer ${token}`)
      .send(body);
  }

  function download(token: string, siteId: string, mediaId: string) {
    return request(h.app)
      .get(`/sites/${siteId}/media/${mediaId}/download`)
      .set('Authorization', `Bearer ${token}`);
  }

  function webhook(body: unknown, token = WEBHOOK_TOKENS[1]!) {
    return request(h.app)
      .post('/internal/media/object-created')
      .set('Authorization', `Bearer ${token}`)
      .send(body as object);
  }

  /** A plain S3 event document (s3rver/AWS shape: URL-encoded key, no content type). */
  function s3Event(key: string, size: number, extra: Record<string, unknown> = {}) {
    return {
      Records: [
        {
          eventVersion: '2.1',
          eventSource: 'aws:s3',
          eventName: 'ObjectCreated:Put',
          s3: {
            bucket: { name: h.s3.bucket },
            object: { key: encodeEventKey(key), size, eTag: 'abc123', ...extra },
          },
        },
      ],
    };
  }

  /** MinIO's webhook body: `Key` is bucket/object, the record carries contentType. */
  function minioEvent(key: string, size: number, contentType: string) {
    return {
      EventName: 's3:ObjectCreated:Put',
      Key: `${h.s3.bucket}/${key}`,
      Records: [
        {
          eventVersion: '2.0',
          eventSource: 'minio:s3',
          eventName: 's3:ObjectCreated:Put',
          s3: {
            bucket: { name: h.s3.bucket },
            object: {
              key: encodeEventKey(key),
              size,
              eTag: '"d41d8cd98f00b204e9800998ecf8427e"',
              contentType,
            },
          },
        },
      ],
    };
  }

  async function objectKeyOf(mediaId: string): Promise<string> {
    const row = await h.admin
      .selectFrom('enterprise.media_items')
      .select('object_key')
      .where('id', '=', mediaId)
      .executeTakeFirstOrThrow();
    return row.object_key;
  }

  async function statusOf(mediaId: string): Promise<string> {
    const row = await h.admin
      .selectFrom('enterprise.media_items')
      .select('status')
      .where('id', '=', mediaId)
      .executeTakeFirstOrThrow();
    return row.status;
  }

  async function put(key: string, body: Buffer, contentType: string) {
    await s3client.send(
      new PutObjectCommand({ Bucket: h.s3.bucket, Key: key, Body: body, ContentType: contentType }),
    );
  }

  function pathsOf(res: request.Response): string[] {
    return (res.body as { errors: Array<{ path: string }> }).errors.map((e) => e.path);
  }

  function expectProblem(res: request.Response, status: number, code: string) {
    expect(res.status).toBe(status);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body.code).toBe(code);
    expect(validateProblemDocument(res.body).ok).toBe(true);
  }

  describe('POST /sites/{site_id}/media/upload-intents', () => {
    it('creates a pending item and a presigned PUT', async () => {
      const res = await intent(bob, hq, {
        filename: 'boiler room.jpg',
        content_type: 'image/jpeg',
        size_bytes: 900,
      });
      expect(res.status).toBe(201);
      expect(validateUploadIntentResponse(res.body).ok).toBe(true);
      expect(res.body.status).toBe('pending_upload');
      expect(res.body.upload.method).toBe('PUT');
      expect(res.body.upload.headers).toEqual({ 'Content-Type': 'image/jpeg' });
      expect(res.headers.location).toBe(`/sites/${hq}/media/${res.body.media_id}/download`);
      const expiresInS = (Date.parse(String(res.body.upload.expires_at)) - Date.now()) / 1000;
      expect(expiresInS).toBeGreaterThan(890);
      expect(expiresInS).toBeLessThanOrEqual(900);

      const row = await h.admin
        .selectFrom('enterprise.media_items')
        .selectAll()
        .where('id', '=', res.body.media_id)
        .executeTakeFirstOrThrow();
      expect(row).toMatchObject({
        site_id: hq,
        status: 'pending_upload',
        filename: 'boiler room.jpg',
        declared_content_type: 'image/jpeg',
        declared_size_bytes: '900',
        uploaded_by: demoUserSubs.bob,
      });
      // The key is the server's: site and a random id, never the filename.
      expect(row.object_key).toMatch(new RegExp(`^sites/${hq}/media/[0-9a-f-]{36}\\.jpg$`));
      const url = new URL(String(res.body.upload.url));
      expect(url.pathname).toBe(`/${h.s3.bucket}/${row.object_key}`);
      expect(url.searchParams.get('X-Amz-SignedHeaders')).toBe('content-length;content-type;host');
    });

    it('binds a declared checksum and stores it', async () => {
      const checksum = createHash('sha256').update('x').digest('base64');
      const res = await intent(bob, hq, {
        filename: 'a.png',
        content_type: 'image/png',
        size_bytes: 1,
        checksum_sha256: checksum,
      });
      expect(res.status).toBe(201);
      expect(res.body.upload.headers['x-amz-checksum-sha256']).toBe(checksum);
      const row = await h.admin
        .selectFrom('enterprise.media_items')
        .select('declared_checksum_sha256')
        .where('id', '=', res.body.media_id)
        .executeTakeFirstOrThrow();
      expect(row.declared_checksum_sha256).toBe(checksum);
    });

    it('links records of the same site', async () => {
      const res = await intent(alice, warehouse, {
        filename: 'leak.mp4',
        content_type: 'video/mp4',
        size_bytes: 4000,
        walkthrough_id: demoRowId('walkthrough', 'acmeWarehouse', 1),
        work_item_id: demoRowId('work_item', 'acmeWarehouse', 2),
        asset_id: demoRowId('asset', 'acmeWarehouse', 3),
      });
      expect(res.status).toBe(201);
      const row = await h.admin
        .selectFrom('enterprise.media_items')
        .selectAll()
        .where('id', '=', res.body.media_id)
        .executeTakeFirstOrThrow();
      expect(row.work_item_id).toBe(demoRowId('work_item', 'acmeWarehouse', 2));
    });

    it('refuses links to another site or another company without linking', async () => {
      const before = await h.admin
        .selectFrom('enterprise.media_items')
        .select(({ fn }) => fn.countAll<string>().as('n'))
        .executeTakeFirstOrThrow();
      const res = await intent(alice, hq, {
        filename: 'x.jpg',
        content_type: 'image/jpeg',
        size_bytes: 10,
        work_item_id: demoRowId('work_item', 'acmeWarehouse', 1),
        asset_id: demoRowId('asset', 'borealisTower', 1),
        walkthrough_id: '00000000-0000-4000-8000-000000000000',
      });
      expectProblem(res, 400, 'invalid_body');
      expect(pathsOf(res).sort()).toEqual(['/asset_id', '/walkthrough_id', '/work_item_id']);
      const after = await h.admin
        .selectFrom('enterprise.media_items')
        .select(({ fn }) => fn.countAll<string>().as('n'))
        .executeTakeFirstOrThrow();
      expect(after.n).toBe(before.n);
    });

    it('answers 404, not 400, for links into a site the caller cannot access, and inserts nothing', async () => {
      const count = async () =>
        (
          await h.admin
            .selectFrom('enterprise.media_items')
            .select(({ fn }) => fn.countAll<string>().as('n'))
            .executeTakeFirstOrThrow()
        ).n;
      const before = await count();
      const body = { filename: 'x.jpg', content_type: 'image/jpeg', size_bytes: 10 };
      const unlinked = await intent(alice, tower, body);
      // The links name real records of that very site: with a 400 naming the fields, the answer would
      // confirm the site (and its records) exist.
      const towerLinks = {
        walkthrough_id: demoRowId('walkthrough', 'borealisTower', 1),
        work_item_id: demoRowId('work_item', 'borealisTower', 1),
        asset_id: demoRowId('asset', 'borealisTower', 1),
      };
      const [walkthrough, workItem, asset] = await Promise.all([
        h.admin
          .selectFrom('enterprise.walkthrough_logs')
          .select('site_id')
          .where('id', '=', towerLinks.walkthrough_id)
          .executeTakeFirst(),
        h.admin
          .selectFrom('enterprise.work_items')
          .select('site_id')
          .where('id', '=', towerLinks.work_item_id)
          .executeTakeFirst(),
        h.admin
          .selectFrom('enterprise.assets')
          .select('site_id')
          .where('id', '=', towerLinks.asset_id)
          .executeTakeFirst(),
      ]);
      expect([walkthrough?.site_id, workItem?.site_id, asset?.site_id]).toEqual([tower, tower, tower]);
      const answers = await Promise.all([
        intent(alice, tower, { ...body, ...towerLinks }),
        intent(bob, warehouse, { ...body, work_item_id: demoRowId('work_item', 'acmeWarehouse', 1) }),
        intent(carol, hq, { ...body, asset_id: demoRowId('asset', 'acmeHq', 1) }),
      ]);
      for (const res of answers) {
        expectProblem(res, 404, 'not_found');
        expect(res.body.errors).toBeUndefined();
        expect(res.body.detail).toBe(unlinked.body.detail);
      }
      expect(await count()).toBe(before);
    });

    it.each([
      [{ filename: 'a.gif', content_type: 'image/gif', size_bytes: 10 }, '/content_type'],
      [{ filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 1001 }, '/size_bytes'],
      [{ filename: 'a.mov', content_type: 'video/quicktime', size_bytes: 5001 }, '/size_bytes'],
      [{ filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 0 }, '/size_bytes'],
      [{ filename: '../etc/passwd', content_type: 'image/jpeg', size_bytes: 1 }, '/filename'],
      [{ filename: 'a.jpg', content_type: 'image/jpeg' }, '/size_bytes'],
      [{ filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 1, object_key: 'mine' }, '/object_key'],
      [
        { filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 1, checksum_sha256: 'zz' },
        '/checksum_sha256',
      ],
    ])('refuses %j', async (body, path) => {
      const res = await intent(alice, hq, body);
      expectProblem(res, 400, 'invalid_body');
      expect(pathsOf(res)).toContain(path);
    });

    it('answers 404 for a site outside the caller access, unknown or malformed, identically', async () => {
      const body = { filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 1 };
      const answers = await Promise.all([
        intent(bob, warehouse, body),
        intent(alice, tower, body),
        intent(alice, '5e000000-0000-4000-8000-00000000ffff', body),
        intent(alice, 'not-a-uuid', body),
      ]);
      for (const res of answers) {
        expectProblem(res, 404, 'not_found');
        expect(res.body.detail).toBe(answers[0]?.body.detail);
      }
    });

    it('refuses non-JSON and oversized bodies', async () => {
      const text = await request(h.app)
        .post(`/sites/${hq}/media/upload-intents`)
        .set('Authorization', `Bearer ${bob}`)
        .set('Content-Type', 'text/plain')
        .send('hello');
      expectProblem(text, 415, 'unsupported_media_type');
      const big = await intent(bob, hq, {
        filename: 'a'.repeat(70 * 1024),
        content_type: 'image/png',
        size_bytes: 1,
      });
      expectProblem(big, 413, 'payload_too_large');
      const bad = await request(h.app)
        .post(`/sites/${hq}/media/upload-intents`)
        .set('Authorization', `Bearer ${bob}`)
        .set('Content-Type', 'application/json')
        .send('{"filename":');
      expectProblem(bad, 400, 'invalid_json');
    });
  });

  describe('object-created webhook and download', () => {
    async function pending(token: string, siteId: string, contentType: string, size: number) {
      const res = await intent(token, siteId, {
        filename: 'photo 1.png',
        content_type: contentType,
        size_bytes: size,
      });
      expect(res.status).toBe(201);
      return { mediaId: res.body.media_id as string, key: await objectKeyOf(res.body.media_id as string) };
    }

    it('answers 409 while pending, then 200 with a presigned GET once the object arrived (S3 record + HEAD)', async () => {
      const { mediaId, key } = await pending(bob, hq, 'image/png', 5);
      const early = await download(bob, hq, mediaId);
      expectProblem(early, 409, 'media_pending');

      await put(key, Buffer.from('12345'), 'image/png');
      const hook = await webhook(s3Event(key, 5));
      expect(hook.status).toBe(200);
      expect(hook.body).toEqual({ received: 1, results: [{ key, outcome: 'available' }] });

      const res = await download(bob, hq, mediaId);
      expect(res.status).toBe(200);
      expect(res.headers['cache-control']).toBe('no-store');
      expect(validateDownloadResponse(res.body).ok).toBe(true);
      expect(res.body).toMatchObject({
        media_id: mediaId,
        content_type: 'image/png',
        size_bytes: 5,
        filename: 'photo 1.png',
      });
      const url = new URL(String(res.body.url));
      expect(url.searchParams.get('response-content-disposition')).toBe(
        `attachment; filename="photo 1.png"; filename*=UTF-8''photo%201.png`,
      );
      expect(url.searchParams.get('X-Amz-Expires')).toBe('300');
      const fetched = await fetch(String(res.body.url));
      expect(fetched.status).toBe(200);
      expect(await fetched.text()).toBe('12345');

      const row = await h.admin
        .selectFrom('enterprise.media_items')
        .selectAll()
        .where('id', '=', mediaId)
        .executeTakeFirstOrThrow();
      expect(row).toMatchObject({
        status: 'available',
        actual_size_bytes: '5',
        actual_content_type: 'image/png',
        // The store's ETag (the MD5 of '12345'), not the one the event claimed.
        etag: '827ccb0eea8a706c4c34a16891f84e7b',
      });

      // Redelivery changes nothing: the accepted bytes were copied and the upload key emptied, so the event
      // names an object that is gone.
      const again = await webhook(s3Event(key, 5));
      expect(again.body.results).toEqual([{ key, outcome: 'ignored' }]);
      expect(await h.storage.head(key)).toBeUndefined();
      // Other users of the company with access see it; a user of the other company does not.
      expect((await download(alice, hq, mediaId)).status).toBe(200);
      expectProblem(await download(carol, hq, mediaId), 404, 'not_found');
      expectProblem(await download(alice, warehouse, mediaId), 404, 'not_found');
    });

    it('serves the accepted bytes even after the upload URL was used again within its lifetime', async () => {
      const res = await intent(bob, hq, { filename: 'meter.png', content_type: 'image/png', size_bytes: 5 });
      expect(res.status).toBe(201);
      const mediaId = res.body.media_id as string;
      const key = await objectKeyOf(mediaId);
      const upload = res.body.upload as { url: string; headers: Record<string, string> };
      const putThroughUrl = (bytes: string) =>
        fetch(upload.url, { method: 'PUT', headers: upload.headers, body: bytes });

      expect((await putThroughUrl('AAAAA')).status).toBe(200);
      expect((await webhook(s3Event(key, 5))).body.results).toEqual([{ key, outcome: 'available' }]);
      // The URL still signs the same size and type, so a second PUT of other bytes succeeds at the store.
      expect((await putThroughUrl('BBBBB')).status).toBe(200);
      expect((await webhook(s3Event(key, 5))).body.results).toEqual([{ key, outcome: 'duplicate' }]);

      const served = await download(bob, hq, mediaId);
      expect(served.status).toBe(200);
      const fetched = await fetch(String(served.body.url));
      expect(await fetched.text()).toBe('AAAAA');
      const row = await h.admin
        .selectFrom('enterprise.media_items')
        .select(['etag', 'actual_size_bytes'])
        .where('id', '=', mediaId)
        .executeTakeFirstOrThrow();
      expect(row.etag).toBe(createHash('md5').update('AAAAA').digest('hex'));
      // Nothing stays under the upload key: the second PUT's object was removed too.
      expect(await h.storage.head(key)).toBeUndefined();
    });

    it.each([
      ['honours if-match, as AWS', true],
      ['ignores if-match, as s3rver and Ceph RGW 16.2', false],
    ])(
      'a store whose copies get ETags of their own (AWS: parts, SSE-KMS) that %s: a PUT replacing the upload during the copy is never accepted',
      async (_name, honourIfMatch) => {
        const aws = await startAwsCopyStore(h.s3, { honourIfMatch });
        const storage = createS3Storage({
          endpoint: aws.endpoint,
          publicEndpoint: h.s3.endpoint,
          region: h.s3.region,
          bucket: h.s3.bucket,
          accessKeyId: h.s3.accessKeyId,
          secretAccessKey: h.s3.secretAccessKey,
          forcePathStyle: true,
        });
        const app = buildApp({
          config: {
            media: { maxImageBytes: 1000, maxVideoBytes: 5000, uploadUrlTtlS: 900, downloadUrlTtlS: 300 },
            idempotencyTtlS: 60,
            webhookTokens: WEBHOOK_TOKENS,
          },
          logger: createLogger({ service: 'aws-copy-test', level: 'error' }),
          db: h.db,
          storage,
          verifier: h.verifier,
        });
        const hook = (key: string) =>
          request(app)
            .post('/internal/media/object-created')
            .set('Authorization', `Bearer ${WEBHOOK_TOKENS[0]}`)
            .send(s3Event(key, 5));
        try {
          const res = await intent(bob, hq, {
            filename: 'race.png',
            content_type: 'image/png',
            size_bytes: 5,
          });
          const mediaId = res.body.media_id as string;
          const key = await objectKeyOf(mediaId);
          const upload = res.body.upload as { url: string; headers: Record<string, string> };
          const putThroughUrl = (bytes: string) =>
            fetch(upload.url, { method: 'PUT', headers: upload.headers, body: bytes });
          expect((await putThroughUrl('AAAAA')).status).toBe(200);
          // The same URL used again between the service's HEAD and its copy.
          aws.beforeCopy = async () => {
            aws.beforeCopy = undefined;
            expect((await putThroughUrl('BBBBB')).status).toBe(200);
          };
          expect((await hook(key)).body.results).toEqual([{ key, outcome: 'ignored' }]);
          expect(await statusOf(mediaId)).toBe('pending_upload');
          const listed = await s3client.send(
            new ListObjectsV2Command({ Bucket: h.s3.bucket, Prefix: `accepted/${key}/` }),
          );
          expect(listed.Contents ?? []).toEqual([]);
          // The replacing PUT's own event decides: its bytes are what the item serves.
          expect((await hook(key)).body.results).toEqual([{ key, outcome: 'available' }]);
          const served = await request(app)
            .get(`/sites/${hq}/media/${mediaId}/download`)
            .set('Authorization', `Bearer ${bob}`);
          expect(await (await fetch(String(served.body.url))).text()).toBe('BBBBB');
        } finally {
          storage.destroy();
          await aws.stop();
        }
      },
    );

    it('accepts the MinIO body with its content type (old token still valid)', async () => {
      const { mediaId, key } = await pending(alice, warehouse, 'video/mp4', 3000);
      await put(key, Buffer.alloc(3000), 'video/mp4');
      const res = await webhook(minioEvent(key, 3000, 'video/mp4'), WEBHOOK_TOKENS[0]);
      expect(res.status).toBe(200);
      expect(res.body.results).toEqual([{ key, outcome: 'available' }]);
      const row = await h.admin
        .selectFrom('enterprise.media_items')
        .selectAll()
        .where('id', '=', mediaId)
        .executeTakeFirstOrThrow();
      // MD5 of 3,000 zero bytes: what the store holds.
      expect(row.etag).toBe(createHash('md5').update(Buffer.alloc(3000)).digest('hex'));
    });

    it('believes the store, not the event: a forged record for an object that is not there changes nothing', async () => {
      const { mediaId, key } = await pending(bob, hq, 'image/jpeg', 900);
      // A well-formed MinIO record with the webhook token, describing an object nobody uploaded.
      const res = await webhook(minioEvent(key, 900, 'image/jpeg'));
      expect(res.status).toBe(200);
      expect(res.body.results).toEqual([{ key, outcome: 'ignored' }]);
      expectProblem(await download(bob, hq, mediaId), 409, 'media_pending');
      // A record whose size and type fit the intent while the stored object does not: the store decides.
      await put(key, Buffer.from('not a jpeg'), 'text/plain');
      const lie = await webhook(minioEvent(key, 900, 'image/jpeg'));
      expect(lie.body.results).toEqual([{ key, outcome: 'rejected' }]);
      // A rejected upload says so (89519cb), with the reason the store's object gave.
      expectProblem(await download(bob, hq, mediaId), 409, 'media_rejected');
    });

    it('rejects an object whose size or type break the intent, deletes it, and says why', async () => {
      const bySize = await pending(bob, hq, 'image/png', 10);
      await put(bySize.key, Buffer.from('123456789012'), 'image/png');
      const res1 = await webhook(s3Event(bySize.key, 12));
      expect(res1.body.results).toEqual([{ key: bySize.key, outcome: 'rejected' }]);
      expectProblem(await download(bob, hq, bySize.mediaId), 409, 'media_rejected');
      expect(await h.storage.head(bySize.key)).toBeUndefined();

      const byType = await pending(bob, hq, 'image/png', 4);
      await put(byType.key, Buffer.from('<p/>'), 'text/html');
      const res2 = await webhook(minioEvent(byType.key, 4, 'text/html'));
      expect(res2.body.results).toEqual([{ key: byType.key, outcome: 'rejected' }]);
      const row = await h.admin
        .selectFrom('enterprise.media_items')
        .selectAll()
        .where('id', '=', byType.mediaId)
        .executeTakeFirstOrThrow();
      expect(row.status).toBe('rejected');
      expect(row.rejection_reason).toMatch(/text\/html/);
    });

    it('acknowledges unknown keys, other events and other buckets with 200', async () => {
      const gone = `sites/${hq}/media/${randomUUID()}.png`;
      const res = await webhook({
        Records: [
          {
            eventName: 's3:ObjectCreated:Put',
            s3: {
              bucket: { name: h.s3.bucket },
              object: { key: 'sites/none/media/x.png', size: 1, contentType: 'image/png' },
            },
          },
          // A media-shaped key with no content type: the object is looked up, and it does not exist.
          {
            eventName: 'ObjectCreated:Put',
            s3: { bucket: { name: h.s3.bucket }, object: { key: gone, size: 1 } },
          },
          // Not a key this service generates: acknowledged without any lookup (a HEAD could be refused).
          {
            eventName: 'ObjectCreated:Put',
            s3: { bucket: { name: h.s3.bucket }, object: { key: 'uploads/elsewhere.png', size: 1 } },
          },
          {
            eventName: 's3:ObjectRemoved:Delete',
            s3: { bucket: { name: h.s3.bucket }, object: { key: 'a' } },
          },
          {
            eventName: 'ObjectCreated:Put',
            s3: { bucket: { name: 'other' }, object: { key: 'b', size: 1, contentType: 'image/png' } },
          },
        ],
      });
      expect(res.status).toBe(200);
      expect(res.body.results).toEqual([
        { key: 'sites/none/media/x.png', outcome: 'unknown_key' },
        { key: gone, outcome: 'ignored' },
        { key: 'uploads/elsewhere.png', outcome: 'unknown_key' },
        { key: null, outcome: 'ignored' },
        { key: 'b', outcome: 'ignored' },
      ]);
      expect(h.logs.some((l) => l.message === 'object event for an unknown key acknowledged')).toBe(true);
    });

    it("reads a Ceph RGW record's key as stored and an AWS record's URL-encoded", async () => {
      // RGW's HTTP push sends keys as stored (eventSource ceph:s3): its '+' and '%41' mean themselves.
      const raw = `sites/${hq}/media/a+b%41.png`;
      const record = (eventSource: string) => ({
        eventSource,
        eventName: 'ObjectCreated:Put',
        s3: { bucket: { name: h.s3.bucket }, object: { key: raw, size: 1, eTag: 'abc' } },
      });
      const res = await webhook({ Records: [record('ceph:s3'), record('aws:s3')] });
      expect(res.status).toBe(200);
      expect(res.body.results).toEqual([
        { key: raw, outcome: 'unknown_key' },
        { key: `sites/${hq}/media/a bA.png`, outcome: 'unknown_key' },
      ]);
    });

    it('refuses a wrong or missing token with 401 and a malformed body with 400', async () => {
      const key = 'sites/x/media/y.png';
      const wrong = await webhook(s3Event(key, 1), 'not-the-token');
      expectProblem(wrong, 401, 'unauthorized');
      // RFC 6750 §3.1: invalid_token for a wrong token (a repeated header: auth.test), no error code when none came.
      expect(wrong.headers['www-authenticate']).toBe('Bearer realm="platform", error="invalid_token"');
      const none = await request(h.app).post('/internal/media/object-created').send(s3Event(key, 1));
      expectProblem(none, 401, 'unauthorized');
      expect(none.headers['www-authenticate']).toBe('Bearer realm="platform"');
      const portalToken = await webhook(s3Event(key, 1), alice);
      expectProblem(portalToken, 401, 'unauthorized');
      expectProblem(await webhook({ Records: [] }), 400, 'invalid_body');
      expectProblem(await webhook({ EventName: 'x' }), 400, 'invalid_body');
      expectProblem(
        await webhook({ Records: [{ eventName: 'ObjectCreated:Put', s3: { bucket: {} } }] }),
        400,
        'invalid_body',
      );
      // The token never reaches a log line.
      expect(JSON.stringify(h.logs)).not.toContain(WEBHOOK_TOKENS[1]);
    });

    it('acknowledges keys that cannot name a media item (NUL, over 1024 bytes) as unknown, never 5xx', async () => {
      const nul = 'sites/x/media/a\u0000b.png';
      const long = `sites/x/media/${'a'.repeat(1100)}.png`;
      // A raw NUL in the body (MinIO's Key) is refused at the edge like any body text PostgreSQL cannot store
      // (MinIO refuses such object names, so only a forged event carries one); URL-encoded in an S3 record
      // (%00) it is decoded by the service, which finds no media item under it and acknowledges the event.
      // MinIO records carry a content type, so the key goes straight to the database; S3 records make
      // the service ask the store first.
      const answers = await Promise.all([
        webhook(minioEvent(nul, 1, 'image/png')),
        webhook(s3Event(nul, 1)),
        webhook(minioEvent(long, 1, 'image/png')),
        webhook(s3Event(long, 1)),
      ]);
      expect(answers.map((res) => res.status)).toEqual([400, 200, 200, 200]);
      expect(answers.slice(1).map((res) => (res.body as { results: unknown }).results)).toEqual([
        [{ key: nul, outcome: 'unknown_key' }],
        [{ key: long, outcome: 'unknown_key' }],
        [{ key: long, outcome: 'unknown_key' }],
      ]);
      expect(
        h.logs.some(
          (l) => l.message === 'object event for an unknown key acknowledged' && l.object_key === nul,
        ),
      ).toBe(true);
    });

    it('refuses a NUL in eTag or contentType and a size beyond 2^53 - 1 with 400, leaving the item pending', async () => {
      const { mediaId, key } = await pending(bob, hq, 'image/png', 4);
      const withObject = (object: Record<string, unknown>) => {
        const body = minioEvent(key, 4, 'image/png');
        Object.assign(body.Records[0]!.s3.object, object);
        return body;
      };
      const cases: Array<[Record<string, unknown>, string]> = [
        [{ contentType: 'image/png\u0000' }, '/Records/0/s3/object/contentType'],
        [{ eTag: '"abc\u0000"' }, '/Records/0/s3/object/eTag'],
        [{ size: 2 ** 63 }, '/Records/0/s3/object/size'],
        [{ size: Number.MAX_SAFE_INTEGER + 1 }, '/Records/0/s3/object/size'],
      ];
      for (const [object, path] of cases) {
        const res = await webhook(withObject(object));
        expectProblem(res, 400, 'invalid_body');
        expect(pathsOf(res)).toEqual([path]);
      }
      expect(await statusOf(mediaId)).toBe('pending_upload');
      // The largest exact size is still a well-formed event; the size the store reports decides, and no object
      // is stored under the key, so the event changes nothing.
      const res = await webhook(withObject({ size: Number.MAX_SAFE_INTEGER }));
      expect(res.status).toBe(200);
      expect(res.body.results).toEqual([{ key, outcome: 'ignored' }]);
      expect(await statusOf(mediaId)).toBe('pending_upload');
    });

    it('answers 503 with Retry-After when the store refuses the HEAD with a 4xx, and logs it', async () => {
      // A store that is up but refuses this service (403, as S3 and MinIO do for a missing
      // s3:GetObject permission or a wrong secret): a real HTTP server, since s3rver grants everything.
      const seen: string[] = [];
      const store = createServer((req, res) => {
        seen.push(`${req.method} ${req.url}`);
        res.writeHead(403, { 'Content-Type': 'application/xml' }).end();
      });
      await new Promise<void>((resolve) => store.listen(0, '127.0.0.1', resolve));
      const { port } = store.address() as AddressInfo;
      const refusing = createS3Storage({
        endpoint: `http://127.0.0.1:${port}`,
        publicEndpoint: undefined,
        region: h.s3.region,
        bucket: h.s3.bucket,
        accessKeyId: h.s3.accessKeyId,
        secretAccessKey: h.s3.secretAccessKey,
        forcePathStyle: true,
      });
      const logs: Array<Record<string, unknown>> = [];
      const stream = new PassThrough();
      stream.on('data', (chunk: Buffer) => {
        for (const line of chunk.toString('utf8').split('\n'))
          if (line.trim() !== '') logs.push(JSON.parse(line) as Record<string, unknown>);
      });
      const app = buildApp({
        config: {
          media: { maxImageBytes: 1000, maxVideoBytes: 5000, uploadUrlTtlS: 900, downloadUrlTtlS: 300 },
          idempotencyTtlS: 60,
          webhookTokens: WEBHOOK_TOKENS,
        },
        logger: createLogger({ service: 'refusing-store-test', level: 'info', stream }),
        db: h.db,
        storage: refusing,
        verifier: h.verifier,
      });
      try {
        const { mediaId, key } = await pending(bob, hq, 'image/png', 5);
        // An S3 record carries no content type, so the service asks the store.
        const res = await request(app)
          .post('/internal/media/object-created')
          .set('Authorization', `Bearer ${WEBHOOK_TOKENS[0]}`)
          .send(s3Event(key, 5));
        expectProblem(res, 503, 'backend_unavailable');
        expect(res.headers['retry-after']).toBe('5');
        // The store's answer stays in the log; the request id is random and may itself contain "403".
        const { request_id: _requestId, ...shown } = res.body as Record<string, unknown>;
        expect(JSON.stringify(shown)).not.toMatch(/403|Forbidden|127\.0\.0\.1/);
        expect(seen).toEqual([`HEAD /${h.s3.bucket}/${key}`]);
        expect(logs).toContainEqual(
          expect.objectContaining({
            level: 'error',
            message: 'object store refused HEAD for an object event',
            object_key: key,
            store_status: 403,
          }),
        );
        // Nothing was recorded: the redelivery decides.
        expect(await statusOf(mediaId)).toBe('pending_upload');
      } finally {
        refusing.destroy();
        await new Promise((resolve) => store.close(resolve));
      }
    });

    it('answers HEAD with 200 without a token (MinIO probes)', async () => {
      const res = await request(h.app).head('/internal/media/object-created');
      expect(res.status).toBe(200);
      const get = await request(h.app).get('/internal/media/object-created');
      expectProblem(get, 405, 'method_not_allowed');
      expect(get.headers.allow).toContain('POST');
    });

    it('answers 404 for unknown and malformed media ids', async () => {
      expectProblem(await download(bob, hq, '00000000-0000-4000-8000-000000000000'), 404, 'not_found');
      expectProblem(await download(bob, hq, 'nope'), 404, 'not_found');
    });

    it('counts intents and webhook outcomes in /metrics', async () => {
      const res = await request(h.app).get('/metrics');
      expect(res.status).toBe(200);
      expect(res.text).toMatch(/workflow_upload_intents_total\{[^}]*content_kind="image"[^}]*\} \d+/);
      expect(res.text).toMatch(/workflow_webhook_records_total\{[^}]*outcome="available"[^}]*\} \d+/);
    });
  });
});
