import type { ProblemDocument } from '@platform/contracts';
import type { ErrorRequestHandler, Response } from 'express';
import type { Logger } from 'winston';
import { COMMON_ERRORS, DomainError, RETRY_AFTER_S } from '../errors.js';
import { hasBody } from './has-body.js';

export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** Base of the `type` URIs; `.example` (RFC 2606) marks them as identifiers, not pages to fetch. */
const PROBLEM_TYPE_BASE = 'https://platform.example/problems/';

interface Classified {
  error: DomainError;
  /** Whether the error is ours to explain (4xx, known 5xx) or an unexpected failure to log in full. */
  expected: boolean;
}

// body-parser (express.json) reports what went wrong in `type`; see body-parser's README "Errors".
const BODY_PARSER_ERRORS: Record<string, (cause: unknown) => DomainError> = {
  'entity.too.large': COMMON_ERRORS.bodyTooLarge,
  'entity.parse.failed': COMMON_ERRORS.malformedJson,
  'encoding.unsupported': COMMON_ERRORS.unsupportedEncoding,
  'charset.unsupported': COMMON_ERRORS.unsupportedCharset,
  'request.aborted': COMMON_ERRORS.bodyIncomplete,
  'request.size.invalid': COMMON_ERRORS.bodyLengthMismatch,
};

function classify(err: unknown): Classified {
  if (err instanceof DomainError)
    return { error: err, expected: err.status < 500 || err.code !== 'internal_error' };
  if (typeof err === 'object' && err !== null) {
    const { type, status } = err as { type?: unknown; status?: unknown };
    const known = typeof type === 'string' ? BODY_PARSER_ERRORS[type] : undefined;
    if (known !== undefined) return { error: known(err), expected: true };
    // Express's router marks a path it cannot percent-decode with status 400.
    if (status === 400 && err instanceof URIError)
      return { error: COMMON_ERRORS.invalidPath(err), expected: true };
    // body-parser inflates gzip, deflate and br bodies; a body that is not what its Content-Encoding says
    // fails inside zlib, and body-parser passes that error on with status 400 but no `type` (seen with
    // body-parser 2.4: code Z_DATA_ERROR, or ERR__ERROR_FORMAT_PADDING_2 for br). The client sent it.
    if (status === 400 && (err as { expose?: unknown }).expose === true)
      return { error: COMMON_ERRORS.bodyUnreadable(err), expected: true };
  }
  return { error: COMMON_ERRORS.unexpected(err), expected: false };
}

/** The problem document (RFC 9457) of `error`. */
export function problemDocument(error: DomainError, requestId: string): ProblemDocument {
  const body: ProblemDocument = {
    type: `${PROBLEM_TYPE_BASE}${error.code}`,
    title: error.title,
    status: error.status,
    detail: error.detail ?? error.title,
    code: error.code,
    request_id: requestId,
  };
  if (error.errors !== undefined && error.errors.length > 0) body.errors = error.errors;
  return body;
}

/** Writes `error` as problem+json, with its headers and the request id. */
export function sendProblem(res: Response, error: DomainError, requestId: string): void {
  const body = problemDocument(error, requestId);

  for (const [name, value] of Object.entries(error.headers ?? {})) res.setHeader(name, value);
  // design §2: every 401 names the scheme; every 503 says when to retry (seconds).
  if (error.status === 401 && !res.hasHeader('WWW-Authenticate')) res.setHeader('WWW-Authenticate', 'Bearer');
  const retryAfterS = error.retryAfterS ?? (error.status === 503 ? RETRY_AFTER_S : undefined);
  if (retryAfterS !== undefined) res.setHeader('Retry-After', String(retryAfterS));
  res.setHeader('Cache-Control', 'no-store');
  // A request answered before its body was read (a 401, 404, 405 or 413 is decided first): node:http would
  // otherwise read and discard the rest of the body to keep the connection, for as long as the client sends,
  // which lets a caller without credentials stream bytes or hold the connection open. Closing it reads no more.
  // A request without a body keeps its connection (node marks it complete only after the 'request' event).
  if (!res.req.complete && hasBody(res.req)) res.setHeader('Connection', 'close');
  // The request log line names the code, so a 4xx needs no log line of its own.
  res.locals.errorCode = error.code;
  res.status(error.status).type(PROBLEM_CONTENT_TYPE).send(JSON.stringify(body));
}

/**
 * The level an answer is logged at (its request line, and the detail line of a known 5xx): a 5xx is a warning,
 * except `not_ready`. That one is a readiness probe's answer while the service cannot serve yet: the kubelet,
 * and `npm start` while it waits for the services, ask again every few seconds (every 200 ms) until it can, so
 * it is a state, not a request that failed someone; the alert on readiness reads the metric. At info, with the
 * detail that says what is not ready.
 */
export function answerLogLevel(status: number, code: unknown): 'info' | 'warn' {
  return status >= 500 && code !== 'not_ready' ? 'warn' : 'info';
}

/**
 * The one place errors become responses. Domain errors keep their status, code, detail, field errors
 * and headers; body-parser failures map to 400/413/415; anything else is a generic 500 whose stack
 * goes to the log (with the request id), never to the client.
 */
export function problemErrorHandler(fallbackLogger: Logger): ErrorRequestHandler {
  return (err: unknown, req, res, _next) => {
    const log = (req.log as Logger | undefined) ?? fallbackLogger;
    const { error, expected } = classify(err);

    if (!expected) {
      log.error('request failed', { err, method: req.method, path: req.path });
    } else if (error.status >= 500) {
      log[answerLogLevel(error.status, error.code)](error.detail ?? error.title, {
        code: error.code,
        cause: error.cause,
      });
    }

    if (res.headersSent) {
      // Part of a success response is already on the wire; the only honest signal left is a cut connection.
      res.destroy();
      return;
    }
    sendProblem(res, error, req.id);
  };
}
