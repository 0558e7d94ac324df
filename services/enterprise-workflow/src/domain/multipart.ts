// Uploads in parts (design §4.4): the plan an intent above the threshold answers, part URLs, the parts
// stored so far (resume), completion, abort, and the sweep of uploads whose intent expired.
import type {
  CompleteUploadRequest,
  CompleteUploadResponse,
  PartUrlsRequest,
  PartUrlsResponse,
  StoredPartsResponse,
} from '@platform/contracts';
import { errorMessage, mapDbError } from '@platform/service-kit';
import type { Counter, Logger } from '@platform/service-kit';
import { inUserTransaction } from '../db/database.js';
import {
  expiredMultipartUploads,
  findMultipartMedia,
  abandonUnstartedUploads,
  markAbandoned,
  recordUploadAbandoned,
  unclaimedUploads,
} from '../db/multipart.js';
import type { MultipartMedia } from '../db/multipart.js';
import { storeCall } from './store-call.js';
import type { StoredPart } from './ports.js';
import type { UserScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import { isMediaObjectKey, MEDIA_KEY_PREFIX, normaliseEtag } from './media.js';

const MiB = 1024 * 1024;
/** S3's limits: parts of at least 5 MiB (but the last), at most 10,000 parts. */
export const MIN_PART_SIZE_BYTES = 5 * MiB;
export const MAX_PARTS = 10_000;

export interface MultipartSettings {
  /** Files larger than this are uploaded in parts. */
  thresholdBytes: number;
  /** Preferred part size; raised (to a whole MiB) when the file would need more than 10,000 parts. */
  partSizeBytes: number;
  /** How long an upload in parts may take, from its intent to its completion, in seconds. */
  uploadTtlS: number;
}

/** The sweep of expired uploads in parts, as main.ts runs it. */
export function startExpiredUploadSweep(
  ctx: Pick<WorkflowContext, 'db' | 'storage' | 'now'>,
  log: Logger,
  options: {
    intervalS: number;
    graceS: number;
    /** Counts each run's outcomes (`workflow_multipart_sweep_total`, see createSweepMetrics). */
    outcomes?: Counter<'outcome'>;
  },
): { stop(): Promise<void> } {
  if (options.intervalS === 0) return { stop: () => Promise.resolve() };
  let running: Promise<unknown> | undefined;
  const timer = setInterval(() => {
    // A run slower than the interval (a slow store) is not overlapped by the next one.
    if (running !== undefined) return;
    running = sweepExpiredUploads(ctx, log, { graceS: options.graceS, limit: 100 })
      .then((result) => {
        for (const outcome of ['abandoned', 'completed', 'orphaned', 'failed'] as const)
          if (result[outcome] > 0) options.outcomes?.inc({ outcome }, result[outcome]);
      })
      .catch((err: unknown) => {
        log.warn('multipart sweep failed', { error: errorMessage(err) });
      })
      .finally(() => {
        running = undefined;
      });
  }, options.intervalS * 1000);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      await running;
    },
  };
}

export const defaultMultipartSettings: MultipartSettings = {
  thresholdBytes: 64 * MiB,
  partSizeBytes: 16 * MiB,
  uploadTtlS: 24 * 3600,
};

export interface PartPlan {
  partSizeBytes: number;
  partCount: number;
}

/** Undefined when the file goes in one PUT. */
export function planParts(sizeBytes: number, settings: MultipartSettings): PartPlan | undefined {
  if (sizeBytes <= settings.thresholdBytes) return undefined;
  const least = Math.ceil(sizeBytes / MAX_PARTS / MiB) * MiB;
  const partSizeBytes = Math.max(settings.partSizeBytes, MIN_PART_SIZE_BYTES, least);
  return { partSizeBytes, partCount: Math.ceil(sizeBytes / partSizeBytes) };
}

/** The exact length of part `n` (1-based) of a plan: every part is full but the last. */
export function partLength(
  item: Pick<MultipartMedia, 'declaredSizeBytes' | 'partSizeBytes'>,
  n: number,
): number {
  return Math.min(item.partSizeBytes, item.declaredSizeBytes - (n - 1) * item.partSizeBytes);
}

/**
 * The caller's own multipart item, whatever its state: 404 for an unknown item, one outside the caller's
 * sites, an item uploaded with one PUT (it has no parts), and another user's upload. A single PUT URL only
 * ever goes to the intent's creator; an upload in parts is theirs alike, so another user of the same site
 * can neither send parts, list them, complete nor abort it, and learns nothing more than about an item it
 * cannot see.
 */
