// Uploads in parts (design §4.4): the plan an intent above the threshold answers, part URLs, the parts
// stored so far (resume), completion and abort. The sweep of uploads whose intent expired: multipart-sweep.ts.
import type {
  CompleteUploadRequest,
  CompleteUploadResponse,
  PartUrlsRequest,
  PartUrlsResponse,
  StoredPartsResponse,
} from '@platform/contracts';
import { inUserTransaction } from '../db/database.js';
import { findMultipartMedia, markAbandoned } from '../db/multipart-repository.js';
import type { MultipartMedia } from '../db/multipart-repository.js';
import { storeCall } from './store-call.js';
import type { StoredPart } from './ports.js';
import type { MultipartSettings, UserScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import { normaliseEtag } from './media-rules.js';

const MiB = 1024 * 1024;
/** S3's limits: parts of at least 5 MiB (but the last), at most 10,000 parts. */
export const MIN_PART_SIZE_BYTES = 5 * MiB;
export const MAX_PARTS = 10_000;

export const defaultMultipartSettings = {
  thresholdBytes: 64 * MiB,
  partSizeBytes: 16 * MiB,
  uploadTtlS: 24 * 3600,
  // Open uploads hold parts in the store and entries in its listing, which the sweep reads whole (design §4.4):
  // without a bound any user could open thousands a minute. A browser uploads a handful of files at once
  // (Uppy's default is a few concurrent uploads), so 20 leaves room; a site's users together get ten times that.
  maxOpenPerUser: 20,
  maxOpenPerSite: 200,
} as const satisfies Required<MultipartSettings>;

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
