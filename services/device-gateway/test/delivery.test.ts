// Delivery visibility (design §3.8) as on-call meets it: two gateway replicas (real processes) on one PostgreSQL,
// libcoap observers (CON, NON, and one over DTLS with an issued key) on replica A, a raw observer that never
// acknowledges, and every question asked through replica B: was the setting received, when, by which replica.
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
import { issueCredential, type IssuedCredential } from '../src/db/credential-repository.js';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { RawCoapClient, observe0, pathOptions } from './support/coap-client.js';
import { waitFor } from './support/dtls.js';
import { API_KEYS } from './support/gateway.js';
import { startReplica, type Replica } from './support/replicas.js';

jest.setTimeout(120_000);

const CON = 'acme-hq-hvac-01';
const NON = 'acme-hq-lobby-sensor-03';
const DTLS = 'acme-wh-door-01';
const SILENT = 'acme-wh-freezer-02';
const UNOBSERVED = 'borealis-tower-chiller-01';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

interface View {
  device: { device_id: string };
  settings: { version: number; source: string; settings: Record<string, unknown> };
  delivery: {
    state: string;
    desired: { version: number; source: string; since: string };
    sent: { version: number; replica: string; transport: string; type: string; acknowledged: boolean } | null;
    acknowledged: {
      version: number;
      at: string;
      replica: string;
      transport: string;
      is_desired: boolean;
    } | null;
    heard_at: string | null;
    observed_by: string[];
  } | null;
  replicas: {
    replica: string;
    self: boolean;
    answered: boolean;
    relations?: { resource: string; transport: string; type: string; con_in_flight: boolean }[];
    relations_total?: number;
    dtls_sessions?: { identity: string }[];
    dtls_sessions_total?: number;
  }[];
  credentials: { valid_keys: number };
}

let pg: PostgresServer;
let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let key: IssuedCredential;
let a: Replica;
let b: Replica;
const replicas: Replica[] = [];
const children: ChildProcess[] = [];
const answers: string[] = [];

async function start(name: string, coapsPort: number): Promise<Replica> {
  const r = await startReplica(name, database.url, {
    GATEWAY_COAP_SECURITY: 'both',
    GATEWAY_COAPS_PORT: String(coapsPort),
    GATEWAY_DELIVERY_FLUSH_MS: '200',
    COAP_MAX_RETRANSMIT: '2',
    LOG_LEVEL: 'debug',
  });
  replicas.push(r);
  await r.waitReady();
  return r;
}

async function get(replica: Replica, path: string, headers: Record<string, string> = auth) {
  const res = await fetch(`${replica.url}${path}`, { headers });
  const text = await res.text();
  answers.push(text);
  return { status: res.status, body: JSON.parse(text) as Record<string, unknown> };
}

async function view(replica: Replica, deviceId: string): Promise<View> {
  const res = await get(replica, `/api/devices/${deviceId}`);
  expect(res.status).toBe(200);
  return res.body as unknown as View;
}

