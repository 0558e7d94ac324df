// Security review of the management API (/api): authentication on every route, before the body and before the
// database; the API key never logged; cursor and query parsing never a 500. A real gateway (buildApp on a real
// PostgreSQL, served by a real node:http server as run.ts serves it) is attacked over raw TCP sockets.
// DB activity is observed two ways: a spy on pg.Client.prototype.query (every query of the gateway's pools) and
// pg_stat_activity for the gateway's login on this test database (backend_start/state_change after a mark).
// Every test asserts what the spec promises; a failing test is a finding.
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { Writable } from 'node:stream';
import { inspect } from 'node:util';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { validateProblemDocument } from '@platform/contracts';
import { createLogger, SecretSet } from '@platform/service-kit';
import { sql } from 'kysely';
import pg from 'pg';
import { buildApp } from '../src/app.js';
import { loadGatewayConfig } from '../src/config.js';
import { gatewayRoutes } from '../src/http/routes.js';
import type { GatewayService } from '../src/service.js';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';

jest.setTimeout(120_000);

const KEY = API_KEYS[0]!;
const DEVICE = 'acme-hq-hvac-01';
const FAKE_ROLLOUT = 'd4000000-0000-4000-8000-0000000000aa';

let gw: GatewayFixture;
let server: Server;
let port: number;
let dbName: string;
let queries = 0;
const queryTexts: string[] = [];
let realRolloutId = '';

// ---------------------------------------------------------------------------------------------------------
// Raw HTTP over TCP
// ---------------------------------------------------------------------------------------------------------

interface RawResponse {
  status: number;
  headers: Record<string, string[]>;
  body: string;
  ms: number;
  /** Everything read (all responses, e.g. a 100 Continue before the final one). */
  raw: string;
}

function header(res: RawResponse, name: string): string | undefined {
  return res.headers[name.toLowerCase()]?.[0];
}

/**
 * Sends `head` (request line and headers, CRLF-terminated, without the blank line) then `chunks` (written
 * without waiting for the answer), and resolves with the first final (non-1xx) response. The socket is
 * destroyed then, the request body left unfinished if it was.
 */
function rawRequest(head: string, chunks: (string | Buffer)[] = [], timeoutMs = 5000): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const socket = connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    const timer = setTimeout(() => {
      socket.destroy();
      reject(
        new Error(`no answer within ${timeoutMs} ms; read so far: ${data.toString('latin1').slice(0, 300)}`),
      );
    }, timeoutMs);
    socket.on('error', () => undefined);
    socket.on('connect', () => {
      socket.write(`${head}\r\n`);
      for (const chunk of chunks) {
        if (socket.destroyed) break;
        socket.write(chunk);
      }
    });
    const tryParse = (ended: boolean): void => {
      const text = data.toString('latin1');
      let offset = 0;
      for (;;) {
        const end = text.indexOf('\r\n\r\n', offset);
        if (end < 0) return;
        const lines = text.slice(offset, end).split('\r\n');
        const status = Number(lines[0]!.split(' ')[1]);
        const headers: Record<string, string[]> = {};
        for (const line of lines.slice(1)) {
          const i = line.indexOf(':');
          const name = line.slice(0, i).trim().toLowerCase();
          (headers[name] ??= []).push(line.slice(i + 1).trim());
        }
        if (status >= 100 && status < 200) {
          offset = end + 4;
          continue;
        }
        const length = /^HEAD /.test(head)
          ? 0
          : headers['content-length'] === undefined
            ? undefined
            : Number(headers['content-length'][0]);
        const bodyStart = end + 4;
        if (length !== undefined && data.length - bodyStart < length && !ended) return;
        if (length === undefined && !ended && !/^HEAD /.test(head)) {
          // No length: either bodiless (204/304) or read to the end.
          if (status !== 204 && status !== 304) return;
        }
        const body = data
          .subarray(bodyStart, length === undefined ? undefined : bodyStart + length)
          .toString('utf8');
        clearTimeout(timer);
        socket.destroy();
        resolve({ status, headers, body, ms: performance.now() - started, raw: text });
        return;
      }
    };
    socket.on('data', (d: Buffer) => {
      data = Buffer.concat([data, d]);
      tryParse(false);
    });
    socket.on('end', () => tryParse(true));
    socket.on('close', () => tryParse(true));
  });
}

function headFor(method: string, path: string, extra: string[] = []): string {
  return [`${method} ${path} HTTP/1.1`, `Host: 127.0.0.1:${port}`, ...extra, ''].join('\r\n');
}

function json(res: RawResponse): Record<string, unknown> {
  try {
    return JSON.parse(res.body) as Record<string, unknown>;
  } catch {
    return {};
  }
}

/** 401 problem+json `unauthorized` with a Bearer challenge, nothing of the keys in it. */
function expect401(res: RawResponse, what: string, bodiless = false): void {
  const summary = `${what} -> ${res.status} ${res.body.slice(0, 200)}`;
  expect({ what, status: res.status }).toEqual({ what, status: 401 });
  expect(header(res, 'www-authenticate') ?? summary).toMatch(/^Bearer( |$)/);
  if (!bodiless) {
    expect(header(res, 'content-type') ?? summary).toMatch(/^application\/problem\+json/);
    const body = json(res);
    expect(validateProblemDocument(body).ok).toBe(true);
    expect(body.code).toBe('unauthorized');
  }
  for (const k of API_KEYS) expect(res.raw).not.toContain(k);
}

function expectProblem(res: RawResponse, what: string, statuses: number[], code?: string): void {
  const summary = `${what} -> ${res.status} ${res.body.slice(0, 300)}`;
  expect(statuses.includes(res.status) ? 'ok' : summary).toBe('ok');
  expect(header(res, 'content-type') ?? summary).toMatch(/^application\/problem\+json/);
  const body = json(res);
  expect(validateProblemDocument(body).ok ? 'ok' : summary).toBe('ok');
  if (code !== undefined) expect(body.code === code ? 'ok' : summary).toBe('ok');
  expect(res.body).not.toMatch(/at .*\.(ts|js):\d+|node_modules|SELECT |device_gateway\.|pg_|Error:/);
}

