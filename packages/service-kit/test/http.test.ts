import { validateDecisionRequest, validateProblemDocument } from '@platform/contracts';
import type { AddressInfo } from 'node:net';
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import express from 'express';
import request from 'supertest';
import type { Response } from 'supertest';
import {
  addRoutes,
  createHttpApp,
  createMetrics,
  DomainError,
  finishHttpApp,
  metricsHandler,
  requireValid,
} from '../src/index.js';
import { captureLogs } from './log-capture.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const LIMIT_BYTES = 64 * 1024;

function buildTestApp() {
  const logs = captureLogs();
  const metrics = createMetrics({ service: 'kit-test', defaultMetrics: false });
  const app = createHttpApp({ logger: logs.logger, metrics, trustProxy: true });

  addRoutes(app, [
    {
      method: 'POST',
      path: '/echo',
      body: 'json',
      handler: (req, res) => void res.json({ received: req.body as unknown }),
    },
    {
      method: 'PUT',
      path: '/echo',
      body: 'json',
      handler: (req, res) => void res.json({ put: req.body as unknown }),
    },
    { method: 'GET', path: '/items/:id', handler: (req, res) => void res.json({ id: req.params.id }) },
    {
      method: 'get',
      path: '/boom',
      handler: () => {
        throw new Error('connect failed: password=hunter2 at postgres://app:hunter2@db:5432/x');
      },
    },
    {
      method: 'GET',
      path: '/async-boom',
      handler: async () => {
        await Promise.resolve();
        throw new TypeError('cannot read properties of undefined (reading "secretSauce")');
      },
    },
    {
      method: 'GET',
      path: '/denied',
      handler: () => {
        throw new DomainError('unauthorized', 'A bearer token is required.', {
          headers: { 'WWW-Authenticate': 'Bearer realm="platform", error="invalid_token"' },
        });
      },
    },
    {
      method: 'GET',
      path: '/bare-401',
      handler: () => {
        throw new DomainError('unauthorized');
      },
    },
    {
      method: 'GET',
      path: '/down',
      handler: () => {
        throw new DomainError('backend_unavailable', 'The database is unreachable.');
      },
    },
    {
      method: 'GET',
      path: '/ready',
      handler: () => {
        throw new DomainError('not_ready', 'Not ready: database unavailable.');
      },
    },
    { method: 'GET', path: '/no-content', handler: (_req, res) => void res.status(204).json({ a: 1 }) },
    {
      method: 'GET',
      path: '/typed',
      handler: (_req, res) => void res.type('application/vnd.example+json').json({ typed: true }),
    },
    {
      method: 'POST',
      path: '/decisions',
      body: 'json',
      handler: (req, res) => void res.json(requireValid(validateDecisionRequest(req.body))),
    },
  ]);

  const api = express.Router();
  addRoutes(api, [{ method: 'GET', path: '/things/:thing_id', handler: (_req, res) => void res.json({}) }]);
  app.use('/api', api);
  app.get('/metrics', metricsHandler(metrics));
  finishHttpApp(app, logs.logger);
  return { app, logs, metrics };
}

/** Asserts the design §2 problem+json shape and returns the body. */
function expectProblem(res: Response, status: number, code: string, requestId?: string) {
  expect(res.status).toBe(status);
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  const body = JSON.parse(res.text) as Record<string, unknown>;
  const check = validateProblemDocument(body);
  expect(check).toEqual({ ok: true, value: body });
  expect(body.status).toBe(status);
  expect(body.code).toBe(code);
  expect(body.type).toBe(`https://platform.example/problems/${code}`);
  expect(body.request_id).toBe(res.headers['x-request-id']);
  if (requestId !== undefined) expect(body.request_id).toBe(requestId);
  return body;
}