async function until(
  replica: Replica,
  deviceId: string,
  check: (v: View) => boolean,
  what: string,
): Promise<View> {
  let last: View | undefined;
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    last = await view(replica, deviceId);
    if (check(last)) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}: ${JSON.stringify(last)}`);
}

/** A libcoap observer; `output()` is what it printed so far. */
function libcoap(args: string[]): { output: () => string } {
  const child = spawn('coap-client-openssl', ['-m', 'get', '-s', '90', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  return { output: () => output };
}

const versions = (output: string): number[] =>
  [...output.matchAll(/"version":(\d+)/g)].map((m) => Number(m[1]));

async function notify(replica: Replica, deviceId: string, interval: number): Promise<number> {
  const res = await replica.post('/api/notify-settings', {
    device_id: deviceId,
    settings: { reporting_interval_s: interval },
  });
  expect(res.status).toBe(200);
  expect(res.body).toMatchObject({ status: 'updated', version: expect.any(Number) });
  expect(res.headers.get('location')).toBe(`/api/devices/${deviceId}`);
  return interval;
}

beforeAll(async () => {
  pg = await startPostgres();
  database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg.url });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await seedDevices(owner);
  key = await issueCredential(owner, DTLS);
  const [portA, portB] = [await freePort('udp'), await freePort('udp')];
  [a, b] = await Promise.all([start('A', portA), start('B', portB)]);
  (a as Replica & { coapsPort?: number }).coapsPort = portA;
});

afterAll(async () => {
  for (const child of children) child.kill('SIGKILL');
  for (const r of replicas) await r.stop();
  await owner?.destroy();
  await database?.drop();
  await pg?.stop();
});

describe('where a setting went, across two replicas', () => {
  let silent: RawCoapClient;
  const originOf = async (r: Replica): Promise<string> => (await r.cluster()).origin as string;

  it('unauthenticated reads are 401 before any work', async () => {
    for (const path of [`/api/devices/${CON}`, '/api/devices', `/api/devices/no-such-device`]) {
      const res = await get(b, path, {});
      expect(res.status).toBe(401);
      expect(res.body.code).toBe('unauthorized');
    }
  });

  it('an unknown device is 404 unknown_device', async () => {
    const res = await get(b, '/api/devices/no-such-device');
    expect(res.status).toBe(404);
    expect(res.body.code).toBe('unknown_device');
  });

  it('CON and DTLS observers on A acknowledge a change made through B; B and A say the same', async () => {
    const coapsA = (a as Replica & { coapsPort: number }).coapsPort;
    const con = libcoap([`coap://127.0.0.1:${a.coapPort}/devices/${CON}/settings`]);
    const dtls = libcoap([
      '-u',
      key.identity,
      '-k',
      key.keyText,
      `coaps://127.0.0.1:${coapsA}/devices/${DTLS}/settings`,
    ]);
    await waitFor(
      () => versions(con.output()).length >= 1 && versions(dtls.output()).length >= 1,
      20_000,
      'first documents',
    );
    const originA = await originOf(a);
    const originB = await originOf(b);
    await notify(b, CON, 333);
    await notify(b, DTLS, 334);
    await waitFor(
      () => con.output().includes('333') && dtls.output().includes('334'),
      20_000,
      'notifications on A',
    );
    // Acknowledged at the last version the device printed: a registration's answer is confirmed by a CON of the
    // same settings (design §3.8), whose acknowledgement may land after the first 'acknowledged' is read.
    const fromB = await until(
      b,
      CON,
      (v) =>
        v.delivery?.state === 'acknowledged' &&
        v.delivery.acknowledged?.version === versions(con.output()).at(-1),
      'CON acknowledged at the last version the device saw',
    );
    expect(fromB.settings.settings).toEqual({ reporting_interval_s: 333 });
    expect(fromB.delivery!.acknowledged).toMatchObject({
      replica: originA,
      transport: 'plain',
      is_desired: true,
    });
    expect(fromB.delivery!.acknowledged!.version).toBe(versions(con.output()).at(-1));
    expect(fromB.delivery!.sent).toMatchObject({ replica: originA, type: 'CON', acknowledged: true });
    expect(fromB.delivery!.observed_by).toEqual([originA]);
    // Both replicas answered; the relation is A's.
    const byReplica = new Map(fromB.replicas.map((r) => [r.replica, r]));
    expect(byReplica.get(originB)).toMatchObject({ self: true, answered: true, relations_total: 0 });
    expect(byReplica.get(originA)).toMatchObject({ self: false, answered: true, relations_total: 1 });
    expect(byReplica.get(originA)!.relations![0]).toMatchObject({
      resource: 'settings',
      transport: 'plain',
      type: 'CON',
    });
    const fromA = await view(a, CON);
    // The same record from either replica (its bookkeeping times may move on between the two reads).
    const facts = (d: View['delivery']) => ({ ...d, updated_at: undefined, heard_at: undefined });
    expect(facts(fromA.delivery)).toEqual(facts(fromB.delivery));
    expect(new Map(fromA.replicas.map((r) => [r.replica, r.relations_total]))).toEqual(
      new Map(fromB.replicas.map((r) => [r.replica, r.relations_total])),
    );

    const overDtls = await until(b, DTLS, (v) => v.delivery?.state === 'acknowledged', 'DTLS acknowledged');
    expect(overDtls.delivery!.acknowledged).toMatchObject({ replica: originA, transport: 'dtls' });
    const partA = overDtls.replicas.find((r) => r.replica === originA)!;
    expect(partA.relations![0]).toMatchObject({ transport: 'dtls', type: 'CON' });
    expect(partA.dtls_sessions_total).toBe(1);
    expect(partA.dtls_sessions![0]).toMatchObject({ identity: key.identity, address: '127.0.0.1' });
    expect(Object.keys(partA.dtls_sessions![0]!).sort()).toEqual([
      'address',
      'established_at',
      'identity',
      'last_record_at',
      'port',
    ]);
    expect(overDtls.credentials.valid_keys).toBe(1);
  });

  it('a NON observer shows sent, unconfirmed (sent_unconfirmed, not pending)', async () => {
    const non = libcoap(['-N', `coap://127.0.0.1:${a.coapPort}/devices/${NON}/settings`]);
    await waitFor(() => versions(non.output()).length >= 1, 20_000, 'first NON document');
    await notify(b, NON, 335);
    await waitFor(() => non.output().includes('335'), 20_000, 'NON notification');
    const v = await until(
      b,
      NON,
      (x) => x.delivery?.sent?.type === 'NON' && x.delivery.sent.version === x.delivery.desired.version,
      'NON sent',
    );
    expect(v.delivery!.state).toBe('sent_unconfirmed');
    expect(v.delivery!.sent).toMatchObject({ type: 'NON', acknowledged: false });
    // Only the registration's answer was confirmed (design §3.8: a confirmable notification after it), not 335.
    expect(v.delivery!.acknowledged?.is_desired ?? false).toBe(false);
  });

  it('a device that never acknowledges stays pending, then loses its relation at the confirmable timeout', async () => {
    silent = await RawCoapClient.connect(a.coapPort);
    silent.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('s1'),
      options: [observe0, ...pathOptions(`/devices/${SILENT}/settings`)],
    });
    await silent.waitFor((p) => p.code === '2.05');
    silent.autoAck = false;
    await notify(b, SILENT, 336);
    const pending = await until(
      b,
      SILENT,
      (v) => v.delivery?.state === 'pending' && v.delivery.sent?.type === 'CON',
      'pending',
    );
    const onA = pending.replicas.find((r) => r.relations_total === 1);
    expect(onA?.relations?.[0]?.con_in_flight).toBe(true);
    // ACK_TIMEOUT 200 ms, MAX_RETRANSMIT 2: given up within about 2 s.
    const gone = await until(b, SILENT, (v) => v.delivery?.state === 'unobserved', 'relation removed');
    expect(gone.delivery!.acknowledged).toBeNull();
    expect(gone.replicas.every((r) => r.relations_total === 0)).toBe(true);
    expect(a.logs()).toMatch(
      /"event":"confirmable_timeout"[^\n]*"device_id":"acme-wh-freezer-02"|"device_id":"acme-wh-freezer-02"[^\n]*"event":"confirmable_timeout"/,
    );
    await silent.close();
  });

  it("counts acknowledged and timed-out notifications and reports the record's lag", async () => {
    const text = await (await fetch(`${a.url}/metrics`)).text();
    const value = (series: string): number => Number(new RegExp(`^${series} (\\S+)$`, 'm').exec(text)?.[1]);
    // The CON and DTLS observers acknowledged; the silent one timed out (above).
    expect(
      value('gateway_coap_notifications_total\\{[^}]*outcome="acknowledged"[^}]*\\}'),
    ).toBeGreaterThanOrEqual(2);
    expect(
      value('gateway_coap_notifications_total\\{[^}]*outcome="unacknowledged"[^}]*\\}'),
    ).toBeGreaterThanOrEqual(1);
    expect(value('gateway_delivery_record_lag_seconds\\{[^}]*\\}')).toBeLessThan(5);
    expect(value('gateway_delivery_record_writes_total\\{[^}]*kind="rows"[^}]*\\}')).toBeGreaterThan(0);
  });

  it('the fleet list answers "who has not acknowledged?"', async () => {
    const states = async (delivery: string): Promise<string[]> => {
      const res = await get(b, `/api/devices?delivery=${delivery}`);
      expect(res.status).toBe(200);
      return (res.body.items as { device_id: string }[]).map((i) => i.device_id).sort();
    };
    expect(await states('acknowledged')).toEqual(expect.arrayContaining([CON, DTLS]));
    expect(await states('sent_unconfirmed')).toEqual([NON]);
    expect(await states('pending')).toEqual([]);
    expect(await states('unobserved')).toEqual(expect.arrayContaining([SILENT, UNOBSERVED]));
    expect(await states('unobserved')).not.toContain(CON);
    const bad = await get(b, '/api/devices?delivery=maybe&limit=0&x=1');
    expect(bad.status).toBe(400);
    expect(bad.body.code).toBe('invalid_query');
    expect((bad.body.errors as { path: string }[]).map((e) => e.path).sort()).toEqual([
      '/query/delivery',
      '/query/limit',
      '/query/x',
    ]);
  });

  it('a plain CoAP client cannot speak for a device that has a DTLS key', async () => {
    // Anyone may observe over plain CoAP (GATEWAY_COAP_SECURITY=both) and claim any device id in the path.
    for (const child of children) child.kill('SIGKILL');
    const originA = await originOf(a);
    const impostor = await RawCoapClient.connect(a.coapPort);
    impostor.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('im'),
      options: [observe0, ...pathOptions(`/devices/${DTLS}/settings`)],
    });
    await impostor.waitFor((p) => p.code === '2.05');
    await notify(b, DTLS, 445);
    await impostor.waitFor((p) => p.code === '2.05' && p.payload.toString().includes('445'));
    // The killed DTLS observer's relation ends at its confirmable timeout; the impostor's relation and ACKs
    // do not count: not observed (by anyone who speaks for it), and not acknowledged. The view says what
    // watches it (issue 40 §2): not `unobserved`.
    const v = await until(
      b,
      DTLS,
      (x) => x.delivery?.state === 'observed_unauthenticated',
      'DTLS device observed only by a plain relation',
    );
    expect(v.delivery!.acknowledged).toMatchObject({ transport: 'dtls', is_desired: false });
    expect(v.delivery!.sent).toMatchObject({ transport: 'dtls' });
    expect(v.delivery!.observed_by).toEqual([]);
    // The live view still shows the plain relation, for what it is.
    const partA = v.replicas.find((r) => r.replica === originA)!;
    expect(partA.relations).toEqual([
      expect.objectContaining({ transport: 'plain', speaks_for_device: false }),
    ]);
    // The fleet list reads the record, which knows the plain relation (migration 0042): not unobserved.
    const listed = await get(b, '/api/devices?delivery=observed_unauthenticated');
    expect((listed.body.items as { device_id: string }[]).map((i) => i.device_id)).toContain(DTLS);
    await impostor.close();
  });

  it('restarting both replicas keeps the last acknowledged version', async () => {
    const before = await view(b, CON);
    for (const child of children) child.kill('SIGKILL');
    await Promise.all([a.stop(), b.stop()]);
    const portC = await freePort('udp');
    const portD = await freePort('udp');
    const [c, d] = await Promise.all([start('C', portC), start('D', portD)]);
    const after = await until(
      d,
      CON,
      (v) => v.delivery?.desired.source === 'registry',
      'record after restart',
    );
    // The acknowledgement survives. The override it acknowledged does not: a gateway that stops altogether
    // forgets its overrides (design §3.6), so the device's desired settings are the registry's again, which it
    // has not acknowledged since.
    expect(after.delivery!.acknowledged).toEqual({ ...before.delivery!.acknowledged, is_desired: false });
    expect(after.delivery!.state).toBe('unobserved');
    // The relations of the stopped replicas are gone (they left cleanly; a dead one is reaped).
    expect(after.delivery!.observed_by).toEqual([]);
    expect(after.replicas.map((r) => r.answered)).toEqual([true, true]);
    expect((await view(c, CON)).delivery!.acknowledged).toEqual(after.delivery!.acknowledged);
  });

  it('no key, PSK or token appears in any answer or log line', () => {
    const everything = [...answers, ...replicas.map((r) => r.logs())].join('\n');
    expect(everything.length).toBeGreaterThan(1000);
    for (const secret of [key.keyText, Buffer.from(key.keyText).toString('hex'), ...API_KEYS]) {
      expect(everything).not.toContain(secret);
    }
    // The lifecycle log names devices (debug level in this test).
    expect(replicas[0]!.logs()).toMatch(/"event":"registered"/);
    const notified = everything.split('\n').filter((l) => l.includes('settings notified'));
    expect(
      notified.some((l) => l.includes(`"device_id":"${CON}"`) && l.includes('"relations_notified"')),
    ).toBe(true);
  });
});
