// Object-store notifications reduced to what the workflow acts on. Both MinIO's webhook body
// (`{EventName, Key, Records}`) and plain S3 event documents (`{Records}`) carry S3 event records;
// MinIO posts one event per request, S3-style senders may batch several records.
import { decodeEventObjectKey, isObjectCreatedEventName } from '@platform/contracts';

/** The part of an S3 event record the workflow reads (S3 event message structure v2.x). */
export interface S3EventRecordLike {
  eventName: string;
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
  // Keys in S3 event records are URL-encoded with `+` for a space (AWS "Event message structure");
  // MinIO encodes the same way, s3rver not at all (the generated keys read the same either way).
  const key = decodeEventObjectKey(record.s3.object.key);
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