// ---------------------------------------------------------------------------------------------------------
// Database observation
// ---------------------------------------------------------------------------------------------------------

async function dbMark(): Promise<string> {
  const { rows } = await sql<{ t: string }>`SELECT clock_timestamp()::text AS t`.execute(gw.owner);
  return rows[0]!.t;
}

/** Backends of the gateway's login on this database that started or ran something after `mark`. */
async function loginActivitySince(mark: string): Promise<string[]> {
  const { rows } = await sql<{ q: string }>`
    SELECT coalesce(query, '') AS q FROM pg_stat_activity
    WHERE datname = ${dbName} AND usename = 'device_gateway_login'
      AND (backend_start > ${mark}::timestamptz OR state_change > ${mark}::timestamptz)`.execute(gw.owner);
  return rows.map((r) => r.q);
}

/** Runs `attack` and asserts the gateway issued no query (spy) and its login did nothing (pg_stat_activity). */
async function expectNoDb<T>(what: string, attack: () => Promise<T>): Promise<T> {
  // The audit rows of earlier tests' notifies are written after their answers (audit/queue.ts): not this attack's.
  await gw.app.audit.flush();
  const mark = await dbMark();
  const before = queries;
  const result = await attack();
  await new Promise((r) => setTimeout(r, 150));
  const issued = queryTexts.slice(before).map((q) => q.slice(0, 120));
  expect({ what, issued }).toEqual({ what, issued: [] });
  expect({ what, activity: await loginActivitySince(mark) }).toEqual({ what, activity: [] });
  return result;
}

// ---------------------------------------------------------------------------------------------------------
// Fixture
// ---------------------------------------------------------------------------------------------------------

const originalQuery = pg.Client.prototype.query;

beforeAll(async () => {
  gw = await startGateway();
  await gw.app.delivery!.flush();
  dbName = new URL(gw.database.url).pathname.slice(1);
  (pg.Client.prototype as { query: unknown }).query = function (this: pg.Client, ...args: unknown[]) {
    queries += 1;
    const first = args[0];
    const text = (first as { text?: unknown } | undefined)?.text;
    queryTexts.push(typeof first === 'string' ? first : typeof text === 'string' ? text : '?');
    return (originalQuery as (...a: unknown[]) => unknown).apply(this, args);
  };
  server = gw.app.http.listen(0, '127.0.0.1');
  await new Promise<void>((r) => server.once('listening', () => r()));
  port = (server.address() as AddressInfo).port;
  // Two real rollouts (the second one open), so the rollout reads have data and a next_cursor.
  for (const device of ['acme-wh-freezer-02', 'acme-wh-door-01']) {
    const body = JSON.stringify({
      selector: { device_ids: [device] },
      settings: { reporting_interval_s: 300 },
      plan: { first_wave_count: 1, success_share: 0.5, abort_share: 0.5, deadline_s: 600 },
    });
    const res = await rawRequest(
      headFor('POST', '/api/rollouts', [
        `Authorization: Bearer ${KEY}`,
        'Content-Type: application/json',
        `Content-Length: ${Buffer.byteLength(body)}`,
      ]),
      [body],
    );
    if (res.status !== 201) throw new Error(`rollout not created: ${res.status} ${res.body}`);
    realRolloutId = String(json(res).rollout_id);
  }
});

afterAll(async () => {
  pg.Client.prototype.query = originalQuery;
  await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
  server?.closeAllConnections();
  await gw?.close();
});

// Every route but the probes, as (method, path) with a concrete path; `body` when the route reads a JSON body.
function protectedRoutes(): { method: string; path: string; body: boolean }[] {
  return [
    { method: 'GET', path: '/api/config', body: false },
    { method: 'POST', path: '/api/reload-registry', body: true },
    { method: 'POST', path: '/api/register-device', body: true },
    { method: 'POST', path: '/api/notify-settings', body: true },
    { method: 'POST', path: '/api/update-settings', body: true },
    { method: 'GET', path: '/api/devices', body: false },
    { method: 'GET', path: `/api/devices/${DEVICE}`, body: false },
    { method: 'POST', path: '/api/rollouts', body: true },
    { method: 'GET', path: '/api/rollouts', body: false },
    { method: 'GET', path: `/api/rollouts/${realRolloutId || FAKE_ROLLOUT}`, body: false },
    ...['pause', 'resume', 'cancel', 'rollback'].map((a) => ({
      method: 'POST',
      path: `/api/rollouts/${realRolloutId || FAKE_ROLLOUT}/${a}`,
      body: true,
    })),
  ];
}

const BAD_AUTHORIZATION: [string, string | string[] | undefined][] = [
  ['missing', undefined],
  ['empty', ''],
  ['scheme only', 'Bearer'],
  ['scheme and space', 'Bearer '],
  ['wrong key', 'Bearer not-a-key'],
  ['key with one character more', `Bearer ${KEY}x`],
  ['key without its last character', `Bearer ${KEY.slice(0, -1)}`],
  ['key prefix with padding', `Bearer ${KEY}==`],
  ['key in another case', `Bearer ${KEY.toUpperCase()}`],
  ['Basic scheme with the key', `Basic ${KEY}`],
  ['Basic scheme, key base64', `Basic ${Buffer.from(`x:${KEY}`).toString('base64')}`],
  ['Token scheme', `Token ${KEY}`],
  ['no scheme', KEY],
  ['scheme glued to the key', `Bearer${KEY}`],
  ['tab instead of space', `Bearer\t${KEY}`],
  ['key followed by a second token', `Bearer ${KEY} ${KEY}`],
  ['two credentials, comma', `Bearer ${KEY}, Bearer ${KEY}`],
  ['key quoted', `Bearer "${KEY}"`],
  ['key percent-encoded', `Bearer ${encodeURIComponent(KEY).replace(/-/g, '%2D')}`],
  ['key with a trailing comma', `Bearer ${KEY},`],
  ['8 KB token', `Bearer ${'A'.repeat(8 * 1024)}`],
  ['non-ASCII', `Bearer ${KEY}\u00e9`],
  ['duplicated header, bad first', ['Bearer not-a-key', `Bearer ${KEY}`]],
  ['duplicated header, good first', [`Bearer ${KEY}`, 'Bearer not-a-key']],
  ['duplicated header, both good', [`Bearer ${KEY}`, `Bearer ${KEY}`]],
];

