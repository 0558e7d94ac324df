// Media bodies of the workflow service (design §4.4): upload intents and downloads.
// The schemas check shape only; size limits per kind are service configuration.
import type { FromSchema } from 'json-schema-to-ts';
import { compileValidator } from './validation.js';

/** A UUID in its canonical hyphenated form (what PostgreSQL's `uuid` prints), any version, any case. */
export const UUID_PATTERN = '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$';
const uuidRegExp = new RegExp(UUID_PATTERN);

export function isUuid(value: unknown): value is string {
  return typeof value === 'string' && uuidRegExp.test(value);
}

// ajv-formats' `uuid` also accepts a `urn:uuid:` prefix, which PostgreSQL's uuid input rejects.
const uuidProperty = { type: 'string', pattern: UUID_PATTERN, patternMessage: 'must be a UUID' } as const;

export const imageContentTypes = ['image/jpeg', 'image/png', 'image/webp', 'image/heic'] as const;
export const videoContentTypes = ['video/mp4', 'video/quicktime'] as const;
export const mediaContentTypes = [...imageContentTypes, ...videoContentTypes] as const;

export type MediaContentType = (typeof mediaContentTypes)[number];
export type MediaKind = 'image' | 'video';

export function mediaKindOf(contentType: MediaContentType): MediaKind {
  return (imageContentTypes as readonly string[]).includes(contentType) ? 'image' : 'video';
}

// 1–255 characters, no `/` or `\` (a name, never a path), no C0/C1 control characters, no line
// separators or bidirectional controls (they can disguise an extension in a download), not "." or "..".
// The server never builds object keys from it; it is kept for display and Content-Disposition.
const FILENAME_CHARACTER =
  '[^/\\\\\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]';
export const FILENAME_PATTERN = `^(?!\\.{1,2}$)${FILENAME_CHARACTER}{1,255}$`;

const filenameProperty = {
  type: 'string',
  minLength: 1,
  maxLength: 255,
  // Length is left to min/maxLength, so one mistake gives one error.
  pattern: `^(?!\\.{1,2}$)${FILENAME_CHARACTER}*$`,
  patternMessage: 'must be a file name without "/", "\\" or control characters',
} as const;
const contentTypeProperty = { type: 'string', enum: mediaContentTypes } as const;
// Bytes. Positive and exact in a JavaScript number; per-kind limits are enforced by the service.
const sizeBytesProperty = { type: 'integer', minimum: 1, maximum: Number.MAX_SAFE_INTEGER } as const;

export const uploadIntentRequestSchema = {
  $id: 'https://platform.example/schemas/upload-intent-request.json',
  type: 'object',
  additionalProperties: false,
  required: ['filename', 'content_type', 'size_bytes'],
  properties: {
    filename: filenameProperty,
    content_type: contentTypeProperty,
    size_bytes: sizeBytesProperty,
    checksum_sha256: {
      type: 'string',
      // Standard base64 (RFC 4648 §4, as S3's x-amz-checksum-sha256) of exactly 32 bytes: 43 characters
      // and one "=", the last character carrying 4 significant bits (its low 2 bits zero).
      pattern: '^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$',
      patternMessage: 'must be the base64 encoding of a 32-byte SHA-256 digest',
      description: 'base64 of the SHA-256 digest of the file',
    },
    walkthrough_id: uuidProperty,
    work_item_id: uuidProperty,
    asset_id: uuidProperty,
  },
} as const;

export type UploadIntentRequest = FromSchema<typeof uploadIntentRequestSchema>;

/**
 * The answer to an intent: `upload`, one presigned PUT, or for a file above the multipart threshold
 * `multipart`, a plan of parts whose URLs are asked for later (design §4.4). Exactly one of the two.
 */
export const uploadIntentResponseSchema = {
  $id: 'https://platform.example/schemas/upload-intent-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['media_id', 'status'],
  oneOf: [{ required: ['upload'] }, { required: ['multipart'] }],
  properties: {
    media_id: uuidProperty,
    status: { type: 'string', const: 'pending_upload' },
    upload: {
      type: 'object',
      additionalProperties: false,
      required: ['method', 'url', 'headers', 'expires_at'],
      properties: {
        method: { type: 'string', const: 'PUT' },
        url: { type: 'string', format: 'uri' },
        headers: {
          type: 'object',
          description: 'headers the client must send with the PUT (they are part of the signature)',
          additionalProperties: { type: 'string' },
        },
        expires_at: { type: 'string', format: 'date-time' },
      },
    },
    multipart: {
      type: 'object',
      additionalProperties: false,
      required: ['upload_id', 'part_size_bytes', 'part_count', 'expires_at'],
      properties: {
        upload_id: { type: 'string', minLength: 1 },
        part_size_bytes: {
          type: 'integer',
          minimum: 1,
          description: 'size of every part but the last, which holds the rest',
        },
        part_count: { type: 'integer', minimum: 1, maximum: 10000 },
        expires_at: {
          type: 'string',
          format: 'date-time',
          description: 'parts must be uploaded and the upload completed before this; later it is aborted',
        },
      },
    },
  },
} as const;

export type UploadIntentResponse = FromSchema<typeof uploadIntentResponseSchema>;

export const downloadResponseSchema = {
  $id: 'https://platform.example/schemas/media-download-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['media_id', 'url', 'expires_at', 'content_type', 'size_bytes', 'filename'],
  properties: {
    media_id: uuidProperty,
    url: { type: 'string', format: 'uri' },
    expires_at: { type: 'string', format: 'date-time' },
    content_type: contentTypeProperty,
    size_bytes: sizeBytesProperty,
    filename: filenameProperty,
  },
} as const;

export type DownloadResponse = FromSchema<typeof downloadResponseSchema>;

export const validateUploadIntentRequest = compileValidator<UploadIntentRequest>(uploadIntentRequestSchema);
export const validateUploadIntentResponse =
  compileValidator<UploadIntentResponse>(uploadIntentResponseSchema);
export const validateDownloadResponse = compileValidator<DownloadResponse>(downloadResponseSchema);
