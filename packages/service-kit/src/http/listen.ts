// The HTTP listener both services run behind (design §6): node:http with deadlines on reading a request, and
// problem+json for what node:http refuses before any route runs.
import { randomUUID } from 'node:crypto';
import {
  STATUS_CODES,
  createServer,
  type IncomingMessage,
  type RequestListener,
  type Server,
  type ServerResponse,
} from 'node:http';
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

/** How long a refused connection waits for the answers still owed to its earlier requests, in ms. */
export const HTTP_OWED_ANSWERS_DEADLINE_MS = HTTP_REQUEST_TIMEOUT_MS;
/** How long the refusal may take to reach a client that does not read, in ms, before the socket is destroyed. */
const REFUSAL_FLUSH_DEADLINE_MS = 5_000;

/**
 * What listenHttp knows of one connection: the answers it still owes (HTTP/1.1 pipelining: a client may send
 * its next requests before the first is answered, and the answers must go out in the order of the requests,
 * RFC 9112 §9.3.2), the request read last, and whether node:http refused something on it.
 */
interface Connection {
  owed: Set<ServerResponse>;
  last: { req: IncomingMessage; res: ServerResponse } | undefined;
  refused: boolean;
}

function connectionOf(connections: WeakMap<Duplex, Connection>, socket: Duplex): Connection {
  let connection = connections.get(socket);
  if (connection === undefined) {
    connection = { owed: new Set(), last: undefined, refused: false };
    connections.set(socket, connection);
  }
  return connection;
}

/**
 * Calls `then` once every response in `responses` has closed (finished, or aborted with its socket); destroys
 * the socket instead if they have not within `deadlineMs`.
 */
function afterResponses(
  responses: ServerResponse[],
  socket: Duplex,
  deadlineMs: number,
  then: () => void,
): void {
  let open = responses.length;
  if (open === 0) {
    then();
    return;
  }
  // An answer still owed after the deadline (a handler that never answers) does not hold the socket for ever.
  const deadline = setTimeout(() => socket.destroy(), deadlineMs).unref();
  socket.once('close', () => clearTimeout(deadline));
  for (const res of responses) {
    res.once('close', () => {
      open -= 1;
      if (open > 0) return;
      clearTimeout(deadline);
      then();
    });
  }
}

/**
 * Answers what node:http refused before any route ran, as problem+json with a request id of its own (the
 * request was never read, so it has none), and closes the connection. Answers go out in the order of the
 * requests: a client that pipelines a valid request and then bytes node cannot parse (or headers over 16 KiB)
 * first gets the valid request's own answer, then this one (the valid request ran, and its client must learn
 * how it ended). The socket is destroyed once the refusal is written, as node's default does: `end()` would
 * only half-close it, and node's server sockets allow half-open connections, so the parser would go on reading
 * what the client sends next (a cold review had the rest of a request that got 408 routed and run, and sockets
 * kept open for as long as the client liked). Nothing is written on a socket that cannot take it, nor when the
 * refused request is the one being read and its handler's answer has started (a 408 for a body still arriving
 * while the handler already answers): the connection then closes once that answer is out.
 */
function answerClientError(
  err: Error & { code?: string },
  socket: Duplex,
  connection: Connection | undefined,
  logger: Logger | undefined,
  owedAnswersDeadlineMs: number,
): void {
  // node reports every later chunk of an unparseable stream again; the first report decides.
  if (connection?.refused === true) return;
  if (connection !== undefined) connection.refused = true;
  if (err.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy();
    return;
  }
  // The request node was still reading (its body) when it refused it: the refusal is its answer. Otherwise it
  // refused a request it had not begun to route, which comes after every request already read.
  const last = connection?.last;
  const refusedRequest = last !== undefined && !last.req.complete ? last.res : undefined;
  const owed = [...(connection?.owed ?? [])].filter((res) => res !== refusedRequest);
  if (refusedRequest?.headersSent === true) {
    afterResponses([...owed, refusedRequest], socket, owedAnswersDeadlineMs, () => socket.destroy());
    return;
  }
  afterResponses(owed, socket, owedAnswersDeadlineMs, () => {
    if (!socket.writable) {
      socket.destroy();
      return;
    }
    const error = new DomainError(CLIENT_ERRORS[err.code ?? ''] ?? 'malformed_request');
    const requestId = randomUUID();
    const body = JSON.stringify(problemDocument(error, requestId));
    const flushed = setTimeout(() => socket.destroy(), REFUSAL_FLUSH_DEADLINE_MS).unref();
    // Destroyed once the bytes are handed to the kernel, which is also after every earlier answer's bytes.
    socket.write(
      `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status] ?? ''}\r\n` +
        `Content-Type: ${PROBLEM_CONTENT_TYPE}\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n` +
        'Cache-Control: no-store\r\n' +
        'Connection: close\r\n\r\n' +
        body,
      () => {
        clearTimeout(flushed);
        socket.destroy();
      },
    );
    // As a request log line would (no path: none was read); node's message can quote the client's bytes.
    logger?.info('http client error', {
      request_id: requestId,
      status: error.status,
      code: error.code,
      reason: err.code,
    });
  });
}

/**
 * Listens on `port` (and `host`; without it node's default, every interface) with deadlines on reading a
 * request: its headers within 10 s, all of it within 30 s, else 408 and the connection closed. Both APIs take
 * bodies of a few kilobytes (uploads go to object storage, never through a service), so a client slower than
 * that only holds a socket. Node enforces both deadlines when it checks its connections, every
 * `connectionsCheckingInterval` (30 s by default, settable only when the server is created), so that is 1 s
 * here: a deadline is then at most a second late. What node refuses before a route runs (the deadlines, bytes
 * that are not HTTP/1.1, headers over 16 KiB) is answered as problem+json (400, 408, 413, 431), after the
 * answers still owed to the requests read before it on the same connection, and logged to `logger` with a
 * request id; a connection whose owed answers do not come within `options.owedAnswersDeadlineMs`
 * (HTTP_OWED_ANSWERS_DEADLINE_MS) is destroyed. Resolves once listening; rejects on a listen error.
 */
export async function listenHttp(
  handler: RequestListener,
  port: number,
  host?: string,
  logger?: Logger,
  options: { owedAnswersDeadlineMs?: number } = {},
): Promise<Server> {
  const connections = new WeakMap<Duplex, Connection>();
  const server = createServer(
    {
      headersTimeout: HTTP_HEADERS_TIMEOUT_MS,
      requestTimeout: HTTP_REQUEST_TIMEOUT_MS,
      connectionsCheckingInterval: 1000,
    },
    (req, res) => {
      const connection = connectionOf(connections, req.socket);
      // Read after node refused something on this connection (a request that followed a 408's): never routed.
      if (connection.refused) {
        req.socket.destroy();
        return;
      }
      connection.owed.add(res);
      connection.last = { req, res };
      res.once('close', () => connection.owed.delete(res));
      handler(req, res);
    },
  );
  server.on('clientError', (err: Error & { code?: string }, socket: Duplex) =>
    answerClientError(
      err,
      socket,
      connections.get(socket),
      logger,
      options.owedAnswersDeadlineMs ?? HTTP_OWED_ANSWERS_DEADLINE_MS,
    ),
  );
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    if (host === undefined) server.listen(port, () => resolve());
    else server.listen(port, host, () => resolve());
  });
  return server;
}