function authLines(value: string | string[] | undefined): string[] {
  if (value === undefined) return [];
  return (Array.isArray(value) ? value : [value]).map((v) => `Authorization: ${v}`);
}

// ---------------------------------------------------------------------------------------------------------
// 1. Authentication on every route, before the body and the database
// ---------------------------------------------------------------------------------------------------------

describe('1. every route but the probes is behind the API key', () => {
  it('1a the route table: every route except /api/health and /api/ready has an authenticate step', () => {
    const routes = gatewayRoutes({} as GatewayService, (_q, _s, n) => n());
    const open = routes.filter((r) => r.authenticate === undefined).map((r) => `${r.method} ${r.path}`);
    expect(open.sort()).toEqual(['GET /api/health', 'GET /api/ready']);
    // And every authenticated route is one this review attacks below.
    const attacked = new Set(
      protectedRoutes().map(
        (r) => `${r.method} ${r.path.replace(DEVICE, ':device_id').replace(realRolloutId, ':rollout_id')}`,
      ),
    );
    for (const r of routes.filter((x) => x.authenticate !== undefined))
      expect(attacked.has(`${r.method.toUpperCase()} ${r.path}`) ? 'attacked' : `${r.method} ${r.path}`).toBe(
        'attacked',
      );
  });

  it('1b control: the pg spy and pg_stat_activity see an authenticated list query, and nothing when idle', async () => {
    const mark = await dbMark();
    const before = queries;
    await new Promise((r) => setTimeout(r, 300));
    expect(queries).toBe(before); // idle: no background queries in this fixture
    const res = await rawRequest(headFor('GET', '/api/devices?limit=1', [`Authorization: Bearer ${KEY}`]));
    expect(res.status).toBe(200);
    expect(queries).toBeGreaterThan(before);
    expect((await loginActivitySince(mark)).length).toBeGreaterThan(0);
  });

  it('1c every route, every malformed/wrong/missing Authorization: 401 problem+json, no DB query', async () => {
    const failures: string[] = [];
    await expectNoDb('bad Authorization on every route', async () => {
      for (const route of protectedRoutes()) {
        for (const [what, value] of BAD_AUTHORIZATION) {
          if (what === 'duplicated header, good first' || what === 'duplicated header, both good') continue;
          const extra = [...authLines(value)];
          const chunks: string[] = [];
          if (route.body) {
            const body = '{"device_id":"acme-hq-hvac-01","settings":{"reporting_interval_s":5}}';
            extra.push('Content-Type: application/json', `Content-Length: ${body.length}`);
            chunks.push(body);
          }
          const res = await rawRequest(headFor(route.method, route.path, extra), chunks);
          if (res.status !== 401 || !/^application\/problem\+json/.test(header(res, 'content-type') ?? ''))
            failures.push(`${route.method} ${route.path} [${what}] -> ${res.status}`);
          else expect401(res, `${route.method} ${route.path} [${what}]`);
        }
      }
    });
    expect(failures).toEqual([]);
  });

  it('1d HEAD on every GET route without a key: 401 (no body), no DB query', async () => {
    await expectNoDb('HEAD', async () => {
      for (const route of protectedRoutes().filter((r) => r.method === 'GET')) {
        const res = await rawRequest(headFor('HEAD', route.path));
        expect401(res, `HEAD ${route.path}`, true);
      }
    });
  });

  it('1e a duplicated Authorization header is refused (401), whichever copy holds the key', async () => {
    // RFC 9110 §5.3: Authorization is a singleton field; two copies is a malformed request. node:http keeps the
    // first copy and discards the others silently, so the gateway authenticates whichever one a proxy did not check.
    const outcomes: string[] = [];
    for (const [what, value] of BAD_AUTHORIZATION.filter(([w]) => w.startsWith('duplicated'))) {
      const res = await rawRequest(headFor('GET', '/api/config', authLines(value)));
      outcomes.push(`${what} -> ${res.status}`);
    }
    expect(outcomes).toEqual([
      'duplicated header, bad first -> 401',
      'duplicated header, good first -> 401',
      'duplicated header, both good -> 401',
    ]);
  });

  it("1f an Authorization header over node:http's header limit is refused before the app (431/400), no DB query", async () => {
    await expectNoDb('oversized header', async () => {
      const res = await rawRequest(
        headFor('POST', '/api/notify-settings', [`Authorization: Bearer ${'A'.repeat(20 * 1024)}`]),
      );
      // node:http's own answer (not problem+json, the app never sees it): informational, see the report.
      expect([400, 401, 431]).toContain(res.status);
    });
  });

  const bodyRoutes = (): { method: string; path: string; body: boolean }[] =>
    protectedRoutes().filter((r) => r.body);

  it('1g unauthenticated 10 MB body: 401 before the body is sent, no DB query', async () => {
    await expectNoDb('10 MB', async () => {
      for (const route of bodyRoutes()) {
        for (const auth of [[], ['Authorization: Bearer not-a-key']]) {
          // Headers and the first 64 KiB only: the answer must come without the other 9.9 MB.
          const res = await rawRequest(
            headFor(route.method, route.path, [
              ...auth,
              'Content-Type: application/json',
              `Content-Length: ${10 * 1024 * 1024}`,
            ]),
            [Buffer.alloc(64 * 1024, 0x20)],
            3000,
          );
          expect401(res, `${route.path} 10MB ${auth.length}`);
          expect(res.ms).toBeLessThan(2000);
        }
      }
    });
  });

  it('1h unauthenticated never-finishing chunked body: 401 at once, no DB query', async () => {
    await expectNoDb('chunked', async () => {
      for (const route of bodyRoutes()) {
        const res = await rawRequest(
          headFor(route.method, route.path, [
            'Authorization: Bearer not-a-key',
            'Content-Type: application/json',
            'Transfer-Encoding: chunked',
          ]),
          ['5\r\n{"a":\r\n'],
          3000,
        );
        expect401(res, `${route.path} chunked`);
        expect(res.ms).toBeLessThan(2000);
      }
    });
  });

  it('1i unauthenticated malformed, non-JSON, gzip-garbage, 100-continue bodies: 401 (never 400/413/415)', async () => {
    const cases: [string, string[], string][] = [
      ['malformed', ['Content-Type: application/json'], '{"device_id": '],
      ['text', ['Content-Type: text/plain'], 'hello'],
      ['no type', [], 'hello'],
      ['gzip garbage', ['Content-Type: application/json', 'Content-Encoding: gzip'], 'not gzip at all'],
      ['bad charset', ['Content-Type: application/json; charset=ebcdic'], '{}'],
      ['length mismatch', ['Content-Type: application/json', 'Content-Length: 2'], '{"a":1}'],
      ['100-continue', ['Content-Type: application/json', 'Expect: 100-continue'], '{}'],
    ];
    await expectNoDb('odd bodies', async () => {
      for (const route of bodyRoutes()) {
        for (const [what, extra, body] of cases) {
          const lines = [...extra];
          if (!lines.some((l) => l.startsWith('Content-Length')))
            lines.push(`Content-Length: ${body.length}`);
          const res = await rawRequest(headFor(route.method, route.path, lines), [body]);
          expect401(res, `${route.path} ${what}`);
        }
      }
    });
  });

  it('1l after the 401 the gateway stops reading an unauthenticated body (closes), it does not drain 50 MB', async () => {
    // What the server does with the rest of a body it refused: node:http's default is req._dump(), reading and
    // discarding it all (up to server.requestTimeout, 300 s) on a keep-alive connection.
    const outcome = await new Promise<{ status: string; acceptedAfter401: number; closedBy: string }>(
      (resolve) => {
        const socket = connect(port, '127.0.0.1');
        let got401 = false;
        let acceptedAfter401 = 0;
        let closedBy = 'nobody';
        let text = '';
        const finish = (): void => {
          clearTimeout(timer);
          socket.destroy();
          resolve({ status: text.split('\r\n')[0] ?? '', acceptedAfter401, closedBy });
        };
        const timer = setTimeout(finish, 4000);
        socket.on('error', (err: NodeJS.ErrnoException) => {
          closedBy = `server (${err.code ?? 'error'})`;
          finish();
        });
        socket.on('end', () => {
          closedBy = 'server (FIN)';
          finish();
        });
        socket.on('data', (d: Buffer) => {
          text += d.toString('latin1');
          if (got401 && /HTTP\/1\.1 200 OK/.test(text)) {
            closedBy = 'nobody: the server read all 50 MB and answered the next pipelined request';
            finish();
            return;
          }
          if (!got401 && / 401 /.test(text)) {
            got401 = true;
            const chunk = Buffer.alloc(256 * 1024, 0x20);
            const pump = (): void => {
              while (!socket.destroyed && acceptedAfter401 < 50 * 1024 * 1024) {
                acceptedAfter401 += chunk.length;
                if (!socket.write(chunk)) {
                  socket.once('drain', pump);
                  return;
                }
              }
              if (acceptedAfter401 >= 50 * 1024 * 1024) {
                // Proof that the server read (and discarded) every byte: a request pipelined after them is answered.
                socket.write(`${headFor('GET', '/api/health')}\r\n`);
              }
            };
            pump();
          }
        });
        socket.on('connect', () => {
          socket.write(
            `${headFor('POST', '/api/notify-settings', ['Content-Type: application/json', `Content-Length: ${50 * 1024 * 1024 + 65536}`])}\r\n`,
          );
          socket.write(Buffer.alloc(65536, 0x20));
        });
      },
    );
    console.log('unauthenticated 50 MB body after the 401:', JSON.stringify(outcome));
    expect(outcome.status).toMatch(/ 401 /);
    expect(outcome.closedBy).toMatch(/^server/);
    expect(outcome.acceptedAfter401).toBeLessThan(16 * 1024 * 1024);
  });

  it('1o a 401 to a request without a body keeps the connection (only an unread body closes it)', async () => {
    const res = await rawRequest(headFor('GET', '/api/devices'));
    expect(res.status).toBe(401);
    expect(header(res, 'connection')).not.toBe('close');
    const posted = await rawRequest(
      headFor('POST', '/api/notify-settings', ['Content-Type: application/json', 'Content-Length: 2']),
    );
    expect(posted.status).toBe(401);
    expect(header(posted, 'connection')).toBe('close');
  });

  it('1p with the key, a declared Content-Length over the limit is 413 at once, before any body byte, and closes', async () => {
    const res = await rawRequest(
      headFor('POST', '/api/notify-settings', [
        `Authorization: Bearer ${KEY}`,
        'Content-Type: application/json',
        'Content-Length: 50000000',
      ]),
      [],
      2000,
    );
    expect(res.status).toBe(413);
    expect(json(res).code).toBe('payload_too_large');
    expect(header(res, 'connection')).toBe('close');
  });

  it('1m after the 401 the gateway closes a connection whose unauthenticated body never ends (within 3 s)', async () => {
    const closed = await new Promise<string>((resolve) => {
      const socket = connect(port, '127.0.0.1');
      let text = '';
      let answeredAt = 0;
      const timer = setTimeout(() => {
        socket.destroy();
        resolve(`still open 3 s after the 401 (${text.split('\r\n')[0] ?? ''})`);
      }, 3000 + 500);
      const done = (how: string): void => {
        clearTimeout(timer);
        socket.destroy();
        resolve(`${how} ${Math.round(performance.now() - answeredAt)} ms after the 401`);
      };
      socket.on('error', () => done('reset'));
      socket.on('end', () => done('closed'));
      socket.on('data', (d: Buffer) => {
        text += d.toString('latin1');
        if (answeredAt === 0 && / 401 /.test(text)) answeredAt = performance.now();
      });
      socket.on('connect', () => {
        socket.write(
          `${headFor('POST', '/api/rollouts', ['Content-Type: application/json', 'Transfer-Encoding: chunked'])}\r\n5\r\n{"a":\r\n`,
        );
        // A byte of body every 200 ms, forever: what a slow client or an attacker holding connections sends.
        const drip = setInterval(
          () => (socket.destroyed ? clearInterval(drip) : socket.write('1\r\n \r\n')),
          200,
        );
        socket.once('close', () => clearInterval(drip));
      });
    });
    console.log('never-finishing unauthenticated body:', closed);
    expect(closed).toMatch(/^(closed|reset) /);
  });

  it('1j unauthenticated notify with a valid body changes nothing (side effect check)', async () => {
    const before = gw.app.state.settingsDocument(DEVICE)!.version;
    const body = JSON.stringify({ device_id: DEVICE, settings: { reporting_interval_s: 4242 } });
    for (const path of ['/api/notify-settings', '/api/update-settings']) {
      const res = await rawRequest(
        headFor('POST', path, ['Content-Type: application/json', `Content-Length: ${body.length}`]),
        [body],
      );
      expect401(res, path);
    }
    expect(gw.app.state.settingsDocument(DEVICE)!.version).toBe(before);
  });

  it('1k control: with the key, each route gets past authentication (not 401)', async () => {
    for (const route of protectedRoutes()) {
      if (route.path.endsWith('/rollback') || route.path.endsWith('/cancel')) continue;
      const extra = [`Authorization: bearer  ${KEY} `];
      const chunks: string[] = [];
      if (route.body) {
        extra.push('Content-Type: application/json', 'Content-Length: 1');
        chunks.push('{'); // malformed: reaches the body reader only after authentication
      }
      const res = await rawRequest(headFor(route.method, route.path, extra), chunks);
      expect(`${route.method} ${route.path} ${res.status}`).not.toMatch(/ 401$/);
      const code = route.body ? (json(res).code as string) : 'invalid_json';
      expect(`${route.path} ${code}`).toBe(`${route.path} invalid_json`);
    }
  });
});

