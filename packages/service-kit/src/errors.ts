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
 * The validated value, or a thrown `DomainError` (default `invalid_body`, 400) listing every failure.
 * Pairs with the contracts validators: `const body = requireValid(validateDecisionRequest(req.body))`.
 */
export function requireValid<T>(result: Validation<T>, code: ErrorCode = 'invalid_body', detail?: string): T {
  if (result.ok) return result.value;
  throw new DomainError(code, detail ?? 'The request body does not match the schema.', {
    errors: result.errors,
  });
}
