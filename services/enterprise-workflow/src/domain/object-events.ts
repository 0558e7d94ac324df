// Object-store notifications reduced to what the workflow acts on. Both MinIO's webhook body
// (`{EventName, Key, Records}`) and plain S3 event documents (`{Records}`) carry S3 event records;
// MinIO posts one event per request, S3-style senders may batch several records.

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

/**
 * Keys in S3 event records are URL-encoded the way HTML forms are: `+` is a space and `%2B` a plus
 * (AWS "Event message structure": "The s3 key provides information about the bucket and object
 * involved in the event. The object key name value is URL encoded."). MinIO encodes the same way.
 */
export function decodeEventKey(encoded: string): string | undefined {
  try {
    return decodeURIComponent(encoded.replace(/\+/g, ' '));
  } catch {
    return undefined;
  }
}

/** `s3:ObjectCreated:Put` (MinIO) and `ObjectCreated:Put` (S3) are the same event. */
export function isObjectCreated(eventName: string): boolean {
  return eventName.replace(/^s3:/, '').startsWith('ObjectCreated:');
}

export function readRecord(record: S3EventRecordLike): RecordReading {
  if (!isObjectCreated(record.eventName)) {
    return { kind: 'ignored', eventName: record.eventName, reason: 'not an ObjectCreated event' };
  }
  const key = decodeEventKey(record.s3.object.key);
  if (key === undefined || key.length === 0) {
    return { kind: 'ignored', eventName: record.eventName, reason: 'object key is not valid URL encoding' };
  }
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
