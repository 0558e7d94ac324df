// The HTTP listener both services run behind (design §6): node:http with deadlines on reading a request.
import { createServer, type RequestListener, type Server } from 'node:http';

/** A request's headers must arrive within this (node's default: 60 s). */
export const HTTP_HEADERS_TIMEOUT_MS = 10_000;
/** All of a request must arrive within this (node's default: 300 s). */
export const HTTP_REQUEST_TIMEOUT_MS = 30_000;

/**
 * Listens on `port` (and `host`; without it node's default, every interface) with deadlines on reading a
 * request: its headers within 10 s, all of it within 30 s, else 408 and the connection closed. Both APIs take
 * bodies of a few kilobytes (uploads go to object storage, never through a service), so a client slower than
 * that only holds a socket. Node enforces both deadlines when it checks its connections, every
 * `connectionsCheckingInterval` (30 s by default, settable only when the server is created), so that is 1 s
 * here: a deadline is then at most a second late. Resolves once listening; rejects on a listen error.
 */
export async function listenHttp(handler: RequestListener, port: number, host?: string): Promise<Server> {
  const server = createServer(
    {
      headersTimeout: HTTP_HEADERS_TIMEOUT_MS,
      requestTimeout: HTTP_REQUEST_TIMEOUT_MS,
      connectionsCheckingInterval: 1000,
    },
    handler,
  );
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    if (host === undefined) server.listen(port, () => resolve());
    else server.listen(port, host, () => resolve());
  });
  return server;
}
