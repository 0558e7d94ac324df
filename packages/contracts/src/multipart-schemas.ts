// Bodies of the multipart upload calls of the workflow service (design §4.4): part URLs, the parts
// stored so far, completion. The intent that starts an upload in parts is in media.ts.
import type { FromSchema } from 'json-schema-to-ts';
import { UUID_PATTERN } from './media-schemas.js';
import { compileValidator } from './validation.js';

const uuidProperty = { type: 'string', pattern: UUID_PATTERN, patternMessage: 'must be a UUID' } as const;
/** S3 numbers parts 1 to 10,000. */
const partNumberProperty = { type: 'integer', minimum: 1, maximum: 10000 } as const;
/** Most part URLs one request may ask for: bounds the signing work of one request. */
export const MAX_PART_URLS_PER_REQUEST = 100;

export const partUrlsRequestSchema = {
  $id: 'https://platform.example/schemas/part-urls-request.json',
  type: 'object',
  additionalProperties: false,
  required: ['parts'],
  properties: {
    parts: {
      type: 'array',
      minItems: 1,
      maxItems: MAX_PART_URLS_PER_REQUEST,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['part_number'],
        properties: {
          part_number: partNumberProperty,
          checksum_sha256: {
            type: 'string',
            pattern: '^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$',
            patternMessage: 'must be the base64 encoding of a 32-byte SHA-256 digest',
            description: 'base64 of the SHA-256 digest of the part; the store refuses other bytes',
          },
        },
      },
    },
  },
} as const;

export type PartUrlsRequest = FromSchema<typeof partUrlsRequestSchema>;

export const partUrlsResponseSchema = {
  $id: 'https://platform.example/schemas/part-urls-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['media_id', 'parts'],
  properties: {
    media_id: uuidProperty,
    parts: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['part_number', 'method', 'url', 'headers', 'size_bytes', 'expires_at'],
        properties: {
          part_number: partNumberProperty,
          method: { type: 'string', const: 'PUT' },
          url: { type: 'string', format: 'uri' },
          headers: {
            type: 'object',
            description: 'headers the client must send with the PUT (they are part of the signature)',
            additionalProperties: { type: 'string' },
          },
          size_bytes: {
            type: 'integer',
            minimum: 1,
            description: 'the exact length of this part; the URL is signed for it',
          },
          expires_at: { type: 'string', format: 'date-time' },
        },
      },
    },
  },
} as const;

export type PartUrlsResponse = FromSchema<typeof partUrlsResponseSchema>;

export const storedPartsResponseSchema = {
  $id: 'https://platform.example/schemas/stored-parts-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['media_id', 'upload_id', 'part_size_bytes', 'part_count', 'parts'],
  properties: {
    media_id: uuidProperty,
    upload_id: { type: 'string', minLength: 1 },
    part_size_bytes: { type: 'integer', minimum: 1 },
    part_count: partNumberProperty,
    parts: {
      type: 'array',
      description: 'the parts the store holds, in part-number order; a resumed upload sends only the others',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['part_number', 'size_bytes', 'etag'],
        properties: {
          part_number: partNumberProperty,
          size_bytes: { type: 'integer', minimum: 0 },
          etag: { type: 'string', minLength: 1 },
        },
      },
    },
  },
} as const;

export type StoredPartsResponse = FromSchema<typeof storedPartsResponseSchema>;

export const completeUploadRequestSchema = {
  $id: 'https://platform.example/schemas/complete-upload-request.json',
  type: 'object',
  additionalProperties: false,
  required: ['parts'],
  properties: {
    parts: {
      type: 'array',
      minItems: 1,
      maxItems: 10000,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['part_number', 'etag'],
        properties: {
          part_number: partNumberProperty,
          etag: {
            type: 'string',
            minLength: 1,
            maxLength: 256,
            description: "the part's ETag, as its PUT answered",
          },
        },
      },
    },
  },
} as const;

export type CompleteUploadRequest = FromSchema<typeof completeUploadRequestSchema>;

export const completeUploadResponseSchema = {
  $id: 'https://platform.example/schemas/complete-upload-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['media_id', 'status'],
  properties: {
    media_id: uuidProperty,
    status: {
      type: 'string',
      enum: ['pending_upload', 'available'],
      description:
        'the store assembled the file: pending_upload until the store reports it and the service accepts it, available once it did (a repeated completion)',
    },
  },
} as const;

export type CompleteUploadResponse = FromSchema<typeof completeUploadResponseSchema>;

export const validatePartUrlsRequest = compileValidator<PartUrlsRequest>(partUrlsRequestSchema);
export const validatePartUrlsResponse = compileValidator<PartUrlsResponse>(partUrlsResponseSchema);
export const validateStoredPartsResponse = compileValidator<StoredPartsResponse>(storedPartsResponseSchema);
export const validateCompleteUploadRequest =
  compileValidator<CompleteUploadRequest>(completeUploadRequestSchema);
export const validateCompleteUploadResponse = compileValidator<CompleteUploadResponse>(
  completeUploadResponseSchema,
);
