import type { Logger } from 'winston';

// What createHttpApp adds to every request; declared globally so handlers in the services see it.
declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace -- Express exposes its extension points only as this global namespace.
  namespace Express {
    interface Request {
      /** The request id: the caller's well-formed `X-Request-Id`, else a generated UUID. */
      id: string;
      /** A child logger whose every line carries `request_id`. */
      log: Logger;
    }
  }
}

export {};
