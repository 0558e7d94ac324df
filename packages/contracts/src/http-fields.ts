// Schemas of the workflow's HTTP surface that are not bodies: path ids, the Idempotency-Key header (design
// §4.5) and the operations endpoints' answers. Written once here; the workflow's routes validate with them and
// its OpenAPI document is generated from them.
import { UUID_PATTERN } from './media-schemas.js';

/** A path id (site, media item, work item). One that is not a UUID names nothing: 404, like an unknown one. */
export const uuidPathSchema = {
  $id: 'https://platform.example/schemas/uuid-path.json',
  type: 'string',
  format: 'uuid',
  pattern: UUID_PATTERN,
} as const;

/**
 * `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header): 1–255 visible ASCII characters but `"`, bare
 * or quoted; the capture group is the key.
 */
export const IDEMPOTENCY_KEY_PATTERN = '^"?([\\x21\\x23-\\x7e]{1,255})"?$';

export const idempotencyKeySchema = {
  $id: 'https://platform.example/schemas/idempotency-key.json',
  type: 'string',
  pattern: IDEMPOTENCY_KEY_PATTERN,
  maxLength: 257,
} as const;

/** GET /health: the process answers. */
export const healthResponseSchema = {
  $id: 'https://platform.example/schemas/health-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['status'],
  properties: { status: { type: 'string', const: 'ok' } },
} as const;

/** GET /ready, 200: every dependency answers. */
export const readyResponseSchema = {
  $id: 'https://platform.example/schemas/ready-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['status', 'checks'],
  properties: {
    status: { type: 'string', const: 'ready' },
    checks: {
      type: 'object',
      additionalProperties: false,
      required: ['database', 'signing_keys'],
      properties: {
        database: { type: 'string', const: 'ok' },
        signing_keys: { type: 'string', const: 'ok' },
      },
    },
  },
} as const;
