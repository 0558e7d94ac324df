// listenHttp (design §6): what node:http refuses before any route runs is answered as problem+json and logged
// with a request id. Real sockets; the 408 of the read deadlines is checked by both services' process tests.
import type { Server } from 'node:http';
import { connect } from 'node:net';
import { rawHttpExchange } from '@platform/testkit';
import { HTTP_REQUEST_TIMEOUT_MS, listenHttp } from '../src/index.js';
import { captureLogs } from './log-capture.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
let server: Server | undefined;

afterEach(async () => {
  // A test that failed can leave a client connection open; the server's deadlines stop with close(), so close
  // waits for nobody.
  server?.closeAllConnections();
  await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined));
  server = undefined;
});

let handled = 0;

/**
 * A server whose handler answers at once, or (`readBody`) once it has read the whole body, as the services'
 * routes with a body do: node's errors in a body then come before any answer.
 */
async function start(readBody = false): Promise<{ port: number; logs: ReturnType<typeof captureLogs> }> {
  const logs = captureLogs();
  handled = 0;
  server = await listenHttp(
    (req, res) => {
      handled++;
      if (!readBody) res.end('ok');
      else req.resume().on('end', () => res.end('ok'));
    },
    0,
    '127.0.0.1',
    logs.logger,
  );
  const address = server.address();
  if (typeof address !== 'object' || address === null) throw new Error('no address');
  return { port: address.port, logs };
}

/**
 * A client that keeps its side open after the server's answer (as a hostile one would; node's own client
 * closes at once, which hid a half-closed server socket): sends `first`, waits for the server's FIN, then
 * sends `then`. Resolves with the answer once the server has had 300 ms to act on `then`.
 */
async function halfOpenExchange(port: number, first: string, then: string): Promise<string> {
  const socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  let answer = '';
  socket.on('data', (d: Buffer) => (answer += d.toString('latin1')));
  socket.on('error', () => undefined); // a write after the server destroyed the socket may draw EPIPE/RST
  await new Promise<void>((resolve) => {
    socket.once('end', () => resolve());
    socket.write(first);
  });
  if (then !== '') socket.write(then);
  await new Promise((r) => setTimeout(r, 300));
  socket.destroy();
  return answer;
}

const connections = (): Promise<number> =>
  new Promise((resolve, reject) => server!.getConnections((err, n) => (err ? reject(err) : resolve(n))));

