// Object-created notifications from the object store (design §4.4), posted to the workflow webhook.
//
// Two bodies arrive: MinIO's webhook body `{EventName, Key, Records: [record]}` (one event per request;
// `Key` is `bucket/object`, decoded) and a plain S3 event notification `{Records: [...]}` (AWS, and
// s3rver through the local bridge). Both carry many more fields than we read and they change between
// releases, so these schemas allow extra properties everywhere and are strict only on the fields the
// workflow reads. Removal and other events must pass too: the webhook acknowledges them, because MinIO
// retries a rejected event from its queue_dir forever.
import type { FromSchema } from 'json-schema-to-ts';
import { compileValidator } from './validation.js';

/** MinIO names events `s3:ObjectCreated:Put`, AWS and s3rver `ObjectCreated:Put`. */
export const OBJECT_CREATED_EVENT_PATTERN = '^(?:s3:)?ObjectCreated:';
const objectCreatedRegExp = new RegExp(OBJECT_CREATED_EVENT_PATTERN);

export function isObjectCreatedEventName(eventName: string): boolean {
  return objectCreatedRegExp.test(eventName);
}

/**
 * An HTTP field value (RFC 9110 section 5.5): no control characters but HTAB. The record's eTag and
 * contentType are copies of such values (the store computes the ETag and takes the type from the
 * upload's Content-Type header, which HTTP servers refuse with a control character in it), so one
 * that breaks this was not written by a store: the event is malformed (400), not an unknown object.
 * NUL in particular could never be stored (PostgreSQL text refuses it).
 */
const httpFieldValue = {
  type: 'string',
  pattern: '^[^\\u0000-\\u0008\\u000A-\\u001F\\u007F]*$',
  patternMessage: 'must not contain control characters',
} as const;

const eventRecordSchema = {
  type: 'object',
  required: ['eventName', 's3'],
  properties: {
    eventName: { type: 'string', minLength: 1 },
    s3: {
      type: 'object',
      required: ['bucket', 'object'],
      properties: {
        bucket: {
          type: 'object',
          required: ['name'],
          properties: { name: { type: 'string', minLength: 1 } },
        },
        object: {
          type: 'object',
          required: ['key'],
          properties: {
            key: {
              type: 'string',
              minLength: 1,
              description: 'URL-encoded (spaces as "+") by AWS and MinIO; decode with decodeEventObjectKey',
            },
            // Bytes. Absent on removal events, and on MinIO's events for empty objects (Go `omitempty`).
            // Bounded where JSON numbers stop being exact integers in JavaScript (8 PiB, far above any
            // store's object size limit, which is in terabytes) and so below PostgreSQL bigint, where a
            // larger value fails the write (SQLSTATE 22003). No store reports such a size, and beyond
            // 2^53 it cannot even be compared exactly: malformed (400), not a size mismatch.
            size: { type: 'integer', minimum: 0, maximum: Number.MAX_SAFE_INTEGER },
            // Absent on removal events and on s3rver's ObjectCreated:Copy.
            eTag: httpFieldValue,
            // MinIO only.
            contentType: httpFieldValue,
          },
        },
      },
    },
  },
} as const;

export const objectCreatedEventSchema = {
  $id: 'https://platform.example/schemas/object-created-event.json',
  description: "MinIO webhook body or plain S3 event notification (extra properties allowed: the store's)",
  type: 'object',
  required: ['Records'],
  properties: {
    EventName: { type: 'string' },
    Key: { type: 'string' },
    Records: { type: 'array', minItems: 1, items: eventRecordSchema },
  },
} as const;

export type ObjectCreatedEvent = FromSchema<typeof objectCreatedEventSchema>;
export type ObjectEventRecord = FromSchema<typeof eventRecordSchema>;

export const validateObjectCreatedEvent = compileValidator<ObjectCreatedEvent>(objectCreatedEventSchema);

/**
 * The object key of an event record as stored: records carry it URL-encoded with "+" for spaces (AWS;
 * MinIO encodes with Go's url.QueryEscape). s3rver sends keys raw; for keys made of unreserved
 * characters (the workflow generates its keys that way) both readings agree. A key that is not valid
 * percent-encoding is returned unchanged.
 */
export function decodeEventObjectKey(key: string): string {
  try {
    return decodeURIComponent(key.replace(/\+/g, ' '));
  } catch {
    return key;
  }
}

/** What the webhook answers: one result per record, in order (design §4.4). */
export const webhookResultSchema = {
  $id: 'https://platform.example/schemas/webhook-result.json',
  type: 'object',
  additionalProperties: false,
  required: ['received', 'results'],
  properties: {
    received: { type: 'integer', minimum: 1, description: 'Records in the body.' },
    results: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['key', 'outcome'],
        properties: {
          key: {
            type: ['string', 'null'],
            description: 'The decoded object key (null for records that are not ObjectCreated events).',
          },
          outcome: { type: 'string', enum: ['available', 'rejected', 'duplicate', 'unknown_key', 'ignored'] },
        },
      },
    },
  },
} as const;

export type WebhookResult = FromSchema<typeof webhookResultSchema>;
