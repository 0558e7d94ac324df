// Reports across replicas (issue 40 §1; design §3.8): two gateway processes (dist/main.js) with the bus on one
// PostgreSQL. A device observes on A and reports to B: B writes the record, A's view and the fleet list on either
// replica say applied. A report for a version B has not issued but the record knows (A's registry numbering) is
// accepted; one from the future is 4.09 on either.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import type { Kysely } from 'kysely';
import { sql } from 'kysely';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { RawCoapClient, pathOptions } from './support/coap-client.js';
import { API_KEYS } from './support/gateway.js';
import { startReplica, type Replica } from './support/replicas.js';
import { sleep } from './support/dtls.js';

jest.setTimeout(120_000);

const DEVICE = 'acme-wh-door-01';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

let pg: PostgresServer;
let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let a: Replica;
let b: Replica;
const clients: RawCoapClient[] = [];

beforeAll(async () => {
  pg = await startPostgres();
  database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg.url });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await seedDevices(owner);
  const env = { GATEWAY_DELIVERY_FLUSH_MS: '200', LOG_LEVEL: 'info' };
  [a, b] = await Promise.all([startReplica('A', database.url, env), startReplica('B', database.url, env)]);
  await Promise.all([a.waitReady(), b.waitReady()]);
});

afterAll(async () => {
  for (const c of clients) await c.close();
  await a?.stop();
  await b?.stop();
  await owner?.destroy();
  await database?.drop();
  await pg?.stop();
});

interface View {
  delivery: { state: string; observed_by: string[]; reported: { version: number; replica: string } | null };
}

async function viewOn(r: Replica, device = DEVICE): Promise<View> {
  const res = await fetch(`${r.url}/api/devices/${device}`, { headers: auth });
  expect(res.status).toBe(200);
  return (await res.json()) as View;
}

async function until(r: Replica, cond: (v: View) => boolean, what: string, device = DEVICE): Promise<View> {
  const deadline = Date.now() + 15_000;
  let last: View | undefined;
  while (Date.now() < deadline) {
    last = await viewOn(r, device);
    if (cond(last)) return last;
    await sleep(100);
  }
  throw new Error(`${what}: ${JSON.stringify(last?.delivery)}`);
}

let mid = 1;
async function report(
  r: Replica,
  body: Record<string, unknown>,
  device = DEVICE,
): Promise<{ code: string; payload: string }> {
  const client = await RawCoapClient.connect(r.coapPort);
  clients.push(client);
  client.send({
    confirmable: true,
    code: 'POST',
    messageId: mid++,
    token: Buffer.from([7]),
    options: [
      ...pathOptions(`/devices/${device}/reported`),
      { name: 'Content-Format', value: Buffer.from([50]) },
    ],
    payload: Buffer.from(JSON.stringify(body)),
  });
  const reply = (await client.waitFor((p) => p.ack)).packet;
  return { code: reply.code, payload: reply.payload.toString() };
}

describe('a device that observes on A and reports to B', () => {
  it("B records the report; A's view and both fleet lists say applied", async () => {
    const observer = await RawCoapClient.observeSettings(a.coapPort, DEVICE);
    clients.push(observer);
    const originB = (await b.cluster()).origin as string;
    const notified = await a.post('/api/notify-settings', {
      device_id: DEVICE,
      settings: { reporting_interval_s: 420 },
    });
    expect(notified.status).toBe(200);
    const version = notified.body.version as number;
    expect(notified.body.relations_notified).toBe(1);
    await observer.waitFor((p) => p.code === '2.05' && p.payload.toString().includes('420'));
    // At once: B learned the override's version over the bus (the same version on every replica), or the record
    // has not caught up yet and B says so (5.03, retry): a device retries after Max-Age.
    let answer = await report(b, { version, outcome: 'applied', settings: { reporting_interval_s: 420 } });
    for (let i = 0; i < 20 && answer.code === '5.03'; i++) {
      await sleep(200);
      answer = await report(b, { version, outcome: 'applied', settings: { reporting_interval_s: 420 } });
    }
    expect(answer.code).toBe('2.04');
    const seen = await until(a, (v) => v.delivery.state === 'applied', 'applied on A');
    expect(seen.delivery.reported).toMatchObject({ version, replica: originB });
    for (const r of [a, b]) {
      const res = await fetch(`${r.url}/api/devices?delivery=applied`, { headers: auth });
      const items = ((await res.json()) as { items: { device_id: string }[] }).items;
      expect(items.map((i) => i.device_id)).toContain(DEVICE);
    }
  });

  it("a registry version that A numbered is accepted by B (its own numbering or the record's)", async () => {
    // A reload numbers the registry's settings on each replica with its own clock: A's version is not B's.
    const device = 'borealis-tower-lift-02';
    const observer = await RawCoapClient.observeSettings(a.coapPort, device, 'r2');
    clients.push(observer);
    await sql`UPDATE device_gateway.device_registry SET desired_settings = '{"reporting_interval_s": 480}'::jsonb
      WHERE device_id = ${device}`.execute(owner);
    const mark = observer.inbox.length;
    expect((await a.post('/api/reload-registry')).status).toBe(200);
    const note = await observer.waitFor((p) => p.payload.toString().includes('480'), 10_000, mark);
    const version = (JSON.parse(note.packet.payload.toString()) as { version: number }).version;
    let answer = await report(b, { version, outcome: 'rejected', reason: 'busy' }, device);
    for (let i = 0; i < 20 && answer.code === '5.03'; i++) {
      await sleep(200);
      answer = await report(b, { version, outcome: 'rejected', reason: 'busy' }, device);
    }
    expect(answer.code).toBe('2.04');
    await until(a, (v) => v.delivery.state === 'rejected', 'rejected on A', device);
  });

  it('a version from the future is 4.09 on either replica', async () => {
    const far = Date.now() * 1000 + 3_600_000_000;
    for (const r of [a, b]) {
      const answer = await report(r, { version: far, outcome: 'applied' });
      expect(answer).toEqual({ code: '4.09', payload: 'version never issued to this device' });
    }
  });
});