describe('listenHttp: requests node:http refuses before any route runs', () => {
  it.each([
    ['bytes that are not HTTP/1.1', 400, 'malformed_request', 'NOT HTTP AT ALL\r\n\r\n'],
    ['a bare LF in a header', 400, 'malformed_request', 'GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n'],
    [
      'more than 16 KiB of headers',
      431,
      'headers_too_large',
      `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(17 * 1024)}\r\n\r\n`,
    ],
  ] as const)(
    '%s: %i %s as problem+json, the connection closed, a log line',
    async (_what, status, code, bytes) => {
      const { port, logs } = await start();
      const answer = await rawHttpExchange(port, bytes);
      expect(answer.status).toBe(status);
      expect(answer.text).toContain('Content-Type: application/problem+json');
      expect(answer.text).toContain('Connection: close');
      expect(answer.json).toMatchObject({ status, code, type: `https://platform.example/problems/${code}` });
      const requestId = String(answer.json?.request_id);
      expect(requestId).toMatch(UUID);
      expect(logs.entries().filter((e) => e.message === 'http client error')).toMatchObject([
        { request_id: requestId, status, code },
      ]);
      // The client's bytes never reach the log.
      expect(logs.text()).not.toContain('NOT HTTP');
      expect(logs.text()).not.toContain('aaaaaaaa');
    },
  );

  it('destroys the connection after a 400: a half-open client holds no socket', async () => {
    const { port } = await start();
    const answer = await halfOpenExchange(port, 'NOT HTTP\r\n\r\n', '');
    expect(answer).toMatch(/^HTTP\/1\.1 400 /);
    expect({ handled, connections: await connections() }).toEqual({ handled: 0, connections: 0 });
  });

  it('after the headers deadline (408), the rest of the request and the next one are never routed', async () => {
    const { port } = await start();
    const answer = await halfOpenExchange(
      port,
      'POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n',
      '\r\nhiGET / HTTP/1.1\r\nHost: x\r\n\r\n',
    );
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect({ handled, connections: await connections() }).toEqual({ handled: 0, connections: 0 });
  }, 20_000);

  it('chunk extensions over 16 KiB in a body: 413 payload_too_large as problem+json, the connection closed', async () => {
    const { port, logs } = await start(true);
    const answer = await rawHttpExchange(
      port,
      `POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1;x=${'a'.repeat(20 * 1024)}\r\nb\r\n0\r\n\r\n`,
    );
    expect(answer.status).toBe(413);
    expect(answer.text).toContain('Connection: close');
    expect(answer.json).toMatchObject({ status: 413, code: 'payload_too_large' });
    expect(logs.entries().filter((e) => e.message === 'http client error')).toMatchObject([
      { status: 413, code: 'payload_too_large', reason: 'HPE_CHUNK_EXTENSIONS_OVERFLOW' },
    ]);
    expect(logs.text()).not.toContain('aaaaaaaa');
    expect(await connections()).toBe(0);
  });

  it(
    'a body still arriving after the request deadline (30 s): 408 request_timeout, the connection closed',
    async () => {
      const { port, logs } = await start(true);
      const started = Date.now();
      // Headers at once, 2 of the 10 bytes the body announces, then nothing: the 10 s headers deadline is met,
      // the 30 s deadline for the whole request is not.
      const answer = await halfOpenExchange(
        port,
        'POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhi',
        '',
      );
      const waited = Date.now() - started;
      expect(answer).toMatch(/^HTTP\/1\.1 408 /);
      expect(answer).toContain('"code":"request_timeout"');
      expect(waited).toBeGreaterThanOrEqual(HTTP_REQUEST_TIMEOUT_MS);
      expect(logs.entries().filter((e) => e.message === 'http client error')).toMatchObject([
        { status: 408, code: 'request_timeout', reason: 'ERR_HTTP_REQUEST_TIMEOUT' },
      ]);
      expect({ handled, connections: await connections() }).toEqual({ handled: 1, connections: 0 });
    },
    HTTP_REQUEST_TIMEOUT_MS + 10_000,
  );

  it.each([
    ['bytes that are not HTTP/1.1', 'NOT HTTP AT ALL\r\n\r\n', 400, 'malformed_request'],
    [
      'a request with more than 16 KiB of headers',
      `GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(17 * 1024)}\r\n\r\n`,
      431,
      'headers_too_large',
    ],
  ] as const)(
    'pipelined requests followed by %s: each request gets its own answer, in order, then the refusal',
    async (_what, garbage, status, code) => {
      // Handlers that answer later than node refuses what follows (a database round trip): the first request's
      // answer used to be replaced by the refusal, though the request ran (issue 39 §4).
      const logs = captureLogs();
      const bodies = ['first', 'x'.repeat(1024 * 1024)];
      server = await listenHttp(
        (req, res) => {
          const n = Number(req.url?.slice(1));
          setTimeout(() => res.end(bodies[n]), n === 0 ? 150 : 50);
        },
        0,
        '127.0.0.1',
        logs.logger,
      );
      const address = server.address();
      if (typeof address !== 'object' || address === null) throw new Error('no address');
      const answer = await rawHttpExchange(
        address.port,
        'GET /0 HTTP/1.1\r\nHost: x\r\n\r\nGET /1 HTTP/1.1\r\nHost: x\r\n\r\n' + garbage,
      );
      const statuses = [...answer.text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
      expect(statuses).toEqual([200, 200, status]);
      // Every byte of both answers (the second, 1 MiB, is still being flushed when the refusal is written).
      const first = answer.text.indexOf('\r\n\r\nfirst');
      const second = answer.text.indexOf(`\r\n\r\n${bodies[1]}HTTP/1.1 ${status} `);
      expect({ first: first > 0, second: second > first }).toEqual({ first: true, second: true });
      const refusal = answer.text.slice(answer.text.lastIndexOf('HTTP/1.1 '));
      expect(refusal).toContain('Content-Type: application/problem+json');
      expect(JSON.parse(refusal.slice(refusal.indexOf('\r\n\r\n') + 4))).toMatchObject({ status, code });
      expect(logs.entries().filter((e) => e.message === 'http client error')).toMatchObject([
        { status, code },
      ]);
      expect(await connections()).toBe(0);
    },
  );

  it('a refused connection whose owed answer never comes is closed after the deadline, answering nothing', async () => {
    server = await listenHttp(() => undefined, 0, '127.0.0.1', undefined, { owedAnswersDeadlineMs: 300 });
    const address = server.address();
    if (typeof address !== 'object' || address === null) throw new Error('no address');
    const answer = await rawHttpExchange(address.port, 'GET / HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP\r\n\r\n');
    expect(answer.text).toBe('');
    expect(answer.closedAfterMs).toBeGreaterThanOrEqual(250);
    expect(await connections()).toBe(0);
  });

  it('still answers a well-formed request', async () => {
    const { port } = await start();
    const res = await fetch(`http://127.0.0.1:${port}/`);
    expect({ status: res.status, body: await res.text() }).toEqual({ status: 200, body: 'ok' });
  });
});
