// The sweep of expired uploads in parts (design §4.4 "Abandoned uploads"): each replica aborts the store's
// uploads of pending items whose intent expired, marks them abandoned, and aborts the uploads no pending item
// names. It has no caller, so it runs beside the HTTP app (main.ts starts it).
import { errorMessage, mapDbError } from '@platform/service-kit';
import type { Counter, Logger } from '@platform/service-kit';
import {
  abandonUnstartedUploads,
  expiredMultipartUploads,
  recordUploadAbandoned,
  unclaimedUploads,
} from '../db/multipart-repository.js';
import type { WorkflowContext } from './context.js';
import { isMediaObjectKey, MEDIA_KEY_PREFIX } from './media-rules.js';

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
