// POST /sites/{site_id}/media/upload-intents (design §4.4).
import { createHash } from 'node:crypto';
import { mediaKindOf } from '@platform/contracts';
import type { UploadIntentRequest, UploadIntentResponse } from '@platform/contracts';
import { inUserTransaction } from '../db/database.js';
import {
  deleteIntentKey,
  findIntentKey,
  insertIntentKey,
  insertPendingMedia,
  missingLinkTargets,
} from '../db/media-repository.js';
import type { IntentKeyRecord } from '../db/media-repository.js';
import type { Executor } from '../db/database.js';
import {
  abandonUnstarted,
  currentUploadId,
  lockAndCountOpenUploads,
  setUploadId,
} from '../db/multipart-repository.js';
import { siteIsVisible } from '../db/site-repository.js';
import type { UserScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import type { PresignedUpload } from './ports.js';
import { checkIntent, newObjectKey } from './media-rules.js';
import { defaultMultipartSettings, planParts } from './multipart-uploads.js';
import { storeCall } from './store-call.js';
import type { PartPlan } from './multipart-uploads.js';

export interface UploadIntentResult {
  intent: UploadIntentResponse;
  /** True when the answer is the first one, replayed for a repeated Idempotency-Key. */
  replayed: boolean;
}

/** Identifies "the same request" for an Idempotency-Key: the site and the body, independent of key order. */
function fingerprintOf(siteId: string, body: UploadIntentRequest): string {
  const fields = Object.entries(body).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return createHash('sha256')
    .update(JSON.stringify(['POST upload-intent', siteId, fields]))
    .digest('hex');
}

/** A first use this transaction lost to a concurrent one with the same key (see insertIntentKey). */
class KeyTakenMeanwhile extends Error {}

/**
 * Creates a pending media item and its upload URL. With an Idempotency-Key the first use records the key
 * with the item in one transaction; a later use with the same key and body gets the first answer again
 * (the URL signed again at the first instant, so identical), with another body 409. Of racing first uses one
 * commits its item and key; the others roll theirs back and replay it.
 */
export async function createUploadIntent(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  body: UploadIntentRequest,
  idempotencyKey?: string,
): Promise<UploadIntentResult> {
  const problems = checkIntent(body, ctx.media);
  if (body.checksum_sha256 !== undefined && planParts(body.size_bytes, ctx.multipart) !== undefined) {
    // S3 checks SHA-256 per request, so per part; it has no whole-object SHA-256 for an upload in parts
    // (its full-object checksums are CRCs), and nothing here reads the assembled file back: a whole-file
    // digest would be accepted and checked nowhere. Refused, and the parts' own checksums take its place.
    problems.push({
      path: '/checksum_sha256',
      message:
        'cannot be checked for a file uploaded in parts (larger than the multipart threshold); give each part its checksum_sha256 when asking for the part URLs',
    });
  }
  if (problems.length > 0) throw ERRORS.uploadNotAllowed(problems);
  if (idempotencyKey === undefined)
    return { intent: await createIntent(ctx, scope, siteId, body), replayed: false };

  const key = { value: idempotencyKey, fingerprint: fingerprintOf(siteId, body) };
  const replay = await inUserTransaction(ctx.db, scope.user, (trx) => storedAnswer(ctx, trx, scope, key));
  if (replay !== undefined) return { intent: replay, replayed: true };
  try {
    return { intent: await createIntent(ctx, scope, siteId, body, key), replayed: false };
  } catch (err) {
    if (!(err instanceof KeyTakenMeanwhile)) throw err;
  }
  const first = await inUserTransaction(ctx.db, scope.user, (trx) => storedAnswer(ctx, trx, scope, key));
  // The winner committed before this request's insert gave way, so its key is visible now.
  if (first === undefined) throw new Error('an Idempotency-Key taken meanwhile has no stored use');
  return { intent: first, replayed: true };
}

/** The first answer for the caller's key, or undefined when the key is unused (or its replay window passed). */
async function storedAnswer(
  ctx: WorkflowContext,
  trx: Executor,
  scope: UserScope,
  key: { value: string; fingerprint: string },
): Promise<UploadIntentResponse | undefined> {
  const stored = await findIntentKey(trx, scope.user.sub, key.value);
  if (stored === undefined) return undefined;
  if (ctx.now().getTime() - stored.createdAt.getTime() > ctx.idempotencyTtlS * 1000) {
    await deleteIntentKey(trx, scope.user.sub, key.value);
    return undefined;
  }
  if (stored.fingerprint !== key.fingerprint) throw ERRORS.idempotencyKeyReused();
  if (stored.multipart !== null && stored.multipart.uploadId === null) {
    // The first use recorded its plan and has not started (or could not start) the store's upload.
    if (stored.status === 'pending_upload') throw ERRORS.intentStillStarting();
    // It gave up (its item is abandoned): the key starts over.
    await deleteIntentKey(trx, scope.user.sub, key.value);
    return undefined;
  }
  return replayedAnswer(ctx, stored);
}

async function replayedAnswer(ctx: WorkflowContext, stored: IntentKeyRecord): Promise<UploadIntentResponse> {
  if (stored.multipart !== null && stored.multipart.uploadId !== null) {
    // Nothing to sign: the plan is the answer, and the parts' URLs are asked for later.
    const { uploadId, partSizeBytes, partCount } = stored.multipart;
    const expiresAt = stored.uploadExpiresAt ?? stored.signedAt;
    return multipartResponse(stored.mediaId, uploadId, { partSizeBytes, partCount }, expiresAt);
  }
  const expiresAt =
    stored.uploadExpiresAt ?? new Date(stored.signedAt.getTime() + ctx.media.uploadUrlTtlS * 1000);
  const upload = await ctx.storage.presignUpload({
    key: stored.objectKey,
    contentType: stored.contentType,
    sizeBytes: stored.declaredSizeBytes,
    checksumSha256: stored.checksumSha256 ?? undefined,
    expiresInS: Math.round((expiresAt.getTime() - stored.signedAt.getTime()) / 1000),
    now: stored.signedAt,
  });
  return toResponse(stored.mediaId, upload);
}

function multipartResponse(
  mediaId: string,
  uploadId: string,
  plan: PartPlan,
  expiresAt: Date,
): UploadIntentResponse {
  return {
    media_id: mediaId,
    status: 'pending_upload',
    multipart: {
      upload_id: uploadId,
      part_size_bytes: plan.partSizeBytes,
      part_count: plan.partCount,
      expires_at: expiresAt.toISOString(),
    },
  };
}

function toResponse(mediaId: string, upload: PresignedUpload): UploadIntentResponse {
  return {
    media_id: mediaId,
    status: 'pending_upload',
    upload: {
      method: upload.method,
      url: upload.url,
      headers: upload.headers,
      expires_at: upload.expiresAt.toISOString(),
    },
  };
}

async function createIntent(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  body: UploadIntentRequest,
  key?: { value: string; fingerprint: string },
): Promise<UploadIntentResponse> {
  const objectKey = newObjectKey(siteId, body.content_type);
  // Whole seconds: the instant is stored (microseconds) and signed again (seconds) for a replay.
  const now = new Date(Math.floor(ctx.now().getTime() / 1000) * 1000);

  const plan = planParts(body.size_bytes, ctx.multipart);
  if (plan !== undefined) return createMultipartIntent(ctx, scope, siteId, body, objectKey, now, plan, key);

  // Signed before anything is written (signing is local computation), so a database failure leaves
  // neither a row without a URL nor a URL-less intent; a URL whose row never committed only leads to
  // an "unknown key" event, which the webhook acknowledges.
  const upload = await ctx.storage.presignUpload({
    key: objectKey,
    contentType: body.content_type,
    sizeBytes: body.size_bytes,
    checksumSha256: body.checksum_sha256,
    expiresInS: ctx.media.uploadUrlTtlS,
    now,
  });
  const mediaId = await recordIntent(ctx, scope, siteId, body, objectKey, upload.expiresAt, now, key);
  return toResponse(mediaId, upload);
}

/**
 * An intent above the multipart threshold (design §4.4). The item is recorded first, with its plan and no
 * upload id, so that no store upload ever exists for an intent the database does not know; then the store's
 * upload is started, once (CreateMultipartUpload is not idempotent: the adapter does not retry it), and its id
 * set on the item. If the store fails or answers too late the item is abandoned at once (a late upload is left
 * to the sweep, which aborts uploads no item claims); if the id cannot be recorded the upload is aborted again.
 * Whatever a crash leaves in between, the sweep finds: a planned item never started, an upload no item claims.
 */
async function createMultipartIntent(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  body: UploadIntentRequest,
  objectKey: string,
  now: Date,
  plan: PartPlan,
  key: { value: string; fingerprint: string } | undefined,
): Promise<UploadIntentResponse> {
  const expiresAt = new Date(now.getTime() + ctx.multipart.uploadTtlS * 1000);
  const mediaId = await recordIntent(ctx, scope, siteId, body, objectKey, expiresAt, now, key, plan);
  let uploadId: string;
  try {
    uploadId = await storeCall(scope.log, 'CreateMultipartUpload', () =>
      ctx.storage.createMultipartUpload({ key: objectKey, contentType: body.content_type }),
    );
  } catch (err) {
    await giveUp(ctx, scope, mediaId, key);
    throw err;
  }
  let recorded: string | null | undefined;
  try {
    recorded = await inUserTransaction(ctx.db, scope.user, async (trx) =>
      (await setUploadId(trx, mediaId, uploadId)) ? uploadId : currentUploadId(trx, mediaId),
    );
  } catch (err) {
    await abortQuietly(ctx, scope, objectKey, uploadId);
    await giveUp(ctx, scope, mediaId, key);
    throw err;
  }
  if (recorded !== uploadId) {
    // Not ours to record: the item was abandoned meanwhile (or, impossible for one request, started twice).
    await abortQuietly(ctx, scope, objectKey, uploadId);
    throw ERRORS.uploadNotStarted();
  }
  ctx.counters.multipart.inc({ outcome: 'planned' });
  return multipartResponse(mediaId, uploadId, plan, expiresAt);
}

/** An upload nothing will name: aborted at once; what this cannot reach, the sweep does. */
async function abortQuietly(
  ctx: WorkflowContext,
  scope: UserScope,
  objectKey: string,
  uploadId: string,
): Promise<void> {
  await ctx.storage.abortMultipartUpload({ key: objectKey, uploadId }).catch((abortErr: unknown) => {
    scope.log.warn('could not abort the upload of an intent that was not recorded', {
      error: String(abortErr),
    });
  });
}

/**
 * The store's upload could not be started or recorded: the planned item is abandoned and its Idempotency-Key
 * freed, so a retry starts over. A failure here (the database is down too) is only logged: the sweep abandons
 * a planned item that was never started, and a replay of its key answers 503 until then.
 */
async function giveUp(
  ctx: WorkflowContext,
  scope: UserScope,
  mediaId: string,
  key: { value: string } | undefined,
): Promise<void> {
  try {
    await inUserTransaction(ctx.db, scope.user, async (trx) => {
      await abandonUnstarted(trx, mediaId, "the store's upload could not be started");
      if (key !== undefined) await deleteIntentKey(trx, scope.user.sub, key.value);
    });
  } catch (err) {
    scope.log.warn('could not abandon an intent whose upload was not started', {
      media_id: mediaId,
      error: String(err),
    });
  }
}

/**
 * The caps on open uploads in parts (design §4.4): per user, and per site. Each open upload holds parts in the
 * store and an entry in its listing until it is completed, aborted or swept; without a cap one user could open
 * them by the thousand. Checked in the intent's transaction, under locks (lockAndCountOpenUploads).
 */
async function checkOpenUploads(
  ctx: WorkflowContext,
  trx: Executor,
  scope: UserScope,
  siteId: string,
): Promise<void> {
  const perUser = ctx.multipart.maxOpenPerUser ?? defaultMultipartSettings.maxOpenPerUser;
  const perSite = ctx.multipart.maxOpenPerSite ?? defaultMultipartSettings.maxOpenPerSite;
  const open = await lockAndCountOpenUploads(trx, scope.user.sub, siteId);
  if (open.byUploader >= perUser) throw ERRORS.tooManyOpenUploads('user', perUser);
  if (open.atSite >= perSite) throw ERRORS.tooManyOpenUploads('site', perSite);
}

/** Records the pending item (and the Idempotency-Key's first use) under the caller's claims. */
async function recordIntent(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  body: UploadIntentRequest,
  objectKey: string,
  uploadExpiresAt: Date,
  now: Date,
  key: { value: string; fingerprint: string } | undefined,
  multipart?: PartPlan,
): Promise<string> {
  const mediaId = await inUserTransaction(ctx.db, scope.user, async (trx) => {
    const links = {
      walkthroughId: body.walkthrough_id,
      workItemId: body.work_item_id,
      assetId: body.asset_id,
    };
    if (links.walkthroughId !== undefined || links.workItemId !== undefined || links.assetId !== undefined) {
      if (!(await siteIsVisible(trx, siteId))) throw ERRORS.siteNotFound();
      const missing = await missingLinkTargets(trx, siteId, links);
      if (missing.length > 0) throw ERRORS.linkNotFound(missing);
    }
    if (multipart !== undefined) await checkOpenUploads(ctx, trx, scope, siteId);
    const id = await insertPendingMedia(trx, {
      siteId,
      objectKey,
      filename: body.filename,
      contentType: body.content_type,
      declaredSizeBytes: body.size_bytes,
      checksumSha256: body.checksum_sha256,
      ...links,
      uploadedBy: scope.user.sub,
      uploadExpiresAt,
      multipart,
    });
    // RLS decides visibility: a site outside the caller's access looks exactly like no site.
    if (id === undefined) throw ERRORS.siteNotFound();
    if (key !== undefined) {
      const recorded = await insertIntentKey(trx, {
        callerSub: scope.user.sub,
        key: key.value,
        siteId,
        mediaId: id,
        fingerprint: key.fingerprint,
        signedAt: now,
      });
      // Thrown to roll this transaction (and its media item) back.
      if (!recorded) throw new KeyTakenMeanwhile();
    }
    return id;
  });

  ctx.counters.intents.inc({ content_kind: mediaKindOf(body.content_type) });
  scope.log.info('upload intent created', {
    media_id: mediaId,
    site_id: siteId,
    size_bytes: body.size_bytes,
    ...(multipart === undefined ? {} : { part_count: multipart.partCount }),
  });
  return mediaId;
}
