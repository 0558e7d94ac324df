// The error-code catalogue (design §2) and the problem+json body (RFC 9457) both services answer with.
import type { FromSchema } from 'json-schema-to-ts';
import { compileValidator } from './validation.js';

/** Every stable machine-readable `code` a problem document may carry. */
export const errorCodes = [
  'malformed_request',
  'invalid_json',
  'invalid_body',
  'invalid_query',
  'settings_too_large',
  'unauthorized',
  'forbidden',
  'not_found',
  'unknown_device',
  'unknown_rollout',
  'unknown_site',
  'method_not_allowed',
  'conflict',
  'rollout_conflict',
  'concurrent_change',
  'idempotency_key_reused',
  'work_item_final',
  'media_pending',
  'media_rejected',
  'upload_not_pending',
  'upload_expired',
  'upload_gone',
  'upload_assembled',
  'parts_mismatch',
  'too_many_open_uploads',
  'request_timeout',
  'payload_too_large',
  'unsupported_media_type',
  'headers_too_large',
  'internal_error',
  'backend_unavailable',
  'not_ready',
] as const;

export type ErrorCode = (typeof errorCodes)[number];

/** HTTP status and a short human title (the problem's `title`) of every error code. */
export const errorCatalogue = {
  // 400: bytes node:http cannot parse as an HTTP/1.1 request (answered before any route runs, design §6).
  malformed_request: { status: 400, title: 'Malformed HTTP request' },
  // 400: the body is not JSON at all.
  invalid_json: { status: 400, title: 'Malformed JSON' },
  // 400: JSON that breaks the endpoint's schema; `errors` lists the offending fields.
  invalid_body: { status: 400, title: 'Invalid request body' },
  // 400: query parameters that break the endpoint's rules; `errors` lists them (`path`: /query/<name>).
  invalid_query: { status: 400, title: 'Invalid query parameters' },
  // 400: Device Settings whose Observe notification would not fit one CoAP datagram (design §3.3).
  settings_too_large: { status: 400, title: 'Settings too large for one CoAP notification' },
  // 401: missing or invalid credentials; the response carries WWW-Authenticate.
  unauthorized: { status: 401, title: 'Unauthorized' },
  // 403: valid credentials without the required role.
  forbidden: { status: 403, title: 'Forbidden' },
  // 404: unknown resource, or one outside the caller's sites (never reveal that it exists).
  not_found: { status: 404, title: 'Not found' },
  unknown_device: { status: 404, title: 'Unknown device' },
  unknown_rollout: { status: 404, title: 'Unknown rollout' },
  // 404: a site the platform does not know, or one outside the caller's scope: the two read the same, so an answer
  // never tells a caller that another tenant's site exists (the fleet list's site_id, design §3.2).
  unknown_site: { status: 404, title: 'Unknown site' },
  // 405: known path, other method; the response carries Allow.
  method_not_allowed: { status: 405, title: 'Method not allowed' },
  // 409: the request conflicts with a stored record (a unique or exclusion constraint); retrying it the same
  // way fails the same way.
  conflict: { status: 409, title: 'Conflict' },
  // 409: a rollout that overlaps an open one, or an action its state does not allow (design §3.9).
  rollout_conflict: { status: 409, title: 'Rollout conflict' },
  // 409: the request collided with a concurrent change (serialization failure, deadlock, a held lock): retry it.
  concurrent_change: { status: 409, title: 'Concurrent change' },
  // 409: an Idempotency-Key already used by the caller for a different request (design §4.5): use a new key.
  idempotency_key_reused: { status: 409, title: 'Idempotency-Key reused' },
  // 409: a different decision on an accepted or declined work item, which is final (design §4.4).
  work_item_final: { status: 409, title: 'Work item already decided' },
  // 409: a media item whose object has not arrived in storage yet.
  media_pending: { status: 409, title: 'Media upload not completed' },
  // 409: the uploaded object broke its intent (size or type) and was refused; the detail says how. Final: upload
  // the file again with a new intent.
  media_rejected: { status: 409, title: 'Media upload rejected' },
  // 409: an upload in parts that is no longer pending (available, rejected or abandoned).
  upload_not_pending: { status: 409, title: 'Upload no longer pending' },
  // 409: an upload in parts whose intent expired: create a new intent.
  upload_expired: { status: 409, title: 'Upload intent expired' },
  // 409: the store no longer holds the upload in parts (aborted, or assembled and accepted meanwhile).
  upload_gone: { status: 409, title: 'Upload gone from the store' },
  // 409: the store has assembled the upload in parts, so it can no longer be aborted; its item becomes available.
  upload_assembled: { status: 409, title: 'Upload already assembled' },
  // 409: the stored parts do not make the declared file (missing, another ETag or length): list them, resend.
  parts_mismatch: { status: 409, title: 'Stored parts do not match' },
  // 409: the caller, or the site, has as many uploads in parts open as it may (design §4.4): complete or abort
  // one first.
  too_many_open_uploads: { status: 409, title: 'Too many open uploads' },
  // 408: the request's headers or the whole request did not arrive within the read deadlines (design §6).
  request_timeout: { status: 408, title: 'Request timeout' },
  payload_too_large: { status: 413, title: 'Payload too large' },
  unsupported_media_type: { status: 415, title: 'Unsupported media type' },
  // 431: more header bytes than node:http reads (16 KiB by default).
  headers_too_large: { status: 431, title: 'Request header fields too large' },
  // 500: anything unexpected; details only in the log.
  internal_error: { status: 500, title: 'Internal server error' },
  // 503: a dependency (database, object storage) is unreachable; the response carries Retry-After.
  backend_unavailable: { status: 503, title: 'Backend unavailable' },
  // 503: readiness probe while the service cannot serve yet.
  not_ready: { status: 503, title: 'Not ready' },
} as const satisfies Record<ErrorCode, { status: number; title: string }>;

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.hasOwn(errorCatalogue, value);
}

/** Request ids accepted from `X-Request-Id` and echoed in problem documents (generated ones are UUIDs). */
export const REQUEST_ID_PATTERN = '^[A-Za-z0-9._:-]{1,128}$';

export const fieldErrorSchema = {
  $id: 'https://platform.example/schemas/field-error.json',
  type: 'object',
  additionalProperties: false,
  required: ['path', 'message'],
  properties: {
    path: { type: 'string', format: 'json-pointer', description: 'JSON Pointer into the request body' },
    message: { type: 'string', minLength: 1 },
  },
} as const;

export const problemDocumentSchema = {
  $id: 'https://platform.example/schemas/problem-document.json',
  description: 'RFC 9457 problem details, served as application/problem+json',
  type: 'object',
  additionalProperties: false,
  required: ['type', 'title', 'status', 'detail', 'code', 'request_id'],
  properties: {
    type: { type: 'string', format: 'uri-reference' },
    title: { type: 'string', minLength: 1 },
    status: { type: 'integer', minimum: 400, maximum: 599 },
    detail: { type: 'string' },
    code: { type: 'string', enum: errorCodes },
    request_id: {
      type: 'string',
      pattern: REQUEST_ID_PATTERN,
      patternMessage: 'must be 1-128 characters of A-Z, a-z, 0-9, ".", "_", ":", "-"',
    },
    errors: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['path', 'message'],
        properties: fieldErrorSchema.properties,
      },
    },
  },
} as const;

export type ProblemDocument = FromSchema<typeof problemDocumentSchema>;

export const validateProblemDocument = compileValidator<ProblemDocument>(problemDocumentSchema);
