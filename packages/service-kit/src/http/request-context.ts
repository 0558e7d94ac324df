import { randomUUID } from 'node:crypto';
import { REQUEST_ID_PATTERN as REQUEST_ID_SOURCE } from '@platform/contracts';
import type { Express } from 'express';
import type { Logger } from 'winston';
import './express-augment.js';

/** 1–128 characters of `[A-Za-z0-9._:-]` (contracts): safe in headers and log lines, fits trace ids. */
export const REQUEST_ID_PATTERN = new RegExp(REQUEST_ID_SOURCE);

export const REQUEST_ID_HEADER = 'X-Request-Id';

const childLogger = Symbol('childLogger');

/**
 * Takes a well-formed incoming request id or generates one and echoes it. `req.log` is a child logger whose
 * lines carry `request_id`, made on first use: most requests log nothing at the configured level, and a
 * winston child per request was a measurable share of the gateway's notify cost (docs/benchmarks.md).
 */
export function installRequestContext(app: Express, logger: Logger): void {
  Object.defineProperty(app.request, 'log', {
    configurable: true,
    get(this: Express.Request & { [childLogger]?: Logger }): Logger {
      return (this[childLogger] ??= logger.child({ request_id: this.id }));
    },
    set(this: Express.Request & { [childLogger]?: Logger }, value: Logger) {
      this[childLogger] = value;
    },
  });
  app.use((req, res, next) => {
    const incoming = req.headers['x-request-id'];
    const id = typeof incoming === 'string' && REQUEST_ID_PATTERN.test(incoming) ? incoming : randomUUID();
    req.id = id;
    res.setHeader(REQUEST_ID_HEADER, id);
    next();
  });
}