async function waitFor<T>(probe: () => T | undefined, timeoutMs = 2000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

describe('JSON answers (res.json)', () => {
  const { app } = buildTestApp();

  it('sends the JSON text with its UTF-8 type and byte length', async () => {
    const res = await request(app).get('/items/%C3%BC%E2%82%AC');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toBe('application/json; charset=utf-8');
    expect(res.text).toBe('{"id":"ü€"}');
    expect(res.headers['content-length']).toBe(String(Buffer.byteLength('{"id":"ü€"}')));
  });

  it('answers HEAD with the headers and no body', async () => {
    const res = await request(app).head('/items/abc');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toBe('application/json; charset=utf-8');
    expect(res.headers['content-length']).toBe(String('{"id":"abc"}'.length));
    expect(res.text).toBeUndefined();
  });

  it('answers a conditional GET for any representation (If-None-Match: *) with 304, as express does', async () => {
    // RFC 9110 §13.1.2: "*" matches any current representation; a GET then gets 304 Not Modified.
    const res = await request(app).get('/items/abc').set('If-None-Match', '*');
    expect(res.status).toBe(304);
    expect(res.text).toBe('');
  });

  it('keeps a type the route chose, and sends no body with a 204', async () => {
    const typed = await request(app).get('/typed');
    expect(typed.headers['content-type']).toBe('application/vnd.example+json; charset=utf-8');
    expect(typed.text).toBe('{"typed":true}');
    const empty = await request(app).get('/no-content');
    expect(empty.status).toBe(204);
    expect(empty.headers['content-type']).toBeUndefined();
    expect(empty.text).toBe('');
  });
});

describe('createHttpApp body handling', () => {
  const { app } = buildTestApp();

  it.each([
    ['no Content-Type', {}],
    ['a non-JSON type with a charset', { 'Content-Type': 'text/plain; charset=latin1' }],
    ['a Content-Encoding', { 'Content-Encoding': 'gzip' }],
  ])('reads no body from a request with Content-Length: 0 and %s', async (_name, headers) => {
    const res = await request(app)
      .post('/echo')
      .set({ ...headers, 'Content-Length': '0' });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({});
  });

  it('parses a JSON body and answers 2xx', async () => {
    const res = await request(app).post('/echo').send({ a: 1 });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ received: { a: 1 } });
  });

  it('sends no ETag (no route serves conditional requests; hashing every body costs CPU)', async () => {
    const res = await request(app).post('/echo').send({ a: 1 });
    expect(res.status).toBe(200);
    expect(res.headers.etag).toBeUndefined();
  });

  it('accepts +json media types and a charset parameter', async () => {
    const res = await request(app)
      .post('/echo')
      .set('Content-Type', 'application/merge-patch+json; charset=utf-8')
      .send('{"b":2}');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ received: { b: 2 } });
  });

  it('answers malformed JSON with 400 invalid_json, echoing the request id', async () => {
    const res = await request(app)
      .post('/echo')
      .set('X-Request-Id', 'bad-json-1')
      .set('Content-Type', 'application/json')
      .send('{"a": 1,');
    const body = expectProblem(res, 400, 'invalid_json', 'bad-json-1');
    // The parser's own message quotes the body; the client gets a fixed sentence.
    expect(body.detail).toBe('The request body is not valid JSON.');
    expect(res.headers['x-request-id']).toBe('bad-json-1');
  });

  it('answers a non-JSON body with 415 unsupported_media_type', async () => {
    const res = await request(app)
      .post('/echo')
      .set('X-Request-Id', 'text-1')
      .set('Content-Type', 'text/plain')
      .send('hello');
    expectProblem(res, 415, 'unsupported_media_type', 'text-1');
  });

  it('answers a body without Content-Type with 415', async () => {
    const res = await request(app).put('/echo').set('Content-Length', '5').send(Buffer.from('hello'));
    expectProblem(res, 415, 'unsupported_media_type');
  });

  it('answers an unsupported charset with 415', async () => {
    const res = await request(app)
      .post('/echo')
      .set('Content-Type', 'application/json; charset=latin1')
      .send('{"a":1}');
    expectProblem(res, 415, 'unsupported_media_type');
  });

  it('inflates a gzip, br or deflate body, answers one that does not decompress with 400, and limits the inflated size', async () => {
    // fetch on a listening server: supertest re-serialises a Buffer sent with a JSON Content-Type.
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    const { port } = server.address() as AddressInfo;
    const post = async (encoding: string, bytes: Buffer) => {
      const res = await fetch(`http://127.0.0.1:${port}/echo`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', 'Content-Encoding': encoding },
        body: bytes,
      });
      return {
        status: res.status,
        type: res.headers.get('content-type'),
        body: (await res.json()) as Record<string, unknown>,
      };
    };
    try {
      const json = JSON.stringify({ a: 1 });
      for (const [encoding, compressed] of [
        ['gzip', gzipSync(json)],
        ['br', brotliCompressSync(json)],
        ['deflate', deflateSync(json)],
      ] as const) {
        expect(await post(encoding, compressed)).toMatchObject({ status: 200, body: { received: { a: 1 } } });
        const bad = await post(encoding, Buffer.from('{"not":"compressed"}'));
        expect(bad).toMatchObject({ status: 400, body: { code: 'invalid_body', status: 400 } });
        expect(bad.type).toMatch(/^application\/problem\+json/);
        expect(JSON.stringify(bad.body)).not.toMatch(/zlib|Z_DATA|header check|Decompression/i);
      }
      // 1 MiB of JSON in about 1 KB of gzip: refused by the 64 KiB limit on the inflated body.
      const bomb = gzipSync(JSON.stringify({ p: 'x'.repeat(1 << 20) }));
      expect(bomb.length).toBeLessThan(LIMIT_BYTES);
      expect(await post('gzip', bomb)).toMatchObject({ status: 413, body: { code: 'payload_too_large' } });
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('answers an unsupported Content-Encoding with 415', async () => {
    const res = await request(app)
      .post('/echo')
      .set('Content-Type', 'application/json')
      .set('Content-Encoding', 'compress')
      .send('{}');
    expectProblem(res, 415, 'unsupported_media_type');
  });

  it('lets a bodiless POST through without a Content-Type', async () => {
    const res = await request(app).post('/echo');
    expect(res.status).toBe(200);
  });

  it('accepts a body of exactly 64 KiB and refuses one byte more with 413', async () => {
    const padding = (n: number) => JSON.stringify({ p: 'x'.repeat(n - 8) });
    expect(Buffer.byteLength(padding(LIMIT_BYTES))).toBe(LIMIT_BYTES);

    const ok = await request(app)
      .post('/echo')
      .set('Content-Type', 'application/json')
      .send(padding(LIMIT_BYTES));
    expect(ok.status).toBe(200);

    const res = await request(app)
      .post('/echo')
      .set('X-Request-Id', 'too-big-1')
      .set('Content-Type', 'application/json')
      .send(padding(LIMIT_BYTES + 1));
    expectProblem(res, 413, 'payload_too_large', 'too-big-1');
  });

  it('honours a smaller configured body limit', async () => {
    const { logger } = captureLogs();
    const small = createHttpApp({ logger });
    addRoutes(
      small,
      [{ method: 'POST', path: '/x', body: 'json', handler: (_req, res) => void res.json({}) }],
      {
        bodyLimitBytes: 16,
      },
    );
    finishHttpApp(small, logger);
    const res = await request(small).post('/x').send({ long: 'more than sixteen bytes' });
    expectProblem(res, 413, 'payload_too_large');
  });

  it('turns validation failures into 400 invalid_body with JSON Pointer errors', async () => {
    const res = await request(app).post('/decisions').send({ decision: 'maybe', extra: true });
    const body = expectProblem(res, 400, 'invalid_body');
    const errors = body.errors as { path: string; message: string }[];
    expect(errors.length).toBeGreaterThan(0);
    expect(errors.map((e) => e.path)).toContain('/decision');
  });
});