// ---------------------------------------------------------------------------------------------------------
// 2. The key: compared in constant time, held hashed, never logged
// ---------------------------------------------------------------------------------------------------------

describe('2. the API key is held hashed and never logged', () => {
  it('2a SecretSet shows no key through JSON, util.inspect or String', () => {
    const keys = new SecretSet(API_KEYS);
    const shown = [
      JSON.stringify(keys),
      inspect(keys, { showHidden: true, depth: 10 }),
      `${keys as unknown as string}`,
    ].join('\n');
    for (const k of API_KEYS) expect(shown).not.toContain(k);
    expect(keys.has(KEY)).toBe(true);
    expect(keys.has(`${KEY}x`)).toBe(false);
  });

  it('2b a gateway logging at debug writes no key in any line (good, bad, near-miss keys, errors)', async () => {
    let out = '';
    const stream = new Writable({
      write(chunk: Buffer, _enc, cb) {
        out += chunk.toString();
        cb();
      },
    });
    const logger = createLogger({ service: 'review', level: 'debug', stream });
    const config = loadGatewayConfig({
      DATABASE_URL: loginUrl(gw.database.url),
      GATEWAY_API_KEYS: API_KEYS.join(','),
      GATEWAY_CLUSTER_BUS: 'false',
    });
    const keys = new SecretSet(API_KEYS);
    const app = buildApp({ config, logger, db: gw.reader, apiKeys: () => keys });
    await app.service.reload();
    const s = app.http.listen(0, '127.0.0.1');
    await new Promise<void>((r) => s.once('listening', () => r()));
    const p = (s.address() as AddressInfo).port;
    const near = `${KEY.slice(0, -1)}Z`;
    try {
      const tries: [string, Record<string, string>, string?][] = [
        ['/api/config', { Authorization: `Bearer ${KEY}` }],
        ['/api/config', { Authorization: `Bearer ${near}` }],
        ['/api/config', { Authorization: `Basic ${KEY}` }],
        ['/api/devices?cursor=%%%', { Authorization: `Bearer ${KEY}` }],
        [`/api/devices/${DEVICE}`, { Authorization: `Bearer ${API_KEYS[1]!}` }],
        [
          '/api/notify-settings',
          { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
          '{"x":',
        ],
        [
          '/api/notify-settings',
          { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
          JSON.stringify({ device_id: 'nope-device', settings: { reporting_interval_s: 60 } }),
        ],
        ['/api/reload-registry', { Authorization: `Bearer ${KEY}` }, ''],
      ];
      for (const [path, headers, body] of tries) {
        await fetch(`http://127.0.0.1:${p}${path}`, {
          method: body === undefined ? 'GET' : 'POST',
          headers,
          ...(body === undefined ? {} : { body }),
        });
      }
    } finally {
      await new Promise<void>((r) => s.close(() => r()));
      await app.coap.close(50).catch(() => undefined);
    }
    expect(out.length).toBeGreaterThan(0);
    for (const k of [...API_KEYS, near]) expect(out).not.toContain(k);
    expect(out).not.toMatch(/Bearer [A-Za-z0-9]/);
  });
});

// ---------------------------------------------------------------------------------------------------------
// 3. Cursors
// ---------------------------------------------------------------------------------------------------------

const b64 = (s: string): string => Buffer.from(s, 'utf8').toString('base64url');
const b64std = (s: string): string => Buffer.from(s, 'utf8').toString('base64');

function hostileCursors(): [string, string][] {
  return [
    ['empty', ''],
    ['invalid base64', '%%%'],
    ['dots', '....'],
    ['padding (base64url with =)', `${b64('["1700000000000000","acme-hq-hvac-01"]')}=`],
    ['standard base64 with + and /', b64std('?>?>?>["1700000000000000","acme-hq-hvac-01"]')],
    ['non-JSON', b64('hello')],
    ['JSON number', b64('12')],
    ['huge JSON number', b64('1e999999')],
    ['JSON null', b64('null')],
    ['JSON object', b64('{"at":"1","id":"acme-hq-hvac-01"}')],
    ['array of 1', b64('["1700000000000000"]')],
    ['array of 3', b64('["1700000000000000","acme-hq-hvac-01",1]')],
    ['numbers instead of strings', b64('[1700000000000000,"acme-hq-hvac-01"]')],
    ['huge time', b64('["99999999999999999999999","acme-hq-hvac-01"]')],
    ['float time', b64('["1.5","acme-hq-hvac-01"]')],
    ['exponent time', b64('["1e20","acme-hq-hvac-01"]')],
    ['ISO time', b64('["2024-01-01T00:00:00Z","acme-hq-hvac-01"]')],
    ['invalid time text', b64('["infinity","acme-hq-hvac-01"]')],
    ['nested', b64('[["1"],{"a":{"b":[]}}]')],
    ['deep nesting', b64(`${'['.repeat(150)}${']'.repeat(150)}`)],
    ['NUL in id', b64('["1700000000000000","acme\\u0000x"]')],
    ['raw NUL byte', Buffer.from([0x5b, 0x00, 0x5d]).toString('base64url')],
    ['lone surrogate', b64('["1700000000000000","\\ud800"]')],
    ['invalid UTF-8', Buffer.from([0x5b, 0x22, 0xff, 0xfe, 0x22, 0x5d]).toString('base64url')],
    ['SQL in id', b64(`["1700000000000000","x' OR 1=1 --"]`)],
    ['SQL in time', b64(`["1; DROP TABLE x","acme-hq-hvac-01"]`)],
    ['__proto__', b64('{"__proto__":{"x":1}}')],
    ['12 KB', 'A'.repeat(12 * 1024)],
    ['12 KB of JSON string', b64(`["1","${'a'.repeat(9000)}"]`)],
    ['rollout cursor r:0', b64('r:0')],
    ['rollout cursor r:-1', b64('r:-1')],
    ['rollout cursor huge', b64('r:99999999999999999999')],
    ['rollout cursor with SQL', b64("r:1' OR '1'='1")],
    ['rollout cursor with NUL', b64('r:1\u0000')],
    ['rollout cursor leading zero', b64('r:01')],
  ];
}

describe('3. cursors never 500, never a stack', () => {
  it('3a GET /api/devices: every hostile cursor is 400 invalid_query (or a valid page), never 5xx', async () => {
    const rows: string[] = [];
    const auth = [`Authorization: Bearer ${KEY}`];
    const rolloutCursor = b64('r:1');
    for (const [what, cursor] of [
      ...hostileCursors(),
      ['a rollout cursor', rolloutCursor] as [string, string],
    ]) {
      const res = await rawRequest(headFor('GET', `/api/devices?cursor=${encodeURIComponent(cursor)}`, auth));
      rows.push(`${what} -> ${res.status} ${(json(res).code as string) ?? ''}`);
      expect(res.status).toBeLessThan(500);
      expectProblem(res, `devices cursor ${what}`, [400], 'invalid_query');
    }
  });

  it('3b GET /api/devices: cursors at the edges of the accepted time range are 200 or 400, never 5xx', async () => {
    const auth = [`Authorization: Bearer ${KEY}`];
    const out: string[] = [];
    for (const at of ['0', '-0', '-99999999999999999', '99999999999999999', '00000000000000000']) {
      for (const id of [DEVICE, 'zzzz', 'a']) {
        const res = await rawRequest(
          headFor('GET', `/api/devices?cursor=${b64(JSON.stringify([at, id]))}`, auth),
        );
        out.push(`${at},${id} -> ${res.status}`);
        expect(`${at},${id} -> ${res.status}`).toMatch(/ -> (200|400)$/);
        const items = res.status === 200 ? (json(res) as { items: unknown }).items : [];
        expect(Array.isArray(items)).toBe(true);
      }
    }
  });

  it('3c GET /api/rollouts: every hostile cursor is 400 invalid_query, never 5xx; a devices cursor too', async () => {
    const auth = [`Authorization: Bearer ${KEY}`];
    const devicesCursor = b64(JSON.stringify(['1700000000000000', DEVICE]));
    for (const [what, cursor] of [
      ...hostileCursors().filter(([w]) => !/^rollout cursor (huge|r:0|r:-1|with|leading)/.test(w) || true),
      ['a devices cursor', devicesCursor] as [string, string],
    ]) {
      const res = await rawRequest(
        headFor('GET', `/api/rollouts?cursor=${encodeURIComponent(cursor)}`, auth),
      );
      expectProblem(res, `rollouts cursor ${what}`, [400], 'invalid_query');
    }
  });

  it('3d control: real next_cursors page through both lists', async () => {
    const auth = [`Authorization: Bearer ${KEY}`];
    const d1 = json(await rawRequest(headFor('GET', '/api/devices?limit=1', auth))) as {
      next_cursor: string;
    };
    expect(typeof d1.next_cursor).toBe('string');
    const d2 = await rawRequest(headFor('GET', `/api/devices?limit=1&cursor=${d1.next_cursor}`, auth));
    expect(d2.status).toBe(200);
    const r1 = json(await rawRequest(headFor('GET', '/api/rollouts?limit=1', auth))) as {
      next_cursor: string;
    };
    expect(typeof r1.next_cursor).toBe('string');
    const r2 = await rawRequest(headFor('GET', `/api/rollouts?limit=1&cursor=${r1.next_cursor}`, auth));
    expect(r2.status).toBe(200);
    // Each list's cursor on the other list is refused.
    expectProblem(
      await rawRequest(headFor('GET', `/api/rollouts?cursor=${d1.next_cursor}`, auth)),
      'devices cursor on rollouts',
      [400],
      'invalid_query',
    );
    expectProblem(
      await rawRequest(headFor('GET', `/api/devices?cursor=${r1.next_cursor}`, auth)),
      'rollouts cursor on devices',
      [400],
      'invalid_query',
    );
  });

  it('3e a 1 MB cursor is refused before the app (node:http 431/414/400), the gateway keeps serving', async () => {
    const auth = [`Authorization: Bearer ${KEY}`];
    const res = await rawRequest(
      headFor('GET', `/api/devices?cursor=${'A'.repeat(1024 * 1024)}`, auth),
      [],
      5000,
    ).catch((err: Error) => ({ status: 0, body: err.message }) as RawResponse);
    expect([0, 400, 414, 431]).toContain(res.status);
    expect((await rawRequest(headFor('GET', '/api/health'))).status).toBe(200);
  });
});

// ---------------------------------------------------------------------------------------------------------
// 4. Query parameters and path ids
// ---------------------------------------------------------------------------------------------------------

describe('4. query parameters and path ids: 400/404 problem+json, never 500', () => {
  const SITE = 'a1000000-0000-4000-8000-000000000001';
  it.each(
    (
      [
        ['/api/devices', 'limit=1&limit=2'],
        ['/api/devices', 'limit[]=1'],
        ['/api/devices', 'limit[a]=1'],
        ['/api/devices', 'limit=99999999999999999999999'],
        ['/api/devices', 'limit=501'],
        ['/api/devices', 'limit=0'],
        ['/api/devices', 'limit=-1'],
        ['/api/devices', 'limit=abc'],
        ['/api/devices', 'limit=1e2'],
        ['/api/devices', 'limit=0x10'],
        ['/api/devices', 'limit=1.0'],
        ['/api/devices', 'limit='],
        ['/api/devices', 'limit=%201'],
        ['/api/devices', 'limit=1%00'],
        ['/api/devices', 'limit=%D9%A1'], // Arabic-Indic digit one
        ['/api/devices', 'site_id=not-a-uuid'],
        ['/api/devices', `site_id=${SITE}&site_id=${SITE}`],
        ['/api/devices', `site_id=${SITE}%00`],
        ['/api/devices', `site_id=${SITE}'--`],
        ['/api/devices', `site_id={${SITE}}`],
        ['/api/devices', 'delivery=bogus'],
        ['/api/devices', 'delivery[]=pending'],
        ['/api/devices', 'delivery=pending&delivery=stale'],
        ['/api/devices', 'delivery=PENDING'],
        ['/api/devices', 'cursor=a&cursor=b'],
        ['/api/devices', '__proto__=1'],
        ['/api/devices', 'constructor=1'],
        ['/api/devices', 'hasOwnProperty=1'],
        ['/api/devices', 'toString=1'],
        ['/api/devices', 'state=active'],
        ['/api/devices', `${'x'.repeat(5000)}=1`],
        ['/api/devices', '%=1'],
        ['/api/rollouts', 'limit=1&limit=2'],
        ['/api/rollouts', 'limit=101'],
        ['/api/rollouts', 'limit=-5'],
        ['/api/rollouts', 'state=bogus'],
        ['/api/rollouts', 'state[]=active'],
        ['/api/rollouts', 'state=active&state=paused'],
        ['/api/rollouts', 'delivery=pending'],
        ['/api/rollouts', 'site_id=x'],
      ] as [string, string][]
    ).map(([p, q]) => [`${p}?${q}`.slice(0, 70), p, q] as const),
  )('4a %s is 400 invalid_query', async (_label, path, query) => {
    const res = await rawRequest(headFor('GET', `${path}?${query}`, [`Authorization: Bearer ${KEY}`]));
    expectProblem(res, `${path}?${query}`, [400], 'invalid_query');
  });

  it.each(
    (
      [
        ['/api/devices/acme-hq-hvac-01%2F..%2F..%2Fconfig', [404]],
        ['/api/devices/..', [404]],
        ['/api/devices/.', [404]],
        ['/api/devices/%2E%2E', [404]],
        ['/api/devices/../config', [404]],
        ['/api/devices/..%2Fconfig', [404]],
        ['/api/devices/%2F', [404]],
        ['/api/devices/%00', [404]],
        ['/api/devices/acme-hq-hvac-01%00', [404]],
        [`/api/devices/${'a'.repeat(10000)}`, [404]], // 10,000-character id
        // A path express cannot percent-decode is 404 not_found "The request path is not valid." (service-kit
        // COMMON_ERRORS.invalidPath): by design, answered by the router before authentication.
        ['/api/devices/%E0%A4%A', [400, 404]],
        ['/api/devices/%', [400, 404]],
        ['/api/devices/%C0%AF', [400, 404]],
        ['/api/devices/%ED%A0%80', [400, 404]], // an encoded lone surrogate
        ['/api/devices/ACME-HQ-HVAC-01', [404]],
        ['/api/devices/acme-hq-hvac-01%20', [404]],
        ['/api/devices/%3Cscript%3E', [404]],
        ['/api/devices/acme-hq-hvac-01;x', [404]],
        ['/api/rollouts/not-a-uuid', [404]],
        ['/api/rollouts/%2E%2E', [404]],
        [`/api/rollouts/${FAKE_ROLLOUT}%00`, [404]],
        [`/api/rollouts/${FAKE_ROLLOUT}`, [404]],
        [`/api/rollouts/${FAKE_ROLLOUT.toUpperCase()}`, [404]],
        [`/api/rollouts/{${FAKE_ROLLOUT}}`, [404]],
        ['/api/rollouts/%', [400, 404]],
      ] as [string, number[]][]
    ).map(([p, st]) => [p.slice(0, 70), p, st] as const),
  )('4b GET %s is 400/404 problem+json, never 5xx', async (_label, path, statuses) => {
    const res = await rawRequest(headFor('GET', path, [`Authorization: Bearer ${KEY}`]));
    expectProblem(res, path, statuses);
    // Never echoes a non-id path segment.
    expect(res.body).not.toContain('<script>');
    expect(res.body).not.toContain('a'.repeat(200));
  });

  it('4c the same path attacks on the rollout actions (POST) are 404/400, never 5xx', async () => {
    for (const id of ['not-a-uuid', '%2E%2E', `${FAKE_ROLLOUT}%00`, FAKE_ROLLOUT, '%']) {
      for (const action of ['pause', 'resume', 'cancel', 'rollback']) {
        const res = await rawRequest(
          headFor('POST', `/api/rollouts/${id}/${action}`, [
            `Authorization: Bearer ${KEY}`,
            'Content-Length: 0',
          ]),
        );
        expectProblem(res, `${id}/${action}`, [400, 404]);
      }
    }
  });
});

// ---------------------------------------------------------------------------------------------------------
// 5. Method confusion, OPTIONS/HEAD, error bodies, Location
// ---------------------------------------------------------------------------------------------------------

describe('5. methods, error bodies, Location', () => {
  it('5a other methods without a key: 405 problem+json with Allow (or 401), never 2xx, no DB query, no body read', async () => {
    await expectNoDb('methods', async () => {
      for (const route of protectedRoutes()) {
        for (const method of [
          'PUT',
          'PATCH',
          'DELETE',
          'TRACE',
          'PROPFIND',
          ...(route.method === 'GET' ? ['POST'] : ['GET']),
        ]) {
          const res = await rawRequest(
            headFor(method, route.path, [
              'Content-Type: application/json',
              `Content-Length: ${10 * 1024 * 1024}`,
            ]),
            ['{'],
            3000,
          );
          expect(`${method} ${route.path} ${res.status}`).toMatch(/ (401|405|400|501)$/);
          if (res.status !== 501 && res.status !== 400)
            expectProblem(res, `${method} ${route.path}`, [401, 405]);
        }
      }
    });
  });

  it('5b OPTIONS without a key answers only Allow (no body, no DB query)', async () => {
    await expectNoDb('OPTIONS', async () => {
      for (const route of protectedRoutes()) {
        const res = await rawRequest(headFor('OPTIONS', route.path));
        expect([204, 401]).toContain(res.status);
        expect(res.body).toBe('');
        for (const name of Object.keys(res.headers))
          expect([
            'allow',
            'x-request-id',
            'date',
            'connection',
            'keep-alive',
            'www-authenticate',
            'content-type',
            'content-length',
            'cache-control',
          ]).toContain(name);
      }
    });
  });

  it('5c path case and trailing-slash variants of protected routes still need the key', async () => {
    await expectNoDb('variants', async () => {
      for (const path of [
        '/API/CONFIG',
        '/api/config/',
        '/Api/Devices',
        '/api/devices/',
        `/api/ROLLOUTS/${FAKE_ROLLOUT}/PAUSE`,
      ]) {
        const res = await rawRequest(
          headFor(path.toLowerCase().includes('pause') ? 'POST' : 'GET', path, ['Content-Length: 0']),
        );
        expect(`${path} ${res.status}`).toMatch(/ (401|404)$/);
      }
    });
  });

  it('5d X-Request-Id cannot inject headers; Location headers carry only ids', async () => {
    const evil = await rawRequest(headFor('GET', '/api/health', ['X-Request-Id: a%0d%0aSet-Cookie:x=1']));
    expect(header(evil, 'x-request-id')).not.toContain('%0d');
    expect(evil.headers['set-cookie']).toBeUndefined();
    const body = JSON.stringify({ device_id: DEVICE, settings: { reporting_interval_s: 61 } });
    const res = await rawRequest(
      headFor('POST', '/api/notify-settings', [
        `Authorization: Bearer ${KEY}`,
        'Content-Type: application/json',
        `Content-Length: ${body.length}`,
      ]),
      [body],
    );
    expect(res.status).toBe(200);
    expect(header(res, 'location')).toBe(`/api/devices/${DEVICE}`);
  });

  it('5e unknown /api paths are 404 problem+json without auth or body read, never leaking the route table', async () => {
    await expectNoDb('unknown', async () => {
      for (const path of [
        '/api',
        '/api/',
        '/api/devices/a/b',
        '/api/rollouts/x/y/z',
        '/api/config.json',
        '/api//config',
      ]) {
        const res = await rawRequest(headFor('GET', path));
        expectProblem(res, path, [404]);
      }
    });
  });
});

describe('5f. the public endpoints', () => {
  it('5f /api/health, /api/ready and /metrics answer without a key, without a DB query, with no key or device id', async () => {
    await expectNoDb('public endpoints', async () => {
      for (const path of ['/api/health', '/api/ready', '/metrics']) {
        const res = await rawRequest(headFor('GET', path));
        expect(`${path} ${res.status}`).toBe(`${path} 200`);
        for (const k of API_KEYS) expect(res.body).not.toContain(k);
        expect(res.body).not.toContain(DEVICE);
        expect(res.body).not.toMatch(/sha256:[0-9a-f]{12}/);
      }
    });
  });
});

describe('1n. with the replica bus wired (GATEWAY_CLUSTER_BUS=true)', () => {
  it('1n unauthenticated notify/update/reload/register publish nothing on the bus (no query); with the key they do', async () => {
    const config = loadGatewayConfig({
      DATABASE_URL: loginUrl(gw.database.url),
      GATEWAY_API_KEYS: API_KEYS.join(','),
      GATEWAY_CLUSTER_BUS: 'true',
    });
    const keys = new SecretSet(API_KEYS);
    const logger = createLogger({
      service: 'review-bus',
      level: 'error',
      stream: new Writable({ write: (_c, _e, cb) => cb() }),
    });
    const app = buildApp({ config, logger, db: gw.reader, apiKeys: () => keys });
    await app.service.reload();
    const s = app.http.listen(0, '127.0.0.1');
    await new Promise<void>((r) => s.once('listening', () => r()));
    const p = (s.address() as AddressInfo).port;
    const body = JSON.stringify({ device_id: DEVICE, settings: { reporting_interval_s: 4343 } });
    const post = (path: string, auth?: string): Promise<Response> =>
      fetch(`http://127.0.0.1:${p}${path}`, {
        method: 'POST',
        headers: {
          'Content-Type': 'application/json',
          ...(auth === undefined ? {} : { Authorization: auth }),
        },
        body,
      });
    try {
      await expectNoDb('bus, unauthenticated', async () => {
        for (const path of [
          '/api/notify-settings',
          '/api/update-settings',
          '/api/reload-registry',
          '/api/register-device',
        ])
          for (const auth of [undefined, 'Bearer nope', `Basic ${KEY}`])
            expect(`${path} ${(await post(path, auth)).status}`).toBe(`${path} 401`);
        // The device view asks every replica over the bus (Inspector.gather); the list reads the record.
        for (const path of [`/api/devices/${DEVICE}`, '/api/devices', '/api/rollouts'])
          for (const auth of [undefined, 'Bearer nope'])
            expect(
              `${path} ${(await fetch(`http://127.0.0.1:${p}${path}`, auth === undefined ? {} : { headers: { Authorization: auth } })).status}`,
            ).toBe(`${path} 401`);
      });
      const before = queries;
      const ok = await post('/api/notify-settings', `Bearer ${KEY}`);
      const issued = queryTexts.slice(before).join('\n');
      console.log('bus control: authenticated notify ->', ok.status, '; queries:', queries - before);
      expect(queries - before).toBeGreaterThan(0);
      expect(issued.length).toBeGreaterThan(0);
    } finally {
      await new Promise<void>((r) => s.close(() => r()));
      await app.coap.close(50).catch(() => undefined);
    }
  });
});
