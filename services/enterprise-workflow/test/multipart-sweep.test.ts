// The sweep of uploads in parts makes progress (design §4.4 "Abandoned uploads"; issue 39 §4, the workflow's
// probe): uploads ahead of an orphan in the store's listing, or items the sweep leaves pending, never hide what
// is behind them, and an upload the store assembled in time whose event never came is accepted through the
// webhook's path instead of staying pending for ever. Real PostgreSQL and s3rver; the store's events are lost
// here (nothing forwards them), as a store without a queue loses them.
import { randomUUID } from 'node:crypto';
import type { S3Client } from '@aws-sdk/client-s3';
import { CreateMultipartUploadCommand, PutObjectCommand } from '@aws-sdk/client-s3';
import { demoSites } from '@platform/enterprise-db';
import { createLogger } from '@platform/service-kit';
import { sql } from 'kysely';
import request from 'supertest';
import { buildWorkflow } from '../src/app.js';
import type { WorkflowContext } from '../src/domain/context.js';
import { acceptThroughWebhookPath, sweepExpiredUploads } from '../src/domain/multipart-sweep.js';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';
import { directStoreClient, uploadParts } from './support/store-parts.js';

const MiB = 1024 * 1024;
const hq = demoSites.acmeHq.id;
const multipart = { thresholdBytes: 6 * MiB, partSizeBytes: 5 * MiB, uploadTtlS: 3600 };
const logger = createLogger({ service: 'sweep-test', level: 'error' });

let h: Harness;
let store: S3Client;
/** The context the app's use cases run in, as main.ts hands it to the sweep. */
let ctx: WorkflowContext;
let alice: string;

beforeAll(async () => {
  h = await startHarness({ multipart });
  store = directStoreClient(h.s3);
  ctx = workflow().ctx;
  alice = await h.issuer.demoToken('alice');
});
afterAll(async () => {
  store.destroy();
  await h.close();
});

/** The workflow as main.ts builds it on the harness's database and store, its clock `now` if given. */
function workflow(now?: () => Date): ReturnType<typeof buildWorkflow> {
  return buildWorkflow({
    config: {
      media: { maxImageBytes: 25 * MiB, maxVideoBytes: 2048 * MiB, uploadUrlTtlS: 900, downloadUrlTtlS: 300 },
      idempotencyTtlS: 86400,
      webhookTokens: WEBHOOK_TOKENS,
      multipart,
    },
    logger,
    db: h.db,
    storage: h.storage,
    verifier: h.verifier,
    ...(now ? { now } : {}),
  });
}

/** A media key at headquarters whose id starts with `lead` (the store lists uploads by key). */
function mediaKey(lead: string): string {
  const id = randomUUID();
  return `sites/${hq}/media/${lead}${id.slice(lead.length)}.mp4`;
}

async function startUpload(key: string): Promise<string> {
  const out = await store.send(new CreateMultipartUploadCommand({ Bucket: h.s3.bucket, Key: key }));
  return out.UploadId!;
}

/** A pending item in parts as an intent records it, its intent expiring at `expires` (an SQL expression). */
async function pendingItem(key: string, uploadId: string, expires: string): Promise<string> {
  const { rows } = await sql<{ id: string }>`
    INSERT INTO enterprise.media_items (site_id, object_key, filename, declared_content_type, declared_size_bytes,
      uploaded_by, upload_expires_at, multipart_upload_id, part_size_bytes, part_count)
    VALUES (${hq}::uuid, ${key}, 'walk.mp4', 'video/mp4', ${7 * MiB}, 'sweep-test',
      ${sql.raw(expires)}, ${uploadId}, ${5 * MiB}, 2)
    RETURNING id`.execute(h.admin);
  return rows[0]!.id;
}

async function row(id: string) {
  const { rows } = await sql<{
    status: string;
    rejection_reason: string | null;
    assembled_seen_at: Date | null;
  }>`
    SELECT status, rejection_reason, assembled_seen_at FROM enterprise.media_items WHERE id = ${id}::uuid`.execute(
    h.admin,
  );
  return rows[0];
}

/** What the sweep runs on, with the real clock. */
function sweepCtx() {
  return { db: h.db, storage: h.storage, now: () => new Date() };
}

async function openUploadIds(): Promise<Set<string>> {
  return new Set((await h.storage.listMultipartUploads({ prefix: 'sites/' })).map((u) => u.uploadId));
}

it('aborts an orphan behind more legitimate old uploads than a page holds', async () => {
  // 120 uploads of live intents, all older than the grace period, sort before the orphan in the listing.
  const live: string[] = [];
  for (let i = 0; i < 120; i++) {
    const key = mediaKey('00');
    const uploadId = await startUpload(key);
    await pendingItem(key, uploadId, `now() + interval '1 hour'`);
    live.push(uploadId);
  }
  const orphanKey = mediaKey('ffff');
  const orphan = await startUpload(orphanKey);
  const listed = (await h.storage.listMultipartUploads({ prefix: 'sites/' })).map((u) => u.uploadId);
  // The premise: the orphan comes after the first 100 uploads the store lists.
  expect(listed.indexOf(orphan)).toBeGreaterThanOrEqual(100);

  // A minute past the grace period: every upload above is old enough to be looked at.
  const later = { db: h.db, storage: h.storage, now: () => new Date(Date.now() + 120_000) };
  const swept = await sweepExpiredUploads(later, logger, { graceS: 60, limit: 100 });
  expect(swept).toMatchObject({ orphaned: 1, failed: 0 });
  const open = await openUploadIds();
  expect(open.has(orphan)).toBe(false);
  expect(live.filter((id) => !open.has(id))).toEqual([]);
});