describe('addRoutes: authenticate, then read the body', () => {
  const seen: string[] = [];
  const { logger } = captureLogs();
  const gated = createHttpApp({ logger });
  addRoutes(gated, [
    {
      method: 'POST',
      path: '/echo',
      authenticate: (req, _res, next) => {
        seen.push(req.path);
        if (req.get('Authorization') === 'Bearer ok') next();
        else next(new DomainError('unauthorized', 'No.'));
      },
      body: 'json',
      handler: (req, res) => void res.json({ received: req.body as unknown }),
    },
    {
      method: 'POST',
      path: '/open',
      body: 'json',
      handler: (req, res) => void res.json({ b: req.body as unknown }),
    },
  ]);
  finishHttpApp(gated, logger);

  it('refuses a request with a body before reading it, authenticating each request once', async () => {
    const denied = await request(gated).post('/echo').set('Content-Type', 'application/json').send('{"a":');
    expectProblem(denied, 401, 'unauthorized');
    const tooBig = await request(gated)
      .post('/echo')
      .set('Content-Type', 'application/json')
      .send(JSON.stringify({ p: 'x'.repeat(LIMIT_BYTES) }));
    expectProblem(tooBig, 401, 'unauthorized');
    const malformed = await request(gated)
      .post('/echo')
      .set('Authorization', 'Bearer ok')
      .set('Content-Type', 'application/json')
      .send('{"a":');
    expectProblem(malformed, 400, 'invalid_json');
    const ok = await request(gated).post('/echo').set('Authorization', 'Bearer ok').send({ a: 1 });
    expect(ok.body).toEqual({ received: { a: 1 } });
    seen.length = 0;
    expect((await request(gated).post('/echo').set('Authorization', 'Bearer ok')).status).toBe(200);
    expect(seen).toEqual(['/echo']); // once per request, bodiless or not
    expect((await request(gated).post('/echo')).status).toBe(401);
    // A public route reads its body without asking anyone.
    seen.length = 0;
    expect((await request(gated).post('/open').send({ x: 1 })).body).toEqual({ b: { x: 1 } });
    expect(seen).toEqual([]);
  });
});

