import express from 'express';
import type { Express, Request, RequestHandler, Response } from 'express';
import type { Registry } from 'prom-client';
import type { Logger } from 'winston';
import { DomainError } from '../errors.js';
import { UNSTORABLE_TEXT_MESSAGE, unstorableTextPaths } from '../text.js';
import { problemErrorHandler } from './problem.js';
import { installRequestContext } from './request-context.js';

/** design §3.1: JSON bodies over 64 KiB are refused with 413. */
export const DEFAULT_BODY_LIMIT_BYTES = 64 * 1024;

/** Media types accepted as JSON bodies: `application/json` and any `+json` suffix type. */
const JSON_TYPES = ['application/json', '+json'];

export interface HttpAppOptions {
  logger: Logger;
  /**
   * Proxy hops to trust for the client address (`X-Forwarded-For`). `true` means exactly one hop
   * (the Ingress, design §5), never "trust everyone"; default none.
   */
  trustProxy?: boolean | number;
  /** Record `http_requests_total` and `http_request_duration_seconds` on this registry. */
  metrics?: Registry;
}

/**
 * An express app with request ids and one log line (and metrics) per request. It reads no body: each
 * route reads its own, after its authentication (see `addRoutes` and `readJsonBody`). Add routes, then
 * call `finishHttpApp` to install the 404 and the error handler.
 */
export function createHttpApp(options: HttpAppOptions): Express {
  const app = express();
  app.disable('x-powered-by');
  // Express hashes every response body for a weak ETag; no route here serves conditional GETs, and the
  // hash costs CPU on every answer (measured in the benchmarks' profiles).
  app.set('etag', false);
  const hops = options.trustProxy === true ? 1 : options.trustProxy === false ? 0 : (options.trustProxy ?? 0);
  app.set('trust proxy', hops);

  installRequestContext(app, options.logger, options.metrics);
  app.response.json = sendJson;
  return app;
}

/**
 * `res.json` for these services: JSON text with `application/json; charset=utf-8` (unless the route chose a
 * type) and its length, and nothing else. Express's own goes through `res.send`, which parses and re-formats
 * the Content-Type, looks the charset up in the MIME database and considers ETags (disabled here) on every
 * answer: about a tenth of the gateway's CPU per notify (docs/benchmarks.md). No JSON setting of express
 * (`json spaces`, `json replacer`, `json escape`) is used by either service. Bodies of HEAD requests are
 * dropped by node:http itself; 204 and 304 carry none (RFC 9110 §15.3.5, §15.4.5).
 */
function sendJson(this: Response, value: unknown): Response {
  if (this.statusCode === 204 || this.statusCode === 304) {
    this.removeHeader('Content-Type');
    this.removeHeader('Content-Length');
    this.end();
    return this;
  }
  const text = JSON.stringify(value) ?? '';
  if (!this.hasHeader('Content-Type')) this.setHeader('Content-Type', 'application/json; charset=utf-8');
  this.setHeader('Content-Length', Buffer.byteLength(text));
  this.end(text);
  return this;
}

/**
 * Reads a JSON body, for the routes that take one, after their authentication: a request with a body
 * must declare a JSON type (else 415), at most `limitBytes` after decompression (else 413), parse (else
 * 400 `invalid_json`), and hold only text PostgreSQL can store (else 400 naming each field). Bodiless
 * requests pass with `req.body` undefined.
 */
export function readJsonBody(limitBytes: number = DEFAULT_BODY_LIMIT_BYTES): RequestHandler[] {
  // requireJsonBody has checked the media type of any request with a body: the parser need not parse the
  // Content-Type header a second time (it still skips bodiless requests itself).
  return [requireJsonBody, express.json({ limit: limitBytes, type: parseCheckedBody }), requireStorableText];
}

/**
 * Every string of a JSON body (keys included) must be text PostgreSQL can store, checked once here for every
 * route of both services: a NUL or an unpaired surrogate is a 400 naming the field's JSON Pointer, never a
 * 500 from deep inside a transaction.
 */
const requireStorableText: RequestHandler = (req, _res, next) => {
  const paths = req.body === undefined ? [] : unstorableTextPaths(req.body);
  if (paths.length === 0) {
    next();
    return;
  }
  next(
    new DomainError('invalid_body', 'The request body contains text that cannot be stored.', {
      errors: paths.map((path) => ({ path, message: UNSTORABLE_TEXT_MESSAGE })),
    }),
  );
};

/** Installs the 404 for unknown routes and the problem+json error handler; call after the routes. */
export function finishHttpApp(app: Express, logger: Logger): Express {
  app.use(notFound);
  app.use(problemErrorHandler(logger));
  return app;
}

const notFound: RequestHandler = (_req, _res, next) => {
  next(new DomainError('not_found', 'No resource matches this path.'));
};

const parseCheckedBody = (): boolean => true;

/**
 * A request with a body must declare a JSON media type; bodiless requests pass untouched. The header nearly
 * every client sends, exactly `application/json`, is accepted without parsing it.
 */
const requireJsonBody: RequestHandler = (req, _res, next) => {
  if (!hasBody(req) || req.headers['content-type'] === 'application/json' || req.is(JSON_TYPES) !== false) {
    next();
    return;
  }
  next(new DomainError('unsupported_media_type', 'The request body must be application/json.'));
};

function hasBody(req: Request): boolean {
  if (req.headers['transfer-encoding'] !== undefined) return true;
  const length = Number(req.headers['content-length'] ?? 0);
  return Number.isFinite(length) && length > 0;
}
