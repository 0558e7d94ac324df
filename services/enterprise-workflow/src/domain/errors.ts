// Every condition the workflow reports to a client, one named factory each, in one place (after
// supabase/storage's `src/internal/errors/codes.ts`). The code fixes status and title (`errorCatalogue` in
// @platform/contracts); the detail is the sentence a client is shown. The edge's and the database's own
// conditions (bad JSON, 405, 503 of a lost connection …) are service-kit's `COMMON_ERRORS`.
import type { FieldError, WorkItemStatus } from '@platform/contracts';
import { DomainError } from '@platform/service-kit';

export const ERRORS = {
  // 400
  malformedIdempotencyKey: () =>
    new DomainError('invalid_body', 'The Idempotency-Key header must be 1–255 visible ASCII characters.', {
      errors: [{ path: '', message: 'Idempotency-Key header is malformed' }],
    }),
  uploadNotAllowed: (errors: FieldError[]) =>
    new DomainError('invalid_body', 'The upload is not allowed.', { errors }),
  linkNotFound: (fields: readonly string[]) =>
    new DomainError('invalid_body', 'A linked record does not exist at this site.', {
      errors: fields.map((field) => ({ path: `/${field}`, message: 'no such record at this site' })),
    }),
  noSuchPart: (errors: FieldError[]) => new DomainError('invalid_body', 'No such part.', { errors }),
  partsNotNamed: (partCount: number) =>
    new DomainError('invalid_body', `The upload has ${partCount} parts; name each once.`, {
      errors: [{ path: '/parts', message: `must name parts 1 to ${partCount}, each once` }],
    }),
  invalidDecision: (errors: FieldError[]) =>
    new DomainError('invalid_body', 'The decision is not valid.', { errors }),

  // 401, 403 (WWW-Authenticate: design §4.1, RFC 6750)
  tokenRequired: (headers: Record<string, string>) =>
    new DomainError('unauthorized', 'A bearer token is required.', { headers }),
  invalidToken: (detail: string, headers: Record<string, string>) =>
    new DomainError('unauthorized', detail, { headers }),
  webhookTokenRequired: (headers: Record<string, string>) =>
    new DomainError('unauthorized', 'A valid webhook bearer token is required.', { headers }),
  portalRoleMissing: (detail: string) => new DomainError('forbidden', detail),

  // 404: unknown, or outside the caller's sites (design §2: never say which)
  siteNotFound: () => new DomainError('not_found', 'No such site.'),
  mediaNotFound: () => new DomainError('not_found', 'No such media item.'),
  workItemNotFound: () => new DomainError('not_found', 'No such work item.'),

  // 409
  idempotencyKeyReused: () =>
    new DomainError(
      'idempotency_key_reused',
      'This Idempotency-Key was already used for a different request.',
    ),
  workItemFinal: (current: WorkItemStatus, wanted: WorkItemStatus) =>
    new DomainError(
      'work_item_final',
      `The work item is already ${current}; it cannot be changed to ${wanted}.`,
    ),
  mediaPending: () => new DomainError('media_pending', 'The file has not been uploaded yet.'),
  mediaRejected: (reason: string | null) =>
    new DomainError(
      'media_rejected',
      reason === null
        ? 'The uploaded file was rejected; upload it again with a new intent.'
        : `The uploaded file was rejected: ${reason}. Upload it again with a new intent.`,
    ),
  uploadNotPending: (status?: string) =>
    new DomainError(
      'upload_not_pending',
      status === undefined
        ? 'The upload is no longer pending.'
        : `The upload is ${status}, no longer pending.`,
    ),
  uploadExpired: () => new DomainError('upload_expired', 'The upload intent expired; create a new one.'),
  uploadGone: () => new DomainError('upload_gone', 'The upload no longer exists in the store.'),
  uploadAssembled: () =>
    new DomainError('upload_assembled', 'The upload was already assembled; it can no longer be aborted.'),
  tooManyOpenUploads: (scope: 'user' | 'site', limit: number) =>
    new DomainError(
      'too_many_open_uploads',
      scope === 'user'
        ? `You have ${limit} uploads in parts open, the most one user may have; complete or abort one, or wait until one expires.`
        : `This site has ${limit} uploads in parts open, the most one site may have; complete or abort one, or wait until one expires.`,
    ),
  partsMismatch: (problems: readonly string[]) =>
    new DomainError(
      'parts_mismatch',
      `The stored parts do not make the declared file: ${problems.join('; ')}.`,
    ),

  // 503 (the edge adds Retry-After)
  notReady: (failed: readonly string[]) =>
    new DomainError('not_ready', `Not ready: ${failed.join(', ')} unavailable.`),
  signingKeysUnavailable: (detail: string, cause: unknown) =>
    new DomainError('backend_unavailable', detail, { cause }),
  storeRefused: (cause: unknown) =>
    new DomainError('backend_unavailable', 'The object store refused a request; retry later.', { cause }),
  storeUnreachable: (cause: unknown) =>
    new DomainError('backend_unavailable', 'The object store is unreachable; retry later.', { cause }),
  storeGaveNoEtag: () =>
    new DomainError('backend_unavailable', 'The object store gave no ETag; retry later.'),
  uploadNotStarted: () =>
    new DomainError('backend_unavailable', 'The upload could not be started; retry later.'),
  intentStillStarting: () =>
    new DomainError(
      'backend_unavailable',
      'The first request with this Idempotency-Key is still starting the upload; retry later.',
      { retryAfterS: 1 },
    ),
} as const;
