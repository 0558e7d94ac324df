// A slow object store: an HTTP proxy in front of the test store that hands every request to the store at once
// (so the store does the work) and, for the requests a test picks, holds the store's answer back for a
// while. A client whose deadline is shorter gives up (and the SDK retries) although the store did the
// work: what an overloaded store does to a non-idempotent call such as CreateMultipartUpload.
import { createServer, request as httpRequest } from 'node:http';
import type { IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface SlowStore {
  endpoint: string;
  /** How long to hold back the answer to `req` (0: answer at once); set by the test. */
  delayMs: (req: { method: string; url: string }) => number;
  /** Every request the store received through the proxy, in order. */
  received: Array<{ method: string; url: string; status: number }>;
  stop(): Promise<void>;
}

export async function startSlowStore(target: () => string): Promise<SlowStore> {
  const store: SlowStore = {
    endpoint: '',
    delayMs: () => 0,
    received: [],
    stop: () => Promise.resolve(),
  };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const method = req.method ?? 'GET';
      const url = req.url ?? '/';
      const delay = store.delayMs({ method, url });
      const upstream = new URL(target());
      // The store gets the whole request whatever the client does meanwhile (it may give up first), with the
      // Host header the client signed: a store that verifies signatures (the RADOS Gateway) refuses another.
      const out = httpRequest(
        { host: upstream.hostname, port: upstream.port, method, path: url, headers: req.headers },
        (answer: IncomingMessage) => {
          const body: Buffer[] = [];
          answer.on('data', (chunk: Buffer) => body.push(chunk));
          answer.on('end', () => {
            store.received.push({ method, url, status: answer.statusCode ?? 0 });
            setTimeout(() => {
              if (res.destroyed) return;
              res.writeHead(answer.statusCode ?? 502, answer.headers);
              res.end(Buffer.concat(body));
            }, delay);
          });
        },
      );
      out.on('error', () => {
        if (!res.destroyed) res.destroy();
      });
      out.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  store.endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  store.stop = async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return store;
}