describe('createHttpApp routing errors', () => {
  const { app } = buildTestApp();

  it('answers an unknown route with 404 not_found', async () => {
    const res = await request(app).get('/nowhere').set('X-Request-Id', 'nf-1');
    expectProblem(res, 404, 'not_found', 'nf-1');
  });

  it('answers another method on a known path with 405 and Allow', async () => {
    const res = await request(app).delete('/items/7').set('X-Request-Id', 'm-1');
    expectProblem(res, 405, 'method_not_allowed', 'm-1');
    expect(res.headers.allow).toBe('GET, HEAD, OPTIONS');

    const both = await request(app).patch('/echo');
    expectProblem(both, 405, 'method_not_allowed');
    expect(both.headers.allow).toBe('POST, PUT, OPTIONS');
  });

  it('answers 405 on routes of a mounted router too', async () => {
    const res = await request(app).post('/api/things/1').send({});
    expectProblem(res, 405, 'method_not_allowed');
    expect(res.headers.allow).toBe('GET, HEAD, OPTIONS');
  });

  it('answers OPTIONS with 204 and Allow, and HEAD like GET', async () => {
    const options = await request(app).options('/items/7');
    expect(options.status).toBe(204);
    expect(options.headers.allow).toBe('GET, HEAD, OPTIONS');

    const head = await request(app).head('/items/7');
    expect(head.status).toBe(200);
    expect(head.headers['x-request-id']).toMatch(UUID);
  });

  it('passes DomainError headers through (401 WWW-Authenticate, exact)', async () => {
    const res = await request(app).get('/denied');
    const body = expectProblem(res, 401, 'unauthorized');
    expect(body.detail).toBe('A bearer token is required.');
    expect(res.headers['www-authenticate']).toBe('Bearer realm="platform", error="invalid_token"');
  });

  it('adds WWW-Authenticate: Bearer to a 401 that did not set one, and Retry-After to a 503', async () => {
    const unauthorized = await request(app).get('/bare-401');
    const body = expectProblem(unauthorized, 401, 'unauthorized');
    expect(body.detail).toBe('Unauthorized');
    expect(unauthorized.headers['www-authenticate']).toBe('Bearer');

    const down = await request(app).get('/down');
    expectProblem(down, 503, 'backend_unavailable');
    expect(down.headers['retry-after']).toBe('5');
  });

  it('answers a malformed path parameter with a problem, not an HTML page', async () => {
    const res = await request(app).get('/items/%E0%A4%A');
    expectProblem(res, 404, 'not_found');
  });
});

