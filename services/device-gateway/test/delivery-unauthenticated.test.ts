// The record knows a relation that cannot speak for its device (issue 40 §2; design §3.8; migration 0042): two
// gateway replicas (real processes) on one PostgreSQL, libcoap's coap-client-notls observing a keyed device's
// settings over plain CoAP on replica A. The fleet list, read through either replica, says
// observed_unauthenticated (it said unobserved, as if nothing watched the device); when the relation ends the
// device is unobserved again. A keyless device observed the same way is a plain observer that counts.
import { spawn, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import {
  createTestDatabase,
  freePort,
  startPostgres,
  type PostgresServer,
  type TestDatabase,
} from '@platform/testkit';
import type { Kysely } from 'kysely';
import { issueCredential } from '../src/db/credential-repository.js';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { sleep } from './support/dtls.js';
import { API_KEYS } from './support/gateway.js';
import { startReplica, type Replica } from './support/replicas.js';

jest.setTimeout(120_000);

const KEYED = 'acme-wh-door-01';
const KEYLESS = 'borealis-tower-chiller-01';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

interface Item {
  device_id: string;
  state: string;
  observed_by: string[];
  observed_unauthenticated_by: string[];
}

let pg: PostgresServer;
let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let a: Replica;
let b: Replica;
const children: ChildProcess[] = [];

async function start(name: string): Promise<Replica> {
  return startReplica(name, database.url, {
    GATEWAY_COAP_SECURITY: 'both',
    GATEWAY_COAPS_PORT: String(await freePort('udp')),
    GATEWAY_DELIVERY_FLUSH_MS: '200',
    COAP_MAX_RETRANSMIT: '1',
  });
}

beforeAll(async () => {
  pg = await startPostgres();
  database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg.url });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await seedDevices(owner);
  await issueCredential(owner, KEYED);
  [a, b] = await Promise.all([start('A'), start('B')]);
  await Promise.all([a.waitReady(), b.waitReady()]);
});

afterAll(async () => {
  for (const child of children) child.kill('SIGKILL');
  await a?.stop();
  await b?.stop();
  await owner?.destroy();
  await database?.drop();
  await pg?.stop();
});

/** GET `path` on `r`: status and body. */
async function get(r: Replica, path: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${r.url}${path}`, { headers: auth });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function listed(r: Replica, delivery: string): Promise<Item[]> {
  const res = await get(r, `/api/devices?delivery=${delivery}&limit=100`);
  expect(res.status).toBe(200);
  return res.body.items as Item[];
}

/** The device's item in the fleet list on `r`, once `check` holds (15 s at most). */
async function untilListed(r: Replica, deviceId: string, check: (i: Item) => boolean): Promise<Item> {
  const deadline = Date.now() + 15_000;
  let last: Item | undefined;
  while (Date.now() < deadline) {
    last = (await listed(r, 'not_applied')).find((i) => i.device_id === deviceId);
    if (last !== undefined && check(last)) return last;
    await sleep(100);
  }
  throw new Error(`${deviceId} on ${r.name}: ${JSON.stringify(last)}`);
}

/** coap-client-notls observing the device's settings on `r` for `seconds`; resolves when it exits. */
function observePlain(r: Replica, deviceId: string, seconds: number): Promise<string> {
  const child = spawn(
    'coap-client-notls',
    ['-m', 'get', '-s', String(seconds), `coap://127.0.0.1:${r.coapPort}/devices/${deviceId}/settings`],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  children.push(child);
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  return new Promise((resolve) => child.once('exit', () => resolve(output)));
}

async function originOf(r: Replica): Promise<string> {
  return (await r.cluster()).origin as string;
}

describe('a plain relation to a keyed device in the record', () => {
  it('the fleet list says observed_unauthenticated on both replicas, and unobserved once the relation ends', async () => {
    const originA = await originOf(a);
    // Both devices get a desired content of their own first (the record's row), nobody observing.
    for (const device of [KEYED, KEYLESS])
      expect(
        (await b.post('/api/notify-settings', { device_id: device, settings: { reporting_interval_s: 90 } }))
          .status,
      ).toBe(200);
    await untilListed(b, KEYED, (i) => i.state === 'unobserved');

    const keyedRun = observePlain(a, KEYED, 6);
    const keylessRun = observePlain(a, KEYLESS, 6);
    for (const r of [b, a]) {
      const item = await untilListed(r, KEYED, (i) => i.state === 'observed_unauthenticated');
      expect(item).toMatchObject({ observed_by: [], observed_unauthenticated_by: [originA] });
    }
    // The filter takes the state, alone and among others; unobserved no longer lists the device.
    expect((await listed(b, 'observed_unauthenticated')).map((i) => i.device_id)).toEqual([KEYED]);
    expect((await listed(b, 'stale,observed_unauthenticated')).map((i) => i.device_id)).toContain(KEYED);
    expect((await listed(b, 'unobserved')).map((i) => i.device_id)).not.toContain(KEYED);
    // The device view says the record's state, and shows the relation for what it is.
    const view = await get(b, `/api/devices/${KEYED}`);
    expect(view.body.delivery).toMatchObject({
      state: 'observed_unauthenticated',
      observed_by: [],
      observed_unauthenticated_by: [originA],
    });
    // A keyless device's plain relation speaks for it: observed, not observed_unauthenticated.
    const keyless = await untilListed(b, KEYLESS, (i) => i.observed_by.length > 0);
    expect(keyless).toMatchObject({ observed_by: [originA], observed_unauthenticated_by: [] });
    expect(keyless.state).not.toMatch(/unobserved|observed_unauthenticated/);

    // The observers deregister when their time is up (libcoap cancels its observation); a notification then
    // ends any relation left (its confirmable notification goes unanswered).
    await Promise.all([keyedRun, keylessRun]);
    expect(
      (await b.post('/api/notify-settings', { device_id: KEYED, settings: { reporting_interval_s: 95 } }))
        .status,
    ).toBe(200);
    for (const r of [a, b]) {
      const item = await untilListed(r, KEYED, (i) => i.state === 'unobserved');
      expect(item).toMatchObject({ observed_by: [], observed_unauthenticated_by: [] });
    }
    expect((await listed(a, 'observed_unauthenticated')).map((i) => i.device_id)).toEqual([]);
  });

  it('a replica that stops leaves observed_unauthenticated_by (its last flush and reap)', async () => {
    const originA = await originOf(a);
    void observePlain(a, KEYED, 30);
    await untilListed(b, KEYED, (i) => i.observed_unauthenticated_by.includes(originA));
    await a.stop();
    const item = await untilListed(b, KEYED, (i) => i.state === 'unobserved');
    expect(item.observed_unauthenticated_by).toEqual([]);
  });
});
