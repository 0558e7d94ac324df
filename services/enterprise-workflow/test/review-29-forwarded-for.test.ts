// Review of issue 29 item 9, second half: on the internal webhook (reached without the Ingress) the logged
// client address is the connection's peer, never X-Forwarded-For; `direct` changes nothing for other routes.
// Each test asserts the secure behaviour; a failing test is a finding.
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { demoRowId, demoSites } from '@platform/enterprise-db';
import { createLogger } from '@platform/service-kit';
import { buildApp } from '../src/app.js';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
let server: Server;
let base: string;
const logs: Array<Record<string, unknown>> = [];

beforeAll(async () => {
  h = await startHarness();
  const stream = new PassThrough();
  stream.on('data', (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n'))
      if (line.trim() !== '') logs.push(JSON.parse(line) as Record<string, unknown>);
  });
  const app = buildApp({
    config: {
      media: { maxImageBytes: 1000, maxVideoBytes: 1000, uploadUrlTtlS: 60, downloadUrlTtlS: 60 },
      idempotencyTtlS: 60,
      webhookTokens: WEBHOOK_TOKENS,
      http: { trustProxy: 1 },
    },
    logger: createLogger({ service: 'review', level: 'info', stream }),
    db: h.db,
    storage: h.storage,
    verifier: h.verifier,
  });
  server = createServer(app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await h.close();
});

const SPOOF = '203.0.113.66';

async function loggedIp(method: string, path: string, headers: Record<string, string>, body?: string) {
  const before = logs.length;
  const res = await fetch(`${base}${path}`, {
    method,
    headers: { 'X-Forwarded-For': SPOOF, ...headers },
    ...(body === undefined ? {} : { body }),
  });
  await res.arrayBuffer();
  // The request log line is written on 'close'.
  for (let i = 0; i < 50 && !logs.slice(before).some((l) => l.message === 'http request'); i++)
    await new Promise((r) => setTimeout(r, 10));
  const line = logs.slice(before).find((l) => l.message === 'http request');
  return { status: res.status, ip: line?.ip };
}

const json = { 'Content-Type': 'application/json' };
const auth = { Authorization: `Bearer ${WEBHOOK_TOKENS[0]}` };

it('the webhook route, in every spelling express matches and with every answer, logs the peer, not X-Forwarded-For', async () => {
  const cases: Array<[string, string, Record<string, string>, string | undefined]> = [
    ['POST', '/internal/media/object-created', { ...json, ...auth }, JSON.stringify({ Records: [] })],
    ['POST', '/internal/media/object-created', json, '{}'],
    ['POST', '/internal/media/object-created', { ...json, ...auth }, '{not json'],
    ['POST', '/internal/media/object-created', { 'Content-Type': 'text/plain', ...auth }, 'x'],
    ['POST', '/internal/media/object-created/', { ...json, ...auth }, JSON.stringify({ Records: [] })],
    ['POST', '/INTERNAL/Media/Object-Created', { ...json, ...auth }, JSON.stringify({ Records: [] })],
    ['POST', '/internal/media/object-created?x=1', { ...json, ...auth }, JSON.stringify({ Records: [] })],
    ['HEAD', '/internal/media/object-created', {}, undefined],
    ['GET', '/internal/media/object-created', {}, undefined],
    ['PUT', '/internal/media/object-created', {}, undefined],
    ['OPTIONS', '/internal/media/object-created', {}, undefined],
  ];
  const wrong: string[] = [];
  for (const [method, path, headers, body] of cases) {
    const { status, ip } = await loggedIp(method, path, headers, body);
    if (ip === SPOOF || ip === undefined) wrong.push(`${method} ${path} (${status}): ${String(ip)}`);
  }
  expect(wrong).toEqual([]);
});

it('any other path under /internal/ (never routed by the Ingress, so reached directly) logs the peer too', async () => {
  const wrong: string[] = [];
  for (const path of ['/internal/media/object-created/x', '/internal/', '/internal/media']) {
    const { status, ip } = await loggedIp('POST', path, { ...json, ...auth }, '{}');
    if (ip === SPOOF) wrong.push(`${path} (${status}): ${String(ip)}`);
  }
  expect(wrong).toEqual([]);
});

it('the routes the Ingress never routes (health, readiness; probed straight by the kubelet) log the peer too', async () => {
  const wrong: string[] = [];
  for (const path of ['/health', '/ready']) {
    const { status, ip } = await loggedIp('GET', path, {});
    if (ip === SPOOF) wrong.push(`${path} (${status}): ${String(ip)}`);
  }
  expect(wrong).toEqual([]);
});

it('direct changes nothing for the public routes: behind the one trusted hop they log X-Forwarded-For', async () => {
  const hq = demoSites.acmeHq.id;
  const { ip } = await loggedIp(
    'GET',
    `/sites/${hq}/media/${demoRowId('media_item', 'acmeHq', 1)}/download`,
    {},
  );
  expect(ip).toBe(SPOOF);
});
