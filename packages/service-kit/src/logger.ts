import winston from 'winston';
import type { Logger } from 'winston';
import { isSensitiveKey, REDACTED, redactValue } from './redact.js';

export type { Logger } from 'winston';

/** Winston's npm levels, most to least severe; use as the `enum` of a `LOG_LEVEL` config schema. */
export const LOG_LEVELS = ['error', 'warn', 'info', 'http', 'verbose', 'debug', 'silly'] as const;

export type LogLevel = (typeof LOG_LEVELS)[number];

export interface LoggerOptions {
  /** Written as `service` on every line. */
  service: string;
  /** Minimum level; defaults to `info`. */
  level?: LogLevel;
  /** Write JSON lines here instead of stdout (tests capture output this way). */
  stream?: NodeJS.WritableStream;
  /** Extra transports (in addition to the stream or stdout one). */
  transports?: winston.transport[];
}

// Winston keeps its bookkeeping (level, formatted message, splat) under Symbol keys; string keys are
// the caller's fields. Scrub the latter in place so the later `json` format serialises clean values.
const redactFormat = winston.format((info) => {
  for (const key of Object.keys(info)) {
    if (key === 'level') continue;
    const value = info[key];
    info[key] = isSensitiveKey(key) ? REDACTED : redactValue(value);
  }
  return info;
});

/**
 * A JSON-lines logger: `{ timestamp, level, service, message, request_id?, ... }`, with secrets
 * redacted at any depth (see redact.ts). Use `logger.child({ request_id })` for per-request lines.
 */
export function createLogger(options: LoggerOptions): Logger {
  const transports: winston.transport[] = [
    options.stream === undefined
      ? new winston.transports.Console()
      : new winston.transports.Stream({ stream: options.stream }),
    ...(options.transports ?? []),
  ];
  return winston.createLogger({
    level: options.level ?? 'info',
    defaultMeta: { service: options.service },
    format: winston.format.combine(winston.format.timestamp(), redactFormat(), winston.format.json()),
    transports,
  });
}