it('reaches an expired upload behind more items left pending than a page holds', async () => {
  // 101 expired items whose uploads the store assembled (the upload gone, the object there) and whose events
  // never came: each stays pending after a run (left to its event at first sight).
  const assembled: string[] = [];
  for (let i = 0; i < 101; i++) {
    const key = mediaKey('aa');
    await store.send(new PutObjectCommand({ Bucket: h.s3.bucket, Key: key, Body: 'assembled' }));
    assembled.push(
      await pendingItem(
        key,
        `gone-${randomUUID()}`,
        `now() - interval '2 hours' + ${i} * interval '1 second'`,
      ),
    );
  }
  // Expired after all of them, its upload still open and never completed.
  const lateKey = mediaKey('bb');
  const lateUpload = await startUpload(lateKey);
  const late = await pendingItem(lateKey, lateUpload, `now() - interval '1 hour'`);

  const swept = await sweepExpiredUploads(sweepCtx(), logger, { graceS: 60, limit: 100 });
  expect(swept).toMatchObject({ abandoned: 1, completed: 101, failed: 0 });
  expect(await row(late)).toMatchObject({
    status: 'abandoned',
    rejection_reason: 'the upload intent expired before completion',
  });
  expect((await openUploadIds()).has(lateUpload)).toBe(false);
  // Noted, not decided: their events get the grace period from now.
  for (const id of assembled) expect(await row(id)).toMatchObject({ status: 'pending_upload' });
  expect((await row(assembled[0]!))?.assembled_seen_at).toBeInstanceOf(Date);
});

it('accepts an upload the store assembled in time whose event never came, once the event is a grace period late', async () => {
  // An intent created two hours ago with a one-hour lifetime, its parts stored and assembled straight at the
  // store (the completion raced the expiry), and the store's event lost.
  const app = workflow(() => new Date(Date.now() - 2 * 3600_000)).app;
  const intent = await request(app)
    .post(`/sites/${hq}/media/upload-intents`)
    .set('Authorization', `Bearer ${alice}`)
    .send({ filename: 'late.mp4', content_type: 'video/mp4', size_bytes: 7 * MiB });
  expect(intent.status).toBe(201);
  const mediaId = intent.body.media_id as string;
  const uploadId = intent.body.multipart.upload_id as string;
  const { rows } = await sql<{ object_key: string }>`
    SELECT object_key FROM enterprise.media_items WHERE id = ${mediaId}::uuid`.execute(h.admin);
  const key = rows[0]!.object_key;
  const parts = await uploadParts(store, h.s3, key, uploadId, [5 * MiB, 2 * MiB]);
  expect(await h.storage.completeMultipartUpload({ key, uploadId, parts })).toBe(true);

  const accept = acceptThroughWebhookPath(ctx);
  // First sight: noted and left to its event, which may still be on its way.
  const first = await sweepExpiredUploads(sweepCtx(), logger, { graceS: 60, limit: 100, accept });
  expect(first).toMatchObject({ failed: 0 });
  expect(await row(mediaId)).toMatchObject({ status: 'pending_upload' });
  // Still within the grace period since: left again.
  await sweepExpiredUploads(sweepCtx(), logger, { graceS: 60, limit: 100, accept });
  expect(await row(mediaId)).toMatchObject({ status: 'pending_upload' });
  // A grace period after it was first seen the event is taken as lost: accepted through the webhook's path.
  await sql`UPDATE enterprise.media_items SET assembled_seen_at = now() - interval '61 seconds'
    WHERE id = ${mediaId}::uuid`.execute(h.admin);
  const settled = await sweepExpiredUploads(sweepCtx(), logger, { graceS: 60, limit: 100, accept });
  expect(settled).toMatchObject({ failed: 0 });
  expect(await row(mediaId)).toMatchObject({ status: 'available' });
  const download = await request(h.app)
    .get(`/sites/${hq}/media/${mediaId}/download`)
    .set('Authorization', `Bearer ${alice}`);
  expect(download.status).toBe(200);
  // Served from the accepted copy (design §4.6), as after the webhook; the upload key itself is gone.
  const served = await fetch(download.body.url as string);
  expect({ status: served.status, bytes: (await served.arrayBuffer()).byteLength }).toEqual({
    status: 200,
    bytes: 7 * MiB,
  });
  expect(await h.storage.head(key)).toBeUndefined();
  // A later run has nothing left to do with it.
  const again = await sweepExpiredUploads(sweepCtx(), logger, { graceS: 60, limit: 100, accept });
  expect(again).toMatchObject({ failed: 0 });
  expect(await row(mediaId)).toMatchObject({ status: 'available' });
});
