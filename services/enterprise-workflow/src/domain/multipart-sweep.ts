// The sweep of expired uploads in parts (design §4.4 "Abandoned uploads"): each replica aborts the store's
// uploads of pending items whose intent expired, marks them abandoned, accepts the ones the store assembled in
// time whose event never came, and aborts the uploads no pending item names. It has no caller, so it runs beside
// the HTTP app (main.ts starts it).
import { errorMessage, mapDbError } from '@platform/service-kit';
import type { Counter, Logger } from '@platform/service-kit';
import { randomUUID } from 'node:crypto';
import {
  abandonUnstartedUploads,
  expiredMultipartUploads,
  noteUploadAssembled,
  recordUploadAbandoned,
  unclaimedUploads,
} from '../db/multipart-repository.js';
import type { ExpiredUpload, ExpiredUploadsCursor } from '../db/multipart-repository.js';
import type { ServiceScope, WorkflowContext } from './context.js';
import { isMediaObjectKey, MEDIA_KEY_PREFIX } from './media-rules.js';
import { handleObjectCreated } from './object-created.js';
import type { RecordOutcome } from './object-created.js';

/** What the sweep reads and writes through: the database and the store, and a clock. */
export type SweepContext = Pick<WorkflowContext, 'db' | 'storage' | 'now'>;

/**
 * Accepts the object at `key` as the webhook would on its ObjectCreated event (HEAD, the copy to `accepted/`,
 * the record, design §4.4 and §4.6), for an upload the store assembled whose event never came.
 */
export type AcceptObject = (key: string, scope: ServiceScope) => Promise<RecordOutcome>;

/** The webhook's own path (handleObjectCreated) for one object, as if the store had reported it. */
export function acceptThroughWebhookPath(ctx: WorkflowContext): AcceptObject {
  return async (key, scope) => {
    const result = await handleObjectCreated(ctx, scope, {
      Records: [
        {
          // S3 and MinIO name an assembled upload's event so; records carry keys URL-encoded (AWS "Event message
          // structure"), which the webhook decodes.
          eventName: 'ObjectCreated:CompleteMultipartUpload',
          s3: { bucket: { name: ctx.storage.bucket }, object: { key: encodeURIComponent(key) } },
        },
      ],
    });
    return result.results[0]?.outcome ?? 'ignored';
  };
}

/** The most rows a definer function of the sweep answers (migrations 0007, 0009, 0010, 0013). */
const MAX_PAGE = 1000;
/** Rows of the sweep's pages and store uploads per batch as main.ts runs it. */
const SWEEP_PAGE = 500;

/** The sweep of expired uploads in parts, as main.ts runs it. */
export function startExpiredUploadSweep(
  ctx: SweepContext,
  log: Logger,
  options: {
    intervalS: number;
    graceS: number;
    /** Counts each run's outcomes (`workflow_multipart_sweep_total`, see createSweepMetrics). */
    outcomes?: Counter<'outcome'>;
    /** Accepts an assembled upload whose event never came (main.ts: acceptThroughWebhookPath). */
    accept?: AcceptObject;
  },
): { stop(): Promise<void> } {
  if (options.intervalS === 0) return { stop: () => Promise.resolve() };
  let running: Promise<unknown> | undefined;
  const stopping = new AbortController();
  const timer = setInterval(() => {
    // A run slower than the interval (a slow store, many pages) is not overlapped by the next one.
    if (running !== undefined) return;
    running = sweepExpiredUploads(ctx, log, {
      graceS: options.graceS,
      limit: SWEEP_PAGE,
      signal: stopping.signal,
      ...(options.accept === undefined ? {} : { accept: options.accept }),
    })
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
      // A run under way ends after the item it is on.
      stopping.abort();
      await running;
    },
  };
}

export interface SweepResult {
  abandoned: number;
  /**
   * Expired uploads the store had assembled in time: left to their object event when first found, and accepted
   * (available or rejected) through the webhook's path once their event is a grace period late.
   */
  completed: number;
  /** Uploads under the media keys that no pending item names, aborted in the store. */
  orphaned: number;
  failed: number;
}

export interface SweepOptions {
  graceS: number;
  /** Items per page and store uploads per batch (at most 1,000); every page is read. */
  limit: number;
  /**
   * Accepts an upload the store assembled whose event is a grace period late. Without it such an upload is only
   * noted and left to its event (tests of the sweep's store side).
   */
  accept?: AcceptObject;
  /** Ends the run between two items (the service is stopping). */
  signal?: AbortSignal;
}

/**
 * One run (design §4.4): every pending multipart item whose intent expired more than `graceS` ago, page by page,
 * has its store upload aborted and is marked abandoned; one the store assembled in time is accepted through the
 * webhook's path once its event is `graceS` late (noted at first sight); then planned items never started are
 * abandoned, and the store's uploads no pending item names are aborted. Safe to run on several replicas at once:
 * aborting twice is harmless, the database changes an item only while it is pending, and the webhook's record
 * takes an item once.
 */