describe('request ids', () => {
  const { app, logs } = buildTestApp();

  it('echoes a well-formed X-Request-Id on success and error responses', async () => {
    const id = 'trace:abc.DEF_123-456';
    const ok = await request(app).get('/items/1').set('X-Request-Id', id);
    expect(ok.headers['x-request-id']).toBe(id);
    const bad = await request(app).get('/missing').set('X-Request-Id', id);
    expect(bad.headers['x-request-id']).toBe(id);
  });

  it.each([
    ['contains a space', 'has space'],
    ['is too long', 'a'.repeat(129)],
    ['contains a header-injection attempt', 'x\tSet-Cookie: y'],
    ['contains non-ASCII', 'idé'],
  ])('replaces an id that %s with a fresh UUID', async (_why, incoming) => {
    const res = await request(app).get('/nowhere').set('X-Request-Id', incoming);
    expect(res.headers['x-request-id']).toMatch(UUID);
    expectProblem(res, 404, 'not_found');
  });

  it('accepts the longest allowed id (128 characters)', async () => {
    const id = 'b'.repeat(128);
    const res = await request(app).get('/items/2').set('X-Request-Id', id);
    expect(res.headers['x-request-id']).toBe(id);
  });

  it('generates distinct ids when none is sent', async () => {
    const a = await request(app).get('/items/1');
    const b = await request(app).get('/items/1');
    expect(a.headers['x-request-id']).toMatch(UUID);
    expect(a.headers['x-request-id']).not.toBe(b.headers['x-request-id']);
  });

  it('writes one request line with route pattern, status, duration and client ip, but no headers', async () => {
    await request(app)
      .get('/items/42?token=abc')
      .set('X-Request-Id', 'log-line-1')
      .set('Authorization', 'Bearer super-secret-value')
      .set('X-Forwarded-For', '198.51.100.7, 203.0.113.9');
    const line = await waitFor(() =>
      logs.entries().find((e) => e.request_id === 'log-line-1' && e.message === 'http request'),
    );
    expect(line).toMatchObject({
      level: 'info',
      service: 'kit-test',
      method: 'GET',
      route: '/items/:id',
      path: '/items/42',
      status: 200,
      // trustProxy: true trusts exactly one hop, so the address the proxy saw wins over the spoofable first one.
      ip: '203.0.113.9',
    });
    expect(line).not.toHaveProperty('code');
    expect(typeof line.duration_ms).toBe('number');
    expect(typeof line.timestamp).toBe('string');
    expect(logs.entries().filter((e) => e.request_id === 'log-line-1')).toHaveLength(1);
    expect(logs.text()).not.toContain('super-secret-value');
  });
});

describe('request log line and the log level', () => {
  it('follows a change of the level made after the app was built', async () => {
    const { app, logs } = buildTestApp();
    const lines = (id: string) =>
      logs.entries().filter((e) => e.request_id === id && e.message === 'http request');
    // First requests at warn: the info line is not written, a 5xx's warn line is.
    logs.logger.level = 'warn';
    await request(app).get('/items/1').set('X-Request-Id', 'level-warn');
    await request(app).get('/down').set('X-Request-Id', 'level-warn-503');
    await waitFor(() => (lines('level-warn-503').length > 0 ? true : undefined));
    expect(lines('level-warn')).toHaveLength(0);
    // Back to info: the next request's line is written (the level is not read once and kept).
    logs.logger.level = 'info';
    await request(app).get('/items/2').set('X-Request-Id', 'level-info');
    await waitFor(() => (lines('level-info').length > 0 ? true : undefined));
  });
});

