import { Writable } from 'node:stream';
import { createLogger } from '../src/index.js';
import type { Logger } from '../src/index.js';

export interface CapturedLogs {
  logger: Logger;
  /** Every JSON line written so far, parsed. */
  entries: () => Record<string, unknown>[];
  /** The raw text written so far. */
  text: () => string;
}

/** A real winston logger whose output goes to memory through a stream transport. */
export function captureLogs(service = 'kit-test'): CapturedLogs {
  let written = '';
  const stream = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      written += chunk.toString('utf8');
      callback();
    },
  });
  const logger = createLogger({ service, level: 'debug', stream });
  return {
    logger,
    text: () => written,
    entries: () =>
      written
        .split('\n')
        .filter((line) => line.trim() !== '')
        .map((line) => JSON.parse(line) as Record<string, unknown>),
  };
}
