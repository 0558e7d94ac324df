// Object-store notifications reduced to what the workflow acts on. Both MinIO's webhook body
// (`{EventName, Key, Records}`) and plain S3 event documents (`{Records}`: AWS, Ceph RGW's HTTP push) carry
// S3 event records; MinIO posts one event per request, S3-style senders may batch several records.
import { decodeEventObjectKey, isObjectCreatedEventName } from '@platform/contracts';

/** The part of an S3 event record the workflow reads (S3 event message structure v2.x). */
export interface S3EventRecordLike {
  eventName: string;
  /** `aws:s3`, `minio:s3`, `ceph:s3` (RGW); absent on s3rver's bridge and on hand-made records. */
  eventSource?: unknown;
  s3: {
    bucket: { name: string };
    object: {
      key: string;
      size?: number | undefined;
      eTag?: string | undefined;
      contentType?: string | undefined;
    };
  };
}

export interface ObjectCreated {
  bucket: string;
  /** The decoded object key, exactly as stored. */
  key: string;
  sizeBytes: number | undefined;
  etag: string | undefined;
  contentType: string | undefined;
}

export type RecordReading =
  { kind: 'created'; event: ObjectCreated } | { kind: 'ignored'; eventName: string; reason: string };

export function readRecord(record: S3EventRecordLike): RecordReading {
  if (!isObjectCreatedEventName(record.eventName)) {
    return { kind: 'ignored', eventName: record.eventName, reason: 'not an ObjectCreated event' };
  }
  const key = eventKey(record);
  const { size, eTag, contentType } = record.s3.object;
  return {
    kind: 'created',
    event: {
      bucket: record.s3.bucket.name,
      key,
      sizeBytes: size,
      etag: eTag,
      contentType: contentType === undefined || contentType === '' ? undefined : contentType,
    },
  };
}

/** The event source of Ceph RGW's bucket notifications. */
const RGW_EVENT_SOURCE = 'ceph:s3';

/**
 * The object key a record names, as stored. AWS URL-encodes it with `+` for a space ("Event message
 * structure"), MinIO the same way; Ceph RGW sends it as stored (its 16.2 records: `sites/a b+c.jpg` as such,
 * checked in packages/testkit/test/rgw.test.ts), so decoding would turn its `+` into a space and its `%xx` into
 * other characters. s3rver's bridge encodes like AWS. The generated media keys read the same either way.
 */
function eventKey(record: S3EventRecordLike): string {
  const raw = record.s3.object.key;
  return record.eventSource === RGW_EVENT_SOURCE ? raw : decodeEventObjectKey(raw);
}