describe('log level of a readiness answer', () => {
  it('logs a 503 not_ready at info (a probe asking until the service is ready), any other 5xx as a warning', async () => {
    // npm start polls both services' readiness every 200 ms while they load, and every poll answered before they
    // were ready printed two warnings (the detail and the request line) ahead of the banner.
    const { app, logs } = buildTestApp();
    logs.logger.level = 'info';
    const notReady = await request(app).get('/ready').set('X-Request-Id', 'probe-503');
    expectProblem(notReady, 503, 'not_ready');
    await request(app).get('/down').set('X-Request-Id', 'down-503');
    const lines = (id: string) =>
      waitFor(() => {
        const found = logs.entries().filter((e) => e.request_id === id);
        return found.length === 2 ? found : undefined;
      });
    expect((await lines('probe-503')).map((e) => [e.level, e.message])).toEqual([
      ['info', 'Not ready: database unavailable.'],
      ['info', 'http request'],
    ]);
    expect((await lines('down-503')).map((e) => [e.level, e.message])).toEqual([
      ['warn', 'The database is unreachable.'],
      ['warn', 'http request'],
    ]);
  });
});

describe('request log line of a rejected request', () => {
  it('names the problem code and the unmatched route', async () => {
    const { app, logs } = buildTestApp();
    await request(app).get('/nowhere/at/all').set('X-Request-Id', 'log-404');
    const line = await waitFor(() => logs.entries().find((e) => e.request_id === 'log-404'));
    expect(line).toMatchObject({
      message: 'http request',
      route: 'unmatched',
      status: 404,
      code: 'not_found',
    });
    expect(logs.entries().filter((e) => e.request_id === 'log-404')).toHaveLength(1);
  });
});

describe('unexpected errors', () => {
  it.each([
    ['/boom', 'hunter2', 'connect failed: password=*** at postgres://app:***@db:5432/x'],
    ['/async-boom', 'secretSauce', 'cannot read properties of undefined (reading "secretSauce")'],
  ])('%s → generic 500: nothing leaks to the body, the stack goes to the log', async (path, leak, logged) => {
    const { app, logs } = buildTestApp();
    const res = await request(app)
      .get(path)
      .set('X-Request-Id', `err-${path.slice(1)}`);
    const body = expectProblem(res, 500, 'internal_error', `err-${path.slice(1)}`);
    expect(body.detail).toBe('An unexpected error occurred.');
    expect(res.text).not.toContain(leak);
    expect(res.text).not.toMatch(/\bat .*\.ts:\d+/);
    expect(res.text).not.toContain('Error');

    const line = await waitFor(() =>
      logs.entries().find((e) => e.request_id === `err-${path.slice(1)}` && e.level === 'error'),
    );
    const err = line.err as { stack: string; message: string };
    expect(err.stack).toMatch(/http\.test\.ts:\d+/);
    // The log keeps the message, with credentials masked.
    expect(err.message).toBe(logged);
    expect(logs.text()).not.toContain('hunter2');
  });
});

describe('metrics', () => {
  it('counts requests by method, route pattern and status; 404s are "unmatched"', async () => {
    const { app } = buildTestApp();
    await request(app).get('/items/1');
    await request(app).get('/items/2');
    await request(app).get('/api/things/9');
    await request(app).get('/no/such/path');
    const res = await request(app).get('/metrics');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toMatch(/^text\/plain/);
    const text = res.text;
    expect(text).toContain(
      'http_requests_total{method="GET",route="/items/:id",status="200",service="kit-test"} 2',
    );
    expect(text).toContain(
      'http_requests_total{method="GET",route="/api/things/:thing_id",status="200",service="kit-test"} 1',
    );
    expect(text).toContain(
      'http_requests_total{method="GET",route="unmatched",status="404",service="kit-test"} 1',
    );
    expect(text).toContain(
      'http_request_duration_seconds_count{service="kit-test",method="GET",route="/items/:id",status="200"} 2',
    );
    expect(text).not.toContain('route="/items/1"');
  });
});
