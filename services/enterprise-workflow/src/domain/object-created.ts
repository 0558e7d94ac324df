// POST /internal/media/object-created: the object store reports uploads (DESIGN 4.4).
import type { ObjectCreatedEvent } from '@platform/contracts';
import { recordObjectCreated } from '@platform/enterprise-db';
import { DomainError, mapDbError } from '@platform/service-kit';
import { StorageRefusedError, StorageUnavailableError } from '../storage/s3.js';
import type { ServiceScope, WorkflowContext } from './context.js';
import { isMediaObjectKey, normaliseEtag } from './media.js';
import { readRecord } from './object-events.js';
import type { ObjectCreated } from './object-events.js';

export type RecordOutcome = 'available' | 'rejected' | 'duplicate' | 'unknown_key' | 'ignored';

export interface WebhookResult {
  received: number;
  results: Array<{ key: string | null; outcome: RecordOutcome }>;
}

/** Seconds the store should wait before redelivering after an outage of ours. */
const RETRY_AFTER_S = '5';

/**
 * Size, type and ETag of the arrived object, as the store says (HEAD), never as the event says: an event is
 * only a hint that something happened, and whoever holds the webhook token could describe an object that is
 * not there. Undefined when the object is gone.
 */
async function observe(ctx: WorkflowContext, scope: ServiceScope, event: ObjectCreated) {
  try {
    const head = await ctx.storage.head(event.key);
    if (head === undefined) return undefined;
    return { sizeBytes: head.sizeBytes, contentType: head.contentType, etag: head.etag };
  } catch (err) {
    if (err instanceof StorageUnavailableError) {
      throw new DomainError('backend_unavailable', 'The object store is unreachable; retry later.', {
        headers: { 'Retry-After': RETRY_AFTER_S },
        cause: err,
      });
    }
    if (err instanceof StorageRefusedError) {
      // The store refused our own HEAD (typically 403: this service's credentials or bucket policy
      // lack s3:GetObject). The event is sound; we could not judge it. Acknowledging would lose it
      // for good, so answer as for an outage and let the store redeliver from its queue once an
      // operator has fixed the access this line reports.
      scope.log.error('object store refused HEAD for an object event', {
        object_key: event.key,
        store_status: err.status,
        error: err.message,
      });
      throw new DomainError('backend_unavailable', 'The object store refused a lookup; retry later.', {
        headers: { 'Retry-After': RETRY_AFTER_S },
        cause: err,
      });
    }
    throw err;
  }
}

/**
 * Each ObjectCreated record of a pending item makes it `available` or `rejected` (size or type differ
 * from the intent), through the database's narrow service identity. Redeliveries change nothing;
 * unknown keys and other events are acknowledged (a 2xx) and logged so the store does not retry them
 * forever; a database or storage outage is a 503 so the store (with a queue_dir) retries.
 */
export async function handleObjectCreated(
  ctx: WorkflowContext,
  scope: ServiceScope,
  body: ObjectCreatedEvent,
): Promise<WebhookResult> {
  const results: WebhookResult['results'] = [];
  const settle = (key: string | null, outcome: RecordOutcome): void => {
    ctx.counters.webhookRecords.inc({ outcome });
    results.push({ key, outcome });
  };
  for (const record of body.Records) {
    const reading = readRecord(record);
    if (reading.kind === 'ignored') {
      scope.log.info('object event ignored', { event_name: reading.eventName, reason: reading.reason });
      settle(null, 'ignored');
      continue;
    }
    const event = reading.event;
    if (event.bucket !== ctx.storage.bucket) {
      scope.log.warn('object event for another bucket ignored', { bucket: event.bucket });
      settle(event.key, 'ignored');
      continue;
    }
    // Media keys are generated (newObjectKey), so any other key is settled before any lookup and
    // acknowledged as unknown, not refused. A lookup could only fail on it: PostgreSQL text cannot hold
    // U+0000 (SQLSTATE 22021); a store refuses keys over 1,024 bytes; and a HEAD for an object outside the
    // media keys, or one already deleted, is a 403 on AWS without s3:ListBucket, which reads as a refusal
    // of our access (503). The event is well-formed, and a 4xx or 5xx would make MinIO redeliver it from
    // its queue_dir forever.
    if (!isMediaObjectKey(event.key)) {
      scope.log.warn('object event for an unknown key acknowledged', {
        object_key: event.key,
        outcome: 'unknown_key',
        reason: 'the key cannot name a media item',
      });
      settle(event.key, 'unknown_key');
      continue;
    }
    const observed = await observe(ctx, scope, event);
    if (observed === undefined) {
      // Created and already deleted again: nothing to mark; a later event (if any) will tell.
      scope.log.warn('object event for an object that no longer exists', { object_key: event.key });
      settle(event.key, 'ignored');
      continue;
    }
    let recorded;
    try {
      recorded = await recordObjectCreated(ctx.db, {
        objectKey: event.key,
        sizeBytes: observed.sizeBytes,
        etag: normaliseEtag(observed.etag) ?? null,
        contentType: observed.contentType ?? null,
      });
    } catch (err) {
      throw mapDbError(err);
    }
    const outcome: RecordOutcome =
      recorded.outcome === 'unknown_key'
        ? 'unknown_key'
        : recorded.outcome === 'already_recorded'
          ? 'duplicate'
          : recorded.status === 'available'
            ? 'available'
            : 'rejected';
    const meta = { object_key: event.key, media_id: recorded.mediaId, site_id: recorded.siteId, outcome };
    if (outcome === 'unknown_key') scope.log.warn('object event for an unknown key acknowledged', meta);
    else scope.log.info('object event recorded', meta);
    if (outcome === 'rejected') await discardRejected(ctx, scope, event.key);
    settle(event.key, outcome);
  }
  return { received: body.Records.length, results };
}

/** A rejected upload is never served; removing it is housekeeping, so a failure is only logged. */
async function discardRejected(ctx: WorkflowContext, scope: ServiceScope, key: string): Promise<void> {
  try {
    await ctx.storage.delete(key);
  } catch (err) {
    scope.log.warn('could not delete a rejected upload', { object_key: key, error: String(err) });
  }
}
