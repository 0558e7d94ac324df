import { randomUUID } from 'node:crypto';
import { REQUEST_ID_PATTERN as REQUEST_ID_SOURCE } from '@platform/contracts';
import type { RequestHandler } from 'express';
import type { Logger } from 'winston';
import './express-augment.js';

/** 1–128 characters of `[A-Za-z0-9._:-]` (contracts): safe in headers and log lines, fits trace ids. */
export const REQUEST_ID_PATTERN = new RegExp(REQUEST_ID_SOURCE);

export const REQUEST_ID_HEADER = 'X-Request-Id';

/** Takes a well-formed incoming request id or generates one; echoes it and binds a child logger. */
export function requestContext(logger: Logger): RequestHandler {
  return (req, res, next) => {
    const incoming = req.get(REQUEST_ID_HEADER);
    const id = incoming !== undefined && REQUEST_ID_PATTERN.test(incoming) ? incoming : randomUUID();
    req.id = id;
    res.setHeader(REQUEST_ID_HEADER, id);
    req.log = logger.child({ request_id: id });
    next();
  };
}
