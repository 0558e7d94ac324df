import { randomUUID } from 'node:crypto';
import { REQUEST_ID_PATTERN as REQUEST_ID_SOURCE } from '@platform/contracts';
import type { Express, Request, Response } from 'express';
import type { Registry } from 'prom-client';
import type { Logger } from 'winston';
import { httpMetrics } from '../prometheus.js';
import { answerLogLevel } from './problem.js';
import './express-augment.js';

/** 1–128 characters of `[A-Za-z0-9._:-]` (contracts): safe in headers and log lines, fits trace ids. */
export const REQUEST_ID_PATTERN = new RegExp(REQUEST_ID_SOURCE);

export const REQUEST_ID_HEADER = 'X-Request-Id';

/**
 * `res.locals` key of the client address the request log names when a route knows it better than `req.ip`
 * (a route reached without the trusted proxy: `RouteDefinition.direct`).
 */
export const CLIENT_ADDRESS = 'clientAddress';

const childLogger = Symbol('childLogger');
const startedAt = Symbol('startedAt');

type RequestWithLogger = Express.Request & { [childLogger]?: Logger };

/**
 * The first middleware of every request, one layer for all it does: takes a well-formed incoming request id or
 * generates one and echoes it; makes `req.log` (a child logger whose lines carry `request_id`) available; and
 * when the response ends, writes the request's one log line and its metrics. The child logger is made on first
 * use, and the log line's level is checked before anything is formatted: most requests log nothing at the
 * configured level, and that path must cost nothing (docs/benchmarks.md, the notify path).
 */
export function installRequestContext(app: Express, logger: Logger, registry?: Registry): void {
  Object.defineProperty(app.request, 'log', {
    configurable: true,
    get(this: RequestWithLogger): Logger {
      return (this[childLogger] ??= logger.child({ request_id: this.id }));
    },
    set(this: RequestWithLogger, value: Logger) {
      this[childLogger] = value;
    },
  });
  const metrics = registry === undefined ? undefined : httpMetrics(registry);
  const enabled = levelGate(logger);
  // One listener for every response of the app (no closure per request): 'close' comes after 'finish' on a
  // completed response, and alone when the client went away first; either way once.
  function recordResponse(this: Response & { [startedAt]?: number }): void {
    const req = this.req;
    const seconds = (performance.now() - (this[startedAt] ?? 0)) / 1000;
    const route = routeLabel(req, this);
    const status = this.statusCode;
    if (metrics !== undefined) {
      const labels = {
        method: STANDARD_METHODS.has(req.method) ? req.method : 'OTHER',
        route,
        status: String(status),
      };
      metrics.requests.inc(labels);
      metrics.duration.observe(labels, seconds);
    }
    const level = answerLogLevel(status, this.locals.errorCode);
    if (!enabled(level)) return;
    req.log[level]('http request', {
      method: req.method,
      route,
      path: req.path,
      status,
      duration_ms: Math.round(seconds * 1e6) / 1e3,
      ip: (this.locals[CLIENT_ADDRESS] as string | undefined) ?? req.ip,
      ...(typeof this.locals.errorCode === 'string' ? { code: this.locals.errorCode } : {}),
      ...(this.writableFinished ? {} : { aborted: true }),
    });
  }
  app.use((req, res: Response & { [startedAt]?: number }, next) => {
    res[startedAt] = performance.now();
    const incoming = req.headers['x-request-id'];
    const id = typeof incoming === 'string' && REQUEST_ID_PATTERN.test(incoming) ? incoming : randomUUID();
    req.id = id;
    res.setHeader(REQUEST_ID_HEADER, id);
    res.on('close', recordResponse);
    next();
  });
}

/**
 * `logger.isLevelEnabled(level)`, asked again only when the logger's level changes: winston's builds an array
 * of its transports on every call, on every request. Transports (and their own levels) are fixed when
 * `createLogger` makes the logger; one added later would not be seen here.
 */
function levelGate(logger: Logger): (level: 'info' | 'warn') => boolean {
  let at: string | undefined;
  let info = false;
  let warn = false;
  return (level) => {
    if (logger.level !== at) {
      at = logger.level;
      info = logger.isLevelEnabled('info');
      warn = logger.isLevelEnabled('warn');
    }
    return level === 'info' ? info : warn;
  };
}

/** The matched route pattern (`/sites/:site_id/...`), never the raw URL, so labels stay bounded. */
function routeLabel(req: Request, res: Response): string {
  const tagged = res.locals.route as string | undefined;
  if (tagged !== undefined) return tagged;
  const path = (req.route as { path?: unknown } | undefined)?.path;
  if (typeof path === 'string' || path instanceof RegExp) return `${req.baseUrl}${path.toString()}`;
  return 'unmatched';
}

const STANDARD_METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS']);
