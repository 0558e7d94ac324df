// POST /internal/media/object-created: the object store reports uploads (design §4.4).
import type { ObjectCreatedEvent } from '@platform/contracts';
import { recordObjectCreated } from '@platform/enterprise-db';
import { mapDbError } from '@platform/service-kit';
import type { ServiceScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import { storeCall } from './store-call.js';
import { ACCEPTED_PREFIX, acceptedObjectKey, isMediaObjectKey, normaliseEtag } from './media.js';
import { readRecord } from './object-events.js';
import type { ObjectCreated } from './object-events.js';

export type RecordOutcome = 'available' | 'rejected' | 'duplicate' | 'unknown_key' | 'ignored';

export interface WebhookResult {
  received: number;
  results: Array<{ key: string | null; outcome: RecordOutcome }>;
}

/**
 * Size, type and ETag of the arrived object, as the store says (HEAD), never as the event says: an event is
 * only a hint that something happened, and whoever holds the webhook token could describe an object that is
 * not there. Undefined when the object is gone.
 */
async function observe(ctx: WorkflowContext, scope: ServiceScope, event: ObjectCreated) {
  const head = await storeCall(scope.log, 'HEAD for an object event', () => ctx.storage.head(event.key), {
    object_key: event.key,
  });
  if (head === undefined) return undefined;
  return { sizeBytes: head.sizeBytes, contentType: head.contentType, etag: normaliseEtag(head.etag) };
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
    if (event.key.startsWith(ACCEPTED_PREFIX)) {
      // This service's own copy of an accepted upload (MinIO is configured for `sites/` only; s3rver and
      // stores without a prefix filter report it anyway).
      settle(event.key, 'ignored');
      continue;
    }
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
    if (observed.etag === undefined) {
      // S3 and MinIO always send one; without it the exact bytes cannot be pinned, so nothing is accepted.
      scope.log.error('object store gave no ETag for an uploaded object', { object_key: event.key });
      throw ERRORS.storeGaveNoEtag();
    }
    // Secured before it is recorded: once the item says available, the bytes it names are already where no
    // upload URL can reach. Only the version just inspected is copied (if-match its ETag).
    const secured = acceptedObjectKey(event.key, observed.etag);
    const copyEtag = await storeCall(
      scope.log,
      'COPY for an object event',
      () => ctx.storage.copy({ source: event.key, destination: secured, etag: observed.etag as string }),
      { object_key: event.key },
    );
    if (normaliseEtag(copyEtag) !== observed.etag) {
      // Replaced or deleted since the HEAD (another PUT to the same URL): that PUT's own event decides.
      // A store that ignores if-match (s3rver) copied other bytes: they must not stay under this key.
      if (copyEtag !== undefined) await housekeeping(ctx, scope, secured, 'a copy of a replaced upload');
      scope.log.warn('object changed while it was being accepted', { object_key: event.key });
      settle(event.key, 'ignored');
      continue;
    }
    let recorded;
    try {
      recorded = await recordObjectCreated(ctx.db, {
        objectKey: event.key,
        sizeBytes: observed.sizeBytes,
        etag: observed.etag,
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
    // Nothing is ever served from the upload key once the item is decided: the object there is either copied
    // (available), refused (rejected), or a later PUT to a still-valid URL (duplicate).
    if (outcome !== 'unknown_key')
      await housekeeping(ctx, scope, event.key, `the upload of a ${outcome} item`);
    // The copy stays only for an item that is available: it is what downloads serve (for a duplicate of an
    // available item whose ETag is the recorded one, the served copy itself, same key and bytes). For any
    // other item (rejected, abandoned, unknown) nothing would ever serve or remove it.
    if (recorded.status !== 'available')
      await housekeeping(
        ctx,
        scope,
        secured,
        `the copy of an upload whose item is ${recorded.status ?? 'unknown'}`,
      );
    settle(event.key, outcome);
  }
  return { received: body.Records.length, results };
}

/** Removing an object nothing serves is housekeeping: a failure is only logged. */
async function housekeeping(
  ctx: WorkflowContext,
  scope: ServiceScope,
  key: string,
  what: string,
): Promise<void> {
  try {
    await ctx.storage.delete(key);
  } catch (err) {
    scope.log.warn(`could not delete ${what}`, { object_key: key, error: String(err) });
  }
}