export async function sweepExpiredUploads(
  ctx: SweepContext,
  log: Logger,
  options: SweepOptions,
): Promise<SweepResult> {
  const result: SweepResult = { abandoned: 0, completed: 0, orphaned: 0, failed: 0 };
  // A page shorter than asked for is the last one, so never ask for more than the functions answer.
  const limit = Math.min(Math.max(1, options.limit), MAX_PAGE);
  const before = new Date(ctx.now().getTime() - options.graceS * 1000);
  const scope: ServiceScope = { requestId: `multipart-sweep-${randomUUID()}`, log };
  // A function, not a narrowed property: the signal changes while the run awaits.
  const stopped = (): boolean => options.signal?.aborted === true;
  let after: ExpiredUploadsCursor | undefined;
  for (;;) {
    if (stopped()) return result;
    let page: ExpiredUpload[];
    try {
      page = await expiredMultipartUploads(ctx.db, before, after, limit);
    } catch (err) {
      throw mapDbError(err);
    }
    for (const upload of page) {
      if (stopped()) return result;
      await sweepExpired(ctx, scope, upload, before, options.accept, result);
    }
    if (page.length < limit) break;
    after = page.at(-1)?.cursor;
  }
  // Items whose plan was recorded but whose store upload was never started (a crash between the two, a
  // failure that could not be recorded): a start takes seconds, the grace period minutes. Each call abandons
  // up to `limit`, and what it abandons leaves the set.
  for (;;) {
    if (stopped()) return result;
    let unstarted: number;
    try {
      unstarted = await abandonUnstartedUploads(ctx.db, before, limit);
    } catch (err) {
      throw mapDbError(err);
    }
    result.abandoned += unstarted;
    if (unstarted > 0) log.info('multipart intents never started abandoned', { count: unstarted });
    if (unstarted < limit) break;
  }
  await sweepUnclaimedUploads(ctx, log, before, { ...options, limit }, result);
  return result;
}

/** One expired pending upload: aborted and abandoned, or, assembled by the store in time, left or accepted. */
async function sweepExpired(
  ctx: SweepContext,
  scope: ServiceScope,
  upload: ExpiredUpload,
  before: Date,
  accept: AcceptObject | undefined,
  result: SweepResult,
): Promise<void> {
  const { log } = scope;
  try {
    const aborted = await ctx.storage.abortMultipartUpload({
      key: upload.objectKey,
      uploadId: upload.uploadId,
    });
    if (!aborted && (await ctx.storage.head(upload.objectKey)) !== undefined) {
      await settleAssembled(ctx, scope, upload, before, accept, result);
      return;
    }
    if (await recordUploadAbandoned(ctx.db, upload.mediaId, 'the upload intent expired before completion')) {
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

/**
 * The store assembled the upload (its upload is gone, its object there) and the item is still pending: its
 * object event has not been handled. The event normally follows within seconds (MinIO redelivers from its
 * queue_dir), so at first sight the upload is only noted; once it was noted a grace period ago the event is
 * taken as lost and the object accepted through the webhook's own path, which makes the item available or
 * rejected like the event would have (design §4.4). Without that, such an item stayed pending for ever and
 * filled the sweep's first page on every run.
 */
async function settleAssembled(
  ctx: SweepContext,
  scope: ServiceScope,
  upload: ExpiredUpload,
  before: Date,
  accept: AcceptObject | undefined,
  result: SweepResult,
): Promise<void> {
  const meta = { media_id: upload.mediaId, site_id: upload.siteId };
  let seen = upload.assembledSeenAt;
  if (seen === null) {
    try {
      seen = (await noteUploadAssembled(ctx.db, upload.mediaId)) ?? null;
    } catch (err) {
      throw mapDbError(err);
    }
  }
  if (seen === null || seen.getTime() >= before.getTime() || accept === undefined) {
    result.completed += 1;
    return;
  }
  const outcome = await accept(upload.objectKey, scope);
  if (outcome === 'available' || outcome === 'rejected' || outcome === 'duplicate') {
    result.completed += 1;
    scope.log.info('expired multipart upload whose event never came accepted by the sweep', {
      ...meta,
      outcome,
    });
    return;
  }
  // The object changed or went while it was being accepted: the next run looks again.
  result.failed += 1;
  scope.log.warn('could not accept an expired multipart upload whose event never came', { ...meta, outcome });
}

/**
 * The store's open uploads under the media keys that no pending item names and that were started before
 * `before` (the grace period: an intent's row commits within its request, seconds after its upload starts):
 * left by an intent whose answer from the store came too late, whose recording failed, or whose process
 * stopped in between. Nothing else would ever remove them (design §4.4). Every old upload the store lists is
 * looked at, in batches, so legitimate uploads ahead of them in the listing never hide orphans. An upload without
 * an initiation time, or under a key that cannot name a media item, is never touched.
 */
async function sweepUnclaimedUploads(
  ctx: SweepContext,
  log: Logger,
  before: Date,
  options: SweepOptions,
  result: SweepResult,
): Promise<void> {
  const open = await ctx.storage.listMultipartUploads({ prefix: MEDIA_KEY_PREFIX });
  const old = open.filter(
    (u) => isMediaObjectKey(u.key) && u.initiated !== undefined && u.initiated < before,
  );
  for (let start = 0; start < old.length; start += options.limit) {
    if (options.signal?.aborted === true) return;
    let unclaimed;
    try {
      unclaimed = await unclaimedUploads(ctx.db, old.slice(start, start + options.limit));
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
}
