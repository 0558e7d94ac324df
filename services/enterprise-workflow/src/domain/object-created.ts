// POST /internal/media/object-created: the object store reports uploads (design §4.4).
import type { ObjectCreatedEvent } from '@platform/contracts';
import { recordObjectCreated } from '@platform/enterprise-db';
import { mapDbError } from '@platform/service-kit';
import type { ServiceScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import { storeCall } from './store-call.js';
import { ACCEPTED_PREFIX, acceptedObjectKey, isMediaObjectKey, normaliseEtag } from './media-rules.js';
import { readRecord } from './object-event-records.js';
import type { ObjectCreated } from './object-event-records.js';

export type RecordOutcome = 'available' | 'rejected' | 'duplicate' | 'unknown_key' | 'ignored';

export interface WebhookResult {
  received: number;
  results: Array<{ key: string | null; outcome: RecordOutcome }>;
}

interface Observed {
  sizeBytes: number;
  contentType: string | undefined;
  etag: string;
  lastModified: Date | undefined;
}

/**
 * Size, type and ETag of the arrived object, as the store says (HEAD), never as the event says: an event is
 * only a hint that something happened, and whoever holds the webhook token could describe an object that is
 * not there. Undefined when the object is gone.
 */
async function observe(
  ctx: WorkflowContext,
  scope: ServiceScope,
  event: ObjectCreated,
): Promise<Observed | undefined> {
  const head = await storeCall(scope.log, 'HEAD for an object event', () => ctx.storage.head(event.key), {
    object_key: event.key,
  });
  if (head === undefined) return undefined;
  const etag = normaliseEtag(head.etag);
  if (etag === undefined) {
    // S3 and MinIO always send one; without it the exact bytes cannot be pinned, so nothing is accepted.
    scope.log.error('object store gave no ETag for an uploaded object', { object_key: event.key });
    throw ERRORS.storeGaveNoEtag();
  }
  return { sizeBytes: head.sizeBytes, contentType: head.contentType, etag, lastModified: head.lastModified };
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
  for (const record of body.Records) {
    const result = await settleRecord(ctx, scope, record);
    ctx.counters.webhookRecords.inc({ outcome: result.outcome });
    results.push(result);
  }
  return { received: body.Records.length, results };
}

type Settled = WebhookResult['results'][number];

/**
 * One record, step by step as design §4.4 ("The webhook") and §4.6 describe it: screen the event, believe the
 * store (HEAD), secure the inspected version (copy to `accepted/`), record it, then remove what nothing serves.
 */
async function settleRecord(
  ctx: WorkflowContext,
  scope: ServiceScope,
  record: ObjectCreatedEvent['Records'][number],
): Promise<Settled> {
  const event = screen(ctx, scope, record);
  if (!('bucket' in event)) return event;
  const observed = await observe(ctx, scope, event);
  if (observed === undefined) {
    // Created and already deleted again: nothing to mark; a later event (if any) will tell.
    scope.log.warn('object event for an object that no longer exists', { object_key: event.key });
    return { key: event.key, outcome: 'ignored' };
  }
  const secured = await secure(ctx, scope, event.key, observed);
  if (secured === undefined) return { key: event.key, outcome: 'ignored' };
  const recorded = await recordArrival(ctx, event.key, observed);
  const outcome = outcomeOf(recorded);
  const meta = { object_key: event.key, media_id: recorded.mediaId, site_id: recorded.siteId, outcome };
  if (outcome === 'unknown_key') scope.log.warn('object event for an unknown key acknowledged', meta);
  else scope.log.info('object event recorded', meta);
  // Nothing is ever served from the upload key once the item is decided: the object there is either copied
  // (available), refused (rejected), or a later PUT to a still-valid URL (duplicate).
  if (outcome !== 'unknown_key') await housekeeping(ctx, scope, event.key, `the upload of a ${outcome} item`);
  // The copy stays only for an item that is available: it is what downloads serve (for a duplicate of an
  // available item whose ETag is the recorded one, the served copy itself, same key and bytes). For any
  // other item (rejected, abandoned, unknown) nothing would ever serve or remove it.
  if (recorded.status !== 'available') {
    const status = recorded.status ?? 'unknown';
    await housekeeping(ctx, scope, secured, `the copy of an upload whose item is ${status}`);
  }
  return { key: event.key, outcome };
}

/**
 * The event, or how it is settled without a lookup. Media keys are generated (newObjectKey), so any other key
 * is settled before any lookup and acknowledged as unknown, not refused. A lookup could only fail on it:
 * PostgreSQL text cannot hold U+0000 (SQLSTATE 22021); a store refuses keys over 1,024 bytes; and a HEAD for an
 * object outside the media keys, or one already deleted, is a 403 on AWS without s3:ListBucket, which reads as a
 * refusal of our access (503). The event is well-formed, and a 4xx or 5xx would make MinIO redeliver it from
 * its queue_dir forever.
 */
function screen(
  ctx: WorkflowContext,
  scope: ServiceScope,
  record: ObjectCreatedEvent['Records'][number],
): ObjectCreated | Settled {
  const reading = readRecord(record);
  if (reading.kind === 'ignored') {
    scope.log.info('object event ignored', { event_name: reading.eventName, reason: reading.reason });
    return { key: null, outcome: 'ignored' };
  }
  const event = reading.event;
  if (event.bucket !== ctx.storage.bucket) {
    scope.log.warn('object event for another bucket ignored', { bucket: event.bucket });
    return { key: event.key, outcome: 'ignored' };
  }
  // This service's own copy of an accepted upload (MinIO is configured for `sites/` only; s3rver and stores
  // without a prefix filter report it anyway).
  if (event.key.startsWith(ACCEPTED_PREFIX)) return { key: event.key, outcome: 'ignored' };
  if (!isMediaObjectKey(event.key)) {
    scope.log.warn('object event for an unknown key acknowledged', {
      object_key: event.key,
      outcome: 'unknown_key',
      reason: 'the key cannot name a media item',
    });
    return { key: event.key, outcome: 'unknown_key' };
  }
  return event;
}

/**
 * Secured before it is recorded (design §4.6): once the item says available, the bytes it names are already
 * where no upload URL can reach. The copy asks for the inspected version only (if-match its ETag), which S3 and
 * MinIO honour and s3rver and Ceph RGW 16.2 ignore, so the copy is then checked against what was inspected
 * (copyIsInspected). The accepted key, or undefined when the object changed meanwhile.
 */
async function secure(
  ctx: WorkflowContext,
  scope: ServiceScope,
  key: string,
  observed: Observed,
): Promise<string | undefined> {
  const secured = acceptedObjectKey(key, observed.etag);
  const copied = await storeCall(
    scope.log,
    'COPY for an object event',
    () => ctx.storage.copy({ source: key, destination: secured, etag: observed.etag }),
    { object_key: key },
  );
  if (copied && (await copyIsInspected(ctx, scope, key, secured, observed))) return secured;
  // Replaced or deleted since the HEAD (another PUT to the same URL): that PUT's own event decides. A copy of
  // other bytes, which a store that ignores if-match makes, must not stay under this key.
  if (copied) await housekeeping(ctx, scope, secured, 'a copy of a replaced upload');
  scope.log.warn('object changed while it was being accepted', { object_key: key });
  return undefined;
}

/**
 * Whether the copy holds the inspected version, without assuming the store gives a copy its source's ETag
 * (AWS does not for an object assembled from parts, nor for SSE-KMS or SSE-C objects). Its size must be the
 * inspected size. Then either its ETag is the inspected one: an ETag is the MD5 of the bytes for an object
 * written in one PUT, and a store that keeps a copy's source ETag (s3rver, RGW, MinIO) gives it the ETag of the
 * version it copied. Or the store gave it an ETag of its own, and the source, asked again after the copy, is
 * still the inspected version (ETag and Last-Modified): it was that version before and after the copy. Design
 * §4.6 says what this guarantees on each store.
 */
async function copyIsInspected(
  ctx: WorkflowContext,
  scope: ServiceScope,
  key: string,
  secured: string,
  observed: Observed,
): Promise<boolean> {
  const meta = { object_key: key };
  const copy = await storeCall(scope.log, 'HEAD of the accepted copy', () => ctx.storage.head(secured), meta);
  if (copy === undefined || copy.sizeBytes !== observed.sizeBytes) return false;
  if (normaliseEtag(copy.etag) === observed.etag) return true;
  const source = await storeCall(
    scope.log,
    'HEAD after the accepted copy',
    () => ctx.storage.head(key),
    meta,
  );
  return (
    source !== undefined &&
    normaliseEtag(source.etag) === observed.etag &&
    source.sizeBytes === observed.sizeBytes &&
    source.lastModified?.getTime() === observed.lastModified?.getTime()
  );
}

/** The arrival, through the ingest role's one write function (enterprise_api.record_object_created). */
async function recordArrival(ctx: WorkflowContext, key: string, observed: Observed) {
  try {
    return await recordObjectCreated(ctx.db, {
      objectKey: key,
      sizeBytes: observed.sizeBytes,
      etag: observed.etag,
      contentType: observed.contentType ?? null,
    });
  } catch (err) {
    throw mapDbError(err);
  }
}

function outcomeOf(recorded: Awaited<ReturnType<typeof recordArrival>>): RecordOutcome {
  if (recorded.outcome === 'unknown_key') return 'unknown_key';
  if (recorded.outcome === 'already_recorded') return 'duplicate';
  return recorded.status === 'available' ? 'available' : 'rejected';
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
