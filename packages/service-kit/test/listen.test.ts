// listenHttp (design §6): what node:http refuses before any route runs is answered as problem+json and logged
// with a request id. Real sockets; the 408 of the read deadlines is checked by both services' process tests.
import type { Server } from 'node:http';
import { rawHttpExchange } from '@platform/testkit';
import { listenHttp } from '../src/index.js';
import { captureLogs } from './log-capture.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
let server: Server | undefined;

afterEach(async () => {
  await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined));
  server = undefined;
});

async function start(): Promise<{ port: number; logs: ReturnType<typeof captureLogs> }> {
  const logs = captureLogs();
  server = await listenHttp((_req, res) => res.end('ok'), 0, '127.0.0.1', logs.logger);
  const address = server.address();
  if (typeof address !== 'object' || address === null) throw new Error('no address');
  return { port: address.port, logs };
}

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

  it('still answers a well-formed request, and keeps its connection', async () => {
    const { port } = await start();
    const res = await fetch(`http://127.0.0.1:${port}/`);
    expect({ status: res.status, body: await res.text() }).toEqual({ status: 200, body: 'ok' });
  });
});