async function ownUpload(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  mediaId: string,
): Promise<MultipartMedia & { uploadId: string }> {
  const item = await inUserTransaction(ctx.db, scope.user, (trx) => findMultipartMedia(trx, siteId, mediaId));
  if (item === undefined || item.uploadId === null || item.uploadedBy !== scope.user.sub)
    throw ERRORS.mediaNotFound();
  return { ...item, uploadId: item.uploadId };
}

/**
 * The caller's own pending multipart item (see ownUpload for the 404s); 409 for any state but pending, and
 * for an intent that expired.
 */
async function pendingUpload(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  mediaId: string,
): Promise<MultipartMedia & { uploadId: string }> {
  const item = await ownUpload(ctx, scope, siteId, mediaId);
  if (item.status !== 'pending_upload') throw ERRORS.uploadNotPending(item.status);
  if (item.uploadExpiresAt !== null && item.uploadExpiresAt.getTime() <= ctx.now().getTime()) {
    throw ERRORS.uploadExpired();
  }
  return item;
}

/** Presigned URLs for the given parts, each bound to its exact length (and checksum, when given). */
export async function presignParts(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  mediaId: string,
  body: PartUrlsRequest,
): Promise<PartUrlsResponse> {
  const item = await pendingUpload(ctx, scope, siteId, mediaId);
  const problems = body.parts.flatMap((part, i) =>
    part.part_number > item.partCount
      ? [{ path: `/parts/${i}/part_number`, message: `must be at most ${item.partCount}, the part count` }]
      : [],
  );
  if (problems.length > 0) throw ERRORS.noSuchPart(problems);
  const now = new Date(Math.floor(ctx.now().getTime() / 1000) * 1000);
  // A part URL lives as long as a single upload URL, and never past the intent.
  const untilExpiry =
    item.uploadExpiresAt === null
      ? ctx.media.uploadUrlTtlS
      : Math.floor((item.uploadExpiresAt.getTime() - now.getTime()) / 1000);
  const expiresInS = Math.max(1, Math.min(ctx.media.uploadUrlTtlS, untilExpiry));
  const parts = await Promise.all(
    body.parts.map(async (part) => {
      const sizeBytes = partLength(item, part.part_number);
      const signed = await ctx.storage.presignPart({
        key: item.objectKey,
        uploadId: item.uploadId,
        partNumber: part.part_number,
        sizeBytes,
        checksumSha256: part.checksum_sha256,
        expiresInS,
        now,
      });
      return {
        part_number: part.part_number,
        method: signed.method,
        url: signed.url,
        headers: signed.headers,
        size_bytes: sizeBytes,
        expires_at: signed.expiresAt.toISOString(),
      };
    }),
  );
  return { media_id: item.id, parts };
}

/** The parts the store holds; a client resumes by sending only the others. */
export async function listStoredParts(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  mediaId: string,
): Promise<StoredPartsResponse> {
  const item = await pendingUpload(ctx, scope, siteId, mediaId);
  const parts = await storeCall(scope.log, 'ListParts', () =>
    ctx.storage.listParts({ key: item.objectKey, uploadId: item.uploadId }),
  );
  if (parts === undefined) throw ERRORS.uploadGone();
  return {
    media_id: item.id,
    upload_id: item.uploadId,
    part_size_bytes: item.partSizeBytes,
    part_count: item.partCount,
    parts: parts.map((p) => ({
      part_number: p.partNumber,
      size_bytes: p.sizeBytes,
      etag: p.etag,
    })),
  };
}

/**
 * Checks the client's part list against the intent and the store before the store assembles the file:
 * every part 1..part_count named once, each stored with the ETag the client names and exactly its planned
 * length, so the total is the declared size. The store then reports the object like any other, and the
 * webhook accepts it (design §4.4, §4.6).
 *
 * Idempotent, as documented: a completion of an upload already assembled is 202 again, whether its item is
 * still pending (the event not handled yet) or already available, and whether the earlier completion was
 * answered or timed out at a slow store that assembled it anyway (the SDK's second attempt, or the client's
 * retry, then finds the upload gone and the object there).
 */
