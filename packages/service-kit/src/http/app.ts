import express from 'express';
import type { Express, Request, RequestHandler, Response } from 'express';
import type { Registry } from 'prom-client';
import type { Logger } from 'winston';
import { COMMON_ERRORS } from '../errors.js';
import { UNSTORABLE_TEXT_MESSAGE, unstorableTextPaths } from '../text.js';
import { hasBody } from './has-body.js';
import { problemErrorHandler } from './problem.js';
import { CLIENT_ADDRESS, installRequestContext } from './request-context.js';

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
  /**
   * Path prefixes the trusted proxy never routes (internal webhooks, probes, metrics): requests there come
   * straight from their peer, so their log line names the socket's address, never `X-Forwarded-For`, whatever
   * the path's answer (a route's, a 404, a 405). `RouteDefinition.direct` does the same for one route.
   */
  directPaths?: readonly string[];
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
  const direct = options.directPaths ?? [];
  if (direct.length > 0) {
    app.use((req, res, next) => {
      if (direct.some((prefix) => req.path.startsWith(prefix)))
        res.locals[CLIENT_ADDRESS] = req.socket.remoteAddress;
      next();
    });
  }
  app.response.json = jsonAnswer(app.response.json);
  return app;
}

/**
 * `res.json` with a short path for the answer nearly every route gives: a 2xx or other plain status, no
 * Content-Type chosen, no conditional GET, a value with a JSON text. It writes that text with
 * `application/json; charset=utf-8` and its length; node:http drops the body of a HEAD. Express's own goes
 * through `res.send`, which parses and formats the Content-Type again, looks the charset up in the MIME
 * database and runs its ETag logic on every answer: about a tenth of the gateway's CPU per notify
 * (docs/benchmarks.md). Everything else (a type the route set, `If-None-Match: *` on a GET, 204/205/304,
 * `undefined`) goes to express's own, unchanged. Neither service sets express's JSON settings (`json spaces`,
 * `json replacer`, `json escape`), which the short path would not honour.
 */
function jsonAnswer(expressJson: Response['json']): Response['json'] {
  return function json(this: Response, value: unknown): Response {
    const status = this.statusCode;
    if (
      this.hasHeader('Content-Type') ||
      status === 204 ||
      status === 205 ||
      status === 304 ||
      this.req.fresh
    ) {
      return expressJson.call(this, value);
    }
    const text: string | undefined = JSON.stringify(value);
    if (text === undefined) return expressJson.call(this, value);
    this.setHeader('Content-Type', 'application/json; charset=utf-8');
    this.setHeader('Content-Length', Buffer.byteLength(text));
    this.end(text);
    return this;
  };
}

/**
 * Reads a JSON body, for the routes that take one, after their authentication: a request with a body
 * must declare a JSON type (else 415), at most `limitBytes` after decompression (else 413), parse (else
 * 400 `invalid_json`), and hold only text PostgreSQL can store (else 400 naming each field). Bodiless
 * requests pass with `req.body` undefined.
 */
export function readJsonBody(limitBytes: number = DEFAULT_BODY_LIMIT_BYTES): RequestHandler[] {
  return [
    requireJsonBody,
    refuseDeclaredOversize(limitBytes),
    // body-parser is handed express's request; its types only promise the IncomingMessage underneath.
    express.json({ limit: limitBytes, type: (req) => isJsonRequest(req as Request) }),
    requireStorableText,
  ];
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
  next(COMMON_ERRORS.unstorableText(paths.map((path) => ({ path, message: UNSTORABLE_TEXT_MESSAGE }))));
};

/** Installs the 404 for unknown routes and the problem+json error handler; call after the routes. */
export function finishHttpApp(app: Express, logger: Logger): Express {
  app.use(notFound);
  app.use(problemErrorHandler(logger));
  return app;
}

const notFound: RequestHandler = (_req, _res, next) => {
  next(COMMON_ERRORS.noRoute());
};

/**
 * Whether the request declares a JSON media type, `req.is(JSON_TYPES)`, without parsing the header nearly every
 * client sends, exactly `application/json`. (type-is also counts a `Content-Length: 0` as a body; this answers
 * as it does for those, so the parser reads exactly what it read with `type: JSON_TYPES`.)
 */
function isJsonRequest(req: Request): boolean {
  return req.headers['content-type'] === 'application/json' || Boolean(req.is(JSON_TYPES));
}

/** A request with a body must declare a JSON media type; bodiless requests pass untouched. */
/**
 * A body whose Content-Length already says it is over the limit is refused before any of it is read. body-parser
 * would read and discard all of it first, then answer 413; this answers at once, and sendProblem closes the
 * connection because the body was not read. Only for an identity encoding: a compressed body's limit applies to
 * its inflated size, which body-parser measures.
 */
function refuseDeclaredOversize(limitBytes: number): RequestHandler {
  return (req, _res, next) => {
    const encoding = req.headers['content-encoding'];
    const length = Number(req.headers['content-length']);
    if ((encoding === undefined || encoding === 'identity') && length > limitBytes) {
      next(COMMON_ERRORS.bodyTooLarge(new Error(`declared Content-Length ${length} over ${limitBytes}`)));
      return;
    }
    next();
  };
}

const requireJsonBody: RequestHandler = (req, _res, next) => {
  if (!hasBody(req) || isJsonRequest(req)) {
    next();
    return;
  }
  next(COMMON_ERRORS.notJson());
};
