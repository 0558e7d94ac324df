// The HTTP listener both services run behind (design §6): node:http with deadlines on reading a request, and
// problem+json for what node:http refuses before any route runs.
import { randomUUID } from 'node:crypto';
import { STATUS_CODES, createServer, type RequestListener, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ErrorCode } from '@platform/contracts';
import type { Logger } from 'winston';
import { DomainError } from '../errors.js';
import { PROBLEM_CONTENT_TYPE, problemDocument } from './problem.js';

/** A request's headers must arrive within this (node's default: 60 s). */
export const HTTP_HEADERS_TIMEOUT_MS = 10_000;
/** All of a request must arrive within this (node's default: 300 s). */
export const HTTP_REQUEST_TIMEOUT_MS = 30_000;

/**
 * node:http's client errors (the `code` of the 'clientError' event's error) and what they are called here; any
 * other is an HTTP/1.1 parse error (llhttp's HPE_* codes), `malformed_request`. Node answers the same three
 * statuses by default (lib/_http_server.js socketOnError), as bare status lines.
 */
const CLIENT_ERRORS: Readonly<Record<string, ErrorCode>> = {
  HPE_HEADER_OVERFLOW: 'headers_too_large',
  HPE_CHUNK_EXTENSIONS_OVERFLOW: 'payload_too_large',
  ERR_HTTP_REQUEST_TIMEOUT: 'request_timeout',
};

/**
 * Answers a request node:http refused before any route ran, as problem+json with a request id of its own (the
 * request was never read, so it has none), and destroys the connection, as node's default does: `end()` would
 * only half-close it, and node's server sockets allow half-open connections, so the parser would go on reading
 * what the client sends next (a cold review had the rest of a request that got 408 routed and run, and sockets
 * kept open for as long as the client liked). Nothing is answered on a socket that cannot take it, or whose
 * current response has started (a 408 for a body still arriving while the handler already answers).
 */
function answerClientError(err: Error & { code?: string }, socket: Duplex, logger: Logger | undefined): void {
  const response = (socket as { _httpMessage?: { headersSent?: boolean } })._httpMessage;
  if (err.code === 'ECONNRESET' || !socket.writable || response?.headersSent === true) {
    socket.destroy();
    return;
  }
  const error = new DomainError(CLIENT_ERRORS[err.code ?? ''] ?? 'malformed_request');
  const requestId = randomUUID();
  const body = JSON.stringify(problemDocument(error, requestId));
  socket.write(
    `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status] ?? ''}\r\n` +
      `Content-Type: ${PROBLEM_CONTENT_TYPE}\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n` +
      'Cache-Control: no-store\r\n' +
      'Connection: close\r\n\r\n' +
      body,
  );
  socket.destroy();
  // As a request log line would (no path: none was read); node's message can quote the client's bytes.
  logger?.info('http client error', {
    request_id: requestId,
    status: error.status,
    code: error.code,
    reason: err.code,
  });
}

/**
 * Listens on `port` (and `host`; without it node's default, every interface) with deadlines on reading a
 * request: its headers within 10 s, all of it within 30 s, else 408 and the connection closed. Both APIs take
 * bodies of a few kilobytes (uploads go to object storage, never through a service), so a client slower than
 * that only holds a socket. Node enforces both deadlines when it checks its connections, every
 * `connectionsCheckingInterval` (30 s by default, settable only when the server is created), so that is 1 s
 * here: a deadline is then at most a second late. What node refuses before a route runs (the deadlines, bytes
 * that are not HTTP/1.1, headers over 16 KiB) is answered as problem+json (400, 408, 413, 431) and logged to
 * `logger` with a request id. Resolves once listening; rejects on a listen error.
 */
export async function listenHttp(
  handler: RequestListener,
  port: number,
  host?: string,
  logger?: Logger,
): Promise<Server> {
  const server = createServer(
    {
      headersTimeout: HTTP_HEADERS_TIMEOUT_MS,
      requestTimeout: HTTP_REQUEST_TIMEOUT_MS,
      connectionsCheckingInterval: 1000,
    },
    handler,
  );
  server.on('clientError', (err: Error & { code?: string }, socket: Duplex) =>
    answerClientError(err, socket, logger),
  );
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    if (host === undefined) server.listen(port, () => resolve());
    else server.listen(port, host, () => resolve());
  });
  return server;
}