export async function completeUpload(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  mediaId: string,
  body: CompleteUploadRequest,
): Promise<CompleteUploadResponse> {
  const item = await ownUpload(ctx, scope, siteId, mediaId);
  const numbers = body.parts.map((p) => p.part_number);
  const sorted = [...numbers].sort((a, b) => a - b);
  if (sorted.length !== item.partCount || sorted.some((n, i) => n !== i + 1)) {
    throw ERRORS.partsNotNamed(item.partCount);
  }
  // Assembled and accepted: nothing is left to do.
  if (item.status === 'available') return { media_id: item.id, status: 'available' };
  if (item.status !== 'pending_upload') throw ERRORS.uploadNotPending(item.status);
  const assembled = async (): Promise<CompleteUploadResponse> => {
    // The upload is gone from the store: completed already (a retried completion) or aborted. The assembled
    // object tells, until the webhook has accepted it: it records the item, then deletes the upload key
    // (design §4.6), so without the object the item's state tells.
    const head = await storeCall(scope.log, 'HEAD', () => ctx.storage.head(item.objectKey));
    if (head !== undefined) return { media_id: item.id, status: 'pending_upload' };
    const now = await ownUpload(ctx, scope, siteId, mediaId);
    if (now.status === 'available') return { media_id: item.id, status: 'available' };
    throw ERRORS.uploadGone();
  };
  const stored = await storeCall(scope.log, 'ListParts', () =>
    ctx.storage.listParts({ key: item.objectKey, uploadId: item.uploadId }),
  );
  if (stored === undefined) return assembled();
  if (item.uploadExpiresAt !== null && item.uploadExpiresAt.getTime() <= ctx.now().getTime()) {
    throw ERRORS.uploadExpired();
  }
  const byNumber = new Map<number, StoredPart>(stored.map((p) => [p.partNumber, p]));
  const problems: string[] = [];
  let total = 0;
  for (const part of body.parts) {
    const found = byNumber.get(part.part_number);
    if (found === undefined) {
      problems.push(`part ${part.part_number} is not stored`);
      continue;
    }
    total += found.sizeBytes;
    if (normaliseEtag(found.etag) !== normaliseEtag(part.etag)) {
      problems.push(`part ${part.part_number} was stored with another ETag`);
    }
    const expected = partLength(item, part.part_number);
    if (found.sizeBytes !== expected) {
      problems.push(`part ${part.part_number} has ${found.sizeBytes} bytes, not ${expected}`);
    }
  }
  if (problems.length === 0 && total !== item.declaredSizeBytes) {
    problems.push(`the parts hold ${total} bytes, not the declared ${item.declaredSizeBytes}`);
  }
  if (problems.length > 0) throw ERRORS.partsMismatch(problems);
  const completed = await storeCall(scope.log, 'CompleteMultipartUpload', () =>
    ctx.storage.completeMultipartUpload({
      key: item.objectKey,
      uploadId: item.uploadId,
      parts: sorted.map((n) => ({ partNumber: n, etag: byNumber.get(n)?.etag ?? '' })),
    }),
  );
  // NoSuchUpload: an earlier attempt of this very call (the SDK retries one that timed out) or a concurrent
  // completion assembled it meanwhile, or an abort discarded it.
  if (!completed) return assembled();
  ctx.counters.multipart.inc({ outcome: 'completed' });
  scope.log.info('multipart upload completed', { media_id: item.id, site_id: siteId, parts: item.partCount });
  return { media_id: item.id, status: 'pending_upload' };
}

/** Aborts the upload in the store, then marks the item abandoned; its parts are gone. */
export async function abortUpload(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  mediaId: string,
): Promise<void> {
  const item = await ownUpload(ctx, scope, siteId, mediaId);
  if (item.status !== 'pending_upload') throw ERRORS.uploadNotPending(item.status);
  const uploadId = item.uploadId;
  // The store first: if the database write fails after it, the item stays pending without an upload, and
  // the sweep finishes the job once the intent expires.
  const discarded = await storeCall(scope.log, 'AbortMultipartUpload', () =>
    ctx.storage.abortMultipartUpload({ key: item.objectKey, uploadId }),
  );
  if (!discarded) {
    // NoSuchUpload: an earlier abort of ours whose database write failed, or a completion. Once the store has
    // assembled the file its object event will arrive and the webhook accept it (as the sweep leaves such an
    // upload to its event): marking the item abandoned now would leave that object, and its accepted copy,
    // to nobody.
    const head = await storeCall(scope.log, 'HEAD', () => ctx.storage.head(item.objectKey));
    if (head !== undefined) throw ERRORS.uploadAssembled();
  }
  const changed = await inUserTransaction(ctx.db, scope.user, (trx) =>
    markAbandoned(trx, siteId, mediaId, scope.user.sub, 'aborted by the uploader'),
  );
  if (!changed) throw ERRORS.uploadNotPending();
  ctx.counters.multipart.inc({ outcome: 'aborted' });
  scope.log.info('multipart upload aborted', { media_id: item.id, site_id: siteId });
}

