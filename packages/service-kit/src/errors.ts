import { errorCatalogue } from '@platform/contracts';
import type { ErrorCode, FieldError, Validation } from '@platform/contracts';

/** The message of anything thrown, for logs: an Error's `message`, else its string form. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** design §2: the `Retry-After` (seconds) of a 503 that does not name its own. */
export const RETRY_AFTER_S = 5;

export interface DomainErrorOptions {
  /** Field-level failures (JSON Pointer paths), shown as `errors` in the problem document. */
  errors?: FieldError[];
  /** Response headers the error needs, e.g. `WWW-Authenticate`, `Allow`. */
  headers?: Record<string, string>;
  /**
   * Seconds the caller should wait before retrying (HTTP `Retry-After`). The HTTP edge sends it; a 503
   * without one gets `RETRY_AFTER_S`. The one place a retry hint is chosen is the error that needs it.
   */
  retryAfterS?: number;
  cause?: unknown;
}

/**
 * A failure the caller can be told about. Transport-free: `code` comes from the contracts catalogue,
 * which also fixes `status` and `title`; the HTTP edge turns it into problem+json and the CoAP edge
 * into a response code. `detail` must be safe to show to the client.
 */
export class DomainError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly title: string;
  readonly detail?: string;
  readonly errors?: FieldError[];
  readonly headers?: Record<string, string>;
  readonly retryAfterS?: number;

  constructor(code: ErrorCode, detail?: string, options: DomainErrorOptions = {}) {
    const entry = errorCatalogue[code];
    super(detail ?? entry.title, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'DomainError';
    this.code = code;
    this.status = entry.status;
    this.title = entry.title;
    if (detail !== undefined) this.detail = detail;
    if (options.errors !== undefined) this.errors = options.errors;
    if (options.headers !== undefined) this.headers = options.headers;
    if (options.retryAfterS !== undefined) this.retryAfterS = options.retryAfterS;
  }
}

/**
 * The conditions service-kit itself reports, one named factory each (after supabase/storage's
 * `src/internal/errors/codes.ts`): the edge's (path, method, body) and the database's (design §2, the table of
 * `mapDbError`). A service's own conditions live in its own catalogue (the workflow's `domain/errors.ts`);
 * codes, statuses and titles in `@platform/contracts`' `errorCatalogue`.
 */
export const COMMON_ERRORS = {
  /** A body that breaks the route's schema (`code` `invalid_query` for query parameters). */
  schemaMismatch: (errors: FieldError[], code: ErrorCode = 'invalid_body', detail?: string) =>
    new DomainError(code, detail ?? 'The request body does not match the schema.', { errors }),
  unstorableText: (errors: FieldError[]) =>
    new DomainError('invalid_body', 'The request body contains text that cannot be stored.', { errors }),
  bodyIncomplete: (cause: unknown) =>
    new DomainError('invalid_body', 'The request body was not received completely.', { cause }),
  bodyLengthMismatch: (cause: unknown) =>
    new DomainError('invalid_body', 'The request body length does not match its Content-Length.', { cause }),
  bodyUnreadable: (cause: unknown) =>
    new DomainError(
      'invalid_body',
      'The request body could not be read as sent (is its Content-Encoding right?).',
      { cause },
    ),
  malformedJson: (cause: unknown) =>
    new DomainError('invalid_json', 'The request body is not valid JSON.', { cause }),
  bodyTooLarge: (cause: unknown) =>
    new DomainError('payload_too_large', 'The request body is larger than allowed.', { cause }),
  notJson: () => new DomainError('unsupported_media_type', 'The request body must be application/json.'),
  unsupportedEncoding: (cause: unknown) =>
    new DomainError('unsupported_media_type', 'The request body uses an unsupported Content-Encoding.', {
      cause,
    }),
  unsupportedCharset: (cause: unknown) =>
    new DomainError('unsupported_media_type', 'The request body uses an unsupported charset; send UTF-8.', {
      cause,
    }),
  noRoute: () => new DomainError('not_found', 'No resource matches this path.'),
  invalidPath: (cause: unknown) => new DomainError('not_found', 'The request path is not valid.', { cause }),
  methodNotAllowed: (method: string, allow: string) =>
    new DomainError('method_not_allowed', `${method} is not allowed on this resource.`, {
      headers: { Allow: allow },
    }),
  unexpected: (cause: unknown) =>
    new DomainError('internal_error', 'An unexpected error occurred.', { cause }),
  databaseTimedOut: (cause: unknown) =>
    new DomainError('backend_unavailable', 'The database did not answer in time; retry later.', { cause }),
  databaseUnreachable: (cause: unknown) =>
    new DomainError('backend_unavailable', 'The database is unreachable; retry later.', { cause }),
  databaseBusy: (cause: unknown) =>
    new DomainError('backend_unavailable', 'The database cannot serve this request now; retry later.', {
      cause,
    }),
  alreadyExists: (cause: unknown) =>
    new DomainError('conflict', 'The resource already exists or conflicts with an existing one.', { cause }),
  concurrentChange: (cause: unknown) =>
    new DomainError('concurrent_change', 'The request collided with a concurrent change; retry it.', {
      cause,
    }),
  locked: (cause: unknown) =>
    new DomainError('concurrent_change', 'The resource is locked by another request; retry it.', { cause }),
} as const;

/**
 * The validated value, or a thrown `DomainError` (default `invalid_body`, 400) listing every failure.
 * Pairs with the contracts validators: `const body = requireValid(validateDecisionRequest(req.body))`.
 */
export function requireValid<T>(result: Validation<T>, code: ErrorCode = 'invalid_body', detail?: string): T {
  if (result.ok) return result.value;
  throw COMMON_ERRORS.schemaMismatch(result.errors, code, detail);
}