export interface SweepResult {
  abandoned: number;
  /** Expired uploads the store had completed meanwhile: left to the object-created event. */
  completed: number;
  /** Uploads under the media keys that no pending item names, aborted in the store. */
  orphaned: number;
  failed: number;
}

/**
 * Aborts the store's uploads of pending multipart items whose intent expired more than `graceS` ago and
 * marks the items abandoned (design §4.4). An upload the store no longer has but whose object exists was
 * completed in time: its event decides, the item stays. Safe to run on several replicas at once: aborting
 * twice is harmless and the database changes an item only while it is pending.
 */
export async function sweepExpiredUploads(
  ctx: Pick<WorkflowContext, 'db' | 'storage' | 'now'>,
  log: Logger,
  options: { graceS: number; limit: number },
): Promise<SweepResult> {
  const result: SweepResult = { abandoned: 0, completed: 0, orphaned: 0, failed: 0 };
  const before = new Date(ctx.now().getTime() - options.graceS * 1000);
  let expired;
  try {
    expired = await expiredMultipartUploads(ctx.db, before, options.limit);
  } catch (err) {
    throw mapDbError(err);
  }
  for (const upload of expired) {
    try {
      const aborted = await ctx.storage.abortMultipartUpload({
        key: upload.objectKey,
        uploadId: upload.uploadId,
      });
      if (!aborted && (await ctx.storage.head(upload.objectKey)) !== undefined) {
        result.completed += 1;
        continue;
      }
      if (
        await recordUploadAbandoned(ctx.db, upload.mediaId, 'the upload intent expired before completion')
      ) {
        result.abandoned += 1;
        log.info('expired multipart upload abandoned', { media_id: upload.mediaId, site_id: upload.siteId });
      }
    } catch (err) {
      result.failed += 1;
      log.warn('could not sweep an expired multipart upload', {
        media_id: upload.mediaId,
        error: errorMessage(err),
      });
    }
  }
  // Items whose plan was recorded but whose store upload was never started (a crash between the two, a
  // failure that could not be recorded): a start takes seconds, the grace period minutes.
  try {
    const unstarted = await abandonUnstartedUploads(ctx.db, before, options.limit);
    result.abandoned += unstarted;
    if (unstarted > 0) log.info('multipart intents never started abandoned', { count: unstarted });
  } catch (err) {
    throw mapDbError(err);
  }
  await sweepUnclaimedUploads(ctx, log, before, options.limit, result);
  return result;
}

/**
 * The store's open uploads under the media keys that no pending item names and that were started before
 * `before` (the grace period: an intent's row commits within its request, seconds after its upload starts):
 * left by an intent whose answer from the store came too late, whose recording failed, or whose process
 * stopped in between. Nothing else would ever remove them (design §4.4). An upload without an initiation time,
 * or under a key that cannot name a media item, is never touched.
 */
async function sweepUnclaimedUploads(
  ctx: Pick<WorkflowContext, 'db' | 'storage'>,
  log: Logger,
  before: Date,
  limit: number,
  result: SweepResult,
): Promise<void> {
  const open = await ctx.storage.listMultipartUploads({ prefix: MEDIA_KEY_PREFIX });
  const old = open
    .filter((u) => isMediaObjectKey(u.key) && u.initiated !== undefined && u.initiated < before)
    .slice(0, limit);
  let unclaimed;
  try {
    unclaimed = await unclaimedUploads(ctx.db, old);
  } catch (err) {
    throw mapDbError(err);
  }
  for (const upload of unclaimed) {
    try {
      await ctx.storage.abortMultipartUpload(upload);
      result.orphaned += 1;
      log.info('multipart upload no item claims aborted', { object_key: upload.key });
    } catch (err) {
      result.failed += 1;
      log.warn('could not abort a multipart upload no item claims', {
        object_key: upload.key,
        error: errorMessage(err),
      });
    }
  }
}
