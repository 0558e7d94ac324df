// Review 26 (delivery visibility) against two real gateway replicas on one PostgreSQL, and a hostile database
// session: a role of its own with nothing but CONNECT (NOTIFY and LISTEN need no privilege), as any other service
// or tool sharing the database has. Each test asserts what the design promises or a reviewer expects; a failing
// test is a finding (see the review report).
import { randomUUID } from 'node:crypto';
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
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { issueCredential, type IssuedCredential } from '../src/db/credential-repository.js';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { gatewayChannels } from './support/channels.js';
import { RawCoapClient, observe0, pathOptions } from './support/coap-client.js';
import { waitFor } from './support/dtls.js';
import { API_KEYS } from './support/gateway.js';
import { startReplica, type Replica } from './support/replicas.js';

jest.setTimeout(180_000);

/* eslint-disable @typescript-eslint/no-explicit-any, @typescript-eslint/no-unsafe-call, @typescript-eslint/no-unsafe-return -- the device views are read as the untyped JSON an attacker or on-call sees */

const DTLS = 'acme-wh-door-01';
const PLAIN = 'acme-hq-hvac-01';
const DTLS_VICTIM = 'acme-wh-freezer-02';
const REAPED = 'borealis-tower-chiller-01';
/** The device view's channel: its name with the installation's secret (migration 0035), read in beforeAll. */
let CHANNEL = 'device_gateway_inspect';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

let pg0: PostgresServer;
let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let key: IssuedCredential;
let a: Replica;
let b: Replica;
let coapsA: number;
let originA: string;
let originB: string;
let intruder: pg.Client;
/** A second session of the intruder's, for the request flood. */
let flooder: pg.Client;
const heard: string[] = [];
/** Every payload heard and every answer read, for the key-material check at the end. */
const everything: string[] = [];
const children: ChildProcess[] = [];
const clients: RawCoapClient[] = [];
const ROLE = `review26_${randomUUID().slice(0, 8)}`;

async function view(r: Replica, deviceId: string): Promise<{ text: string; body: Record<string, any> }> {
  const res = await fetch(`${r.url}/api/devices/${deviceId}`, { headers: auth });
  const text = await res.text();
  everything.push(text);
  expect(res.status).toBe(200);
  return { text, body: JSON.parse(text) as Record<string, any> };
}

async function until(r: Replica, id: string, check: (v: Record<string, any>) => boolean, what: string) {
  const deadline = Date.now() + 30_000;
  let last: Record<string, any> | undefined;
  while (Date.now() < deadline) {
    last = (await view(r, id)).body;
    if (check(last)) return last;
    await new Promise((res) => setTimeout(res, 200));
  }
  throw new Error(`timed out waiting for ${what}: ${JSON.stringify(last)}`);
}

const notifyPayload = (payload: unknown): Promise<unknown> =>
  intruder.query('SELECT pg_notify($1, $2)', [CHANNEL, JSON.stringify(payload)]);

/** Forged requests, 50 per transaction (each with its own id), back to back, until `stopped()`. */
async function requestFlood(stopped: () => boolean): Promise<void> {
  while (!stopped()) {
    await flooder.query(
      `SELECT pg_notify($1, json_build_object('k', 'q', 'q', gen_random_uuid()::text, 'd', $2::text,
         'o', '0123456789abcdef')::text) FROM generate_series(1, 50)`,
      [CHANNEL, PLAIN],
    );
    sent += 50;
    await new Promise((r) => setImmediate(r));
  }
}
let sent = 0;

beforeAll(async () => {
  pg0 = await startPostgres();
  database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg0.url });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  CHANNEL = (await gatewayChannels(owner)).inspect;
  await seedDevices(owner);
  key = await issueCredential(owner, DTLS);
  await issueCredential(owner, DTLS_VICTIM);
  coapsA = await freePort('udp');
  const env = {
    GATEWAY_COAP_SECURITY: 'both',
    GATEWAY_DELIVERY_FLUSH_MS: '200',
    LOG_LEVEL: 'debug',
    // The flood below keeps both cores busy; with the default 1 s an answer of A's missed B's deadline in one
    // clean-clone CI run of six (2026-11-27). What the flood test checks is that A keeps answering at all.
    GATEWAY_DEVICE_VIEW_DEADLINE_MS: '3000',
  };
  [a, b] = await Promise.all([
    startReplica('A', database.url, { ...env, GATEWAY_COAPS_PORT: String(coapsA) }),
    startReplica('B', database.url, {
      ...env,
      GATEWAY_COAPS_PORT: String(await freePort('udp')),
      // B's bus connection, once broken, stays down 12 s (a database failover, a network partition).
      GATEWAY_BUS_RECONNECT_MIN_MS: '12000',
      GATEWAY_BUS_RECONNECT_MAX_MS: '12000',
    }),
  ]);
  await Promise.all([a.waitReady(), b.waitReady()]);
  originA = (await a.cluster()).origin as string;
  originB = (await b.cluster()).origin as string;
  // The intruder: its own role, CONNECT only (granted: migration 0017 takes it from PUBLIC), no privilege on any
  // gateway object.
  await sql
    .raw(
      `CREATE ROLE ${ROLE} LOGIN PASSWORD 'intruder';
    GRANT CONNECT ON DATABASE "${database.name}" TO ${ROLE}`,
    )
    .execute(owner);
  const url = new URL(database.url);
  url.username = ROLE;
  url.password = 'intruder';
  intruder = new pg.Client({ connectionString: url.toString() });
  await intruder.connect();
  flooder = new pg.Client({ connectionString: url.toString() });
  await flooder.connect();
  intruder.on('notification', (n) => {
    heard.push(n.payload ?? '');
    everything.push(n.payload ?? '');
  });
  await intruder.query(`LISTEN ${CHANNEL}`);
});

afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  for (const c of clients) await c.close();
  await intruder?.end();
  await flooder?.end();
  await a?.stop();
  await b?.stop();
  await sql
    .raw(`REVOKE CONNECT ON DATABASE "${database.name}" FROM ${ROLE}; DROP ROLE IF EXISTS ${ROLE}`)
    .execute(owner);
  await owner?.destroy();
  await database?.drop();
  await pg0?.stop();
});

describe('a hostile database session on device_gateway_inspect', () => {
  it("a forged request makes every replica publish a device's PSK identity and peer addresses to it", async () => {
    // A device over DTLS (libcoap, its issued key) and one over plain CoAP, both observing on A.
    const child = spawn(
      'coap-client-openssl',
      [
        '-m',
        'get',
        '-s',
        '90',
        '-u',
        key.identity,
        '-k',
        key.keyText,
        `coaps://127.0.0.1:${coapsA}/devices/${DTLS}/settings`,
      ],
      { stdio: 'ignore' },
    );
    children.push(child);
    clients.push(await RawCoapClient.observeSettings(a.coapPort, PLAIN));
    await until(b, DTLS, (v) => v.delivery?.observed_by?.length === 1, 'DTLS observer on A');
    // The intruder asks as a replica that does not exist, and reads the answers it hears on the channel.
    heard.length = 0;
    for (const d of [DTLS, PLAIN]) await notifyPayload({ k: 'q', q: randomUUID(), d, o: '0123456789abcdef' });
    await new Promise((r) => setTimeout(r, 1000));
    const answers = heard.filter((h) => h.includes('"k":"a"'));
    console.log('the intruder heard:\n' + answers.join('\n'));
    const leaks = answers.filter((h) => h.includes(key.identity) || h.includes('"address":"127.0.0.1"'));
    expect(leaks).toEqual([]);
  });

  it('a request flood above 50/s silences every replica towards on-call (answered: false)', async () => {
    let stop = false;
    const flood = requestFlood(() => stop);
    try {
      await new Promise((r) => setTimeout(r, 1500));
      const shown: boolean[] = [];
      const before = sent;
      const t0 = Date.now();
      for (let i = 0; i < 3; i++) {
        const v = (await view(b, PLAIN)).body;
        const partA = v.replicas.find((r: { replica: string }) => r.replica === originA);
        console.log('replica A as B shows it during the flood:', JSON.stringify(partA).slice(0, 200));
        shown.push(partA.answered as boolean);
      }
      console.log(
        `flood: ${Math.round(((sent - before) * 1000) / (Date.now() - t0))} requests/s during the views`,
      );
      expect(shown).toEqual([true, true, true]);
    } finally {
      stop = true;
      await flood;
    }
  });

  it('forged answers end up in the device view: a real replica impersonated, and any number of invented ones', async () => {
    // While A is kept busy (as above), the intruder answers every request of B's as A and as 300 other replicas.
    let stop = false;
    const flood = requestFlood(() => stop);
    const forged = (q: string, o: string) => ({
      k: 'a',
      q,
      o,
      v: {
        relations: [
          {
            resource: 'settings',
            transport: 'dtls',
            type: 'CON',
            address: '203.0.113.66',
            port: 5684,
            con_in_flight: false,
            last_version: 99999999999999,
            note: '<img src=x onerror=alert(document.cookie)>',
            ['__proto__']: null,
          },
        ],
        relations_total: -5,
        dtls_sessions: [{ identity: 'psk-forged', address: '203.0.113.66' }],
        dtls_sessions_total: 9007199254740991,
      },
    });
    const answerer = async (q: string): Promise<void> => {
      // 300 invented replicas in one transaction (each payload differs by its origin), then A.
      await intruder.query(
        `SELECT pg_notify($1, json_build_object('k', 'a', 'q', $2::text, 'o', lpad(to_hex(i), 16, 'a'),
           'v', $3::json)::text) FROM generate_series(1, 300) AS i`,
        [CHANNEL, q, JSON.stringify(forged(q, originA).v)],
      );
      await notifyPayload(forged(q, originA));
    };
    const seen = new Set<string>();
    const watch = setInterval(() => {
      for (const h of heard.splice(0)) {
        const m = JSON.parse(h) as { k: string; q: string; o: string };
        if (m.k === 'q' && m.o === originB) console.log('B asked', m.q);
        if (m.k === 'q' && m.o === originB && !seen.has(m.q)) {
          seen.add(m.q);
          void answerer(m.q);
        }
      }
    }, 2);
    try {
      await new Promise((r) => setTimeout(r, 1500));
      const { text, body } = await view(b, PLAIN);
      const partA = body.replicas.find((r: { replica: string }) => r.replica === originA);
      console.log(
        `device view through B: ${body.replicas.length} replicas, ${text.length} bytes; A's part: ${JSON.stringify(partA)}`,
      );
      expect(body.replicas.map((r: { replica: string }) => r.replica).sort()).toEqual(
        [originA, originB].sort(),
      );
      expect(text).not.toContain('onerror');
    } finally {
      clearInterval(watch);
      stop = true;
      await flood;
    }
  });
});

describe('a hostile database session: size of one device view', () => {
  it('forged answers of ~8 KB each from thousands of invented replicas make one on-call read tens of MB', async () => {
    let stop = false;
    const flood = requestFlood(() => stop);
    // One answer just under the NOTIFY limit (about 7.5 KB): 16 relations of 16 keys, strings of 16 characters.
    const item: Record<string, string> = {};
    for (let k = 0; k < 16; k++) item[`k${'abcdefghijklmnop'[k]}`] = 'x'.repeat(16);
    const v = {
      relations: Array(16).fill(item),
      relations_total: 1,
      dtls_sessions: [],
      dtls_sessions_total: 0,
    };
    const seen = new Set<string>();
    let pushed = 0;
    const watch = setInterval(() => {
      for (const h of heard.splice(0)) {
        const m = JSON.parse(h) as { k: string; q: string; o: string };
        if (m.k === 'q' && m.o === originB && !seen.has(m.q)) {
          seen.add(m.q);
          void (async () => {
            for (let batch = 0; batch < 5; batch++) {
              await intruder.query(
                `SELECT pg_notify($1, json_build_object('k', 'a', 'q', $2::text,
                   'o', lpad(to_hex($4::int * 1000 + i), 16, 'b'), 'v', $3::json)::text)
                 FROM generate_series(1, 1000) AS i`,
                [CHANNEL, m.q, JSON.stringify(v), batch],
              );
              pushed += 1000;
            }
          })().catch((err: unknown) => console.log('intruder:', (err as Error).message));
        }
      }
    }, 2);
    try {
      await new Promise((r) => setTimeout(r, 1500));
      const outcomes: string[] = [];
      let largest = 0;
      for (let i = 0; i < 3; i++) {
        const t0 = Date.now();
        const res = await fetch(`${b.url}/api/devices/${PLAIN}`, { headers: auth });
        const text = await res.text();
        const replicas =
          res.status === 200 ? (JSON.parse(text) as { replicas: unknown[] }).replicas.length : 0;
        largest = Math.max(largest, text.length);
        outcomes.push(
          `${res.status} in ${Date.now() - t0} ms: ${replicas} replicas, ${(text.length / 1e6).toFixed(2)} MB` +
            (res.status === 200 ? '' : ` ${text.slice(0, 160)}`),
        );
      }
      console.log(`forged answers pushed: ${pushed}; device view through B:\n${outcomes.join('\n')}`);
      expect(outcomes.every((o) => o.startsWith('200'))).toBe(true);
      expect(largest).toBeLessThan(200_000);
    } finally {
      clearInterval(watch);
      stop = true;
      await flood;
    }
  });
});

describe('what the record claims', () => {
  it("a plain CoAP client's ACKs make a DTLS device's record say 'acknowledged'", async () => {
    // DTLS_VICTIM has a key and no DTLS session: the device itself is not connected at all.
    const fake = await RawCoapClient.observeSettings(a.coapPort, DTLS_VICTIM, 'f1');
    clients.push(fake);
    const res = await b.post('/api/notify-settings', {
      device_id: DTLS_VICTIM,
      settings: { reporting_interval_s: 4242 },
    });
    expect(res.status).toBe(200);
    // The impostor gets the notification and acknowledges it (RawCoapClient ACKs every CON); give the record
    // several flushes to take it in, if it would.
    await fake.waitFor((p) => p.code === '2.05' && p.payload.toString().includes('4242'));
    await new Promise((r) => setTimeout(r, 1500));
    const v = await until(
      b,
      DTLS_VICTIM,
      (x) => x.delivery?.desired?.source === 'override',
      'the override recorded',
    );
    console.log('record of a DTLS device nobody authenticated as:', JSON.stringify(v.delivery));
    console.log(
      'its credentials:',
      JSON.stringify(v.credentials),
      'its DTLS sessions:',
      JSON.stringify(v.replicas.map((r: any) => r.dtls_sessions_total)),
    );
    expect(v.delivery.state).not.toBe('acknowledged');
    expect(v.delivery.acknowledged).toBeNull();
    expect(v.delivery.observed_by).toEqual([]);
  });

  it('a replica whose bus connection is down when another reaps stays out of observed_by after it is back', async () => {
    const c = await RawCoapClient.connect(b.coapPort);
    clients.push(c);
    c.send({
      confirmable: false,
      code: 'GET',
      token: Buffer.from('r1'),
      options: [observe0, ...pathOptions(`/devices/${REAPED}/settings`)],
    });
    await c.waitFor((p) => p.code === '2.05');
    await until(b, REAPED, (v) => v.delivery?.observed_by?.includes(originB), 'observed on B');
    // B's bus connection breaks (as in a failover); B reconnects 12 s later. A reaps every 10 s meanwhile.
    await sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE application_name LIKE ${'device-gateway-bus ' + originB + '%'}`.execute(owner);
    await until(a, REAPED, (v) => v.delivery?.observed_by?.length === 0, 'reaped by A');
    await b.waitReady(30_000);
    await waitFor(() => true, 10, 'nothing');
    // B is back and listening; let several flushes and one of B's own reaps pass.
    await new Promise((r) => setTimeout(r, 12_000));
    const v = (await view(b, REAPED)).body;
    const partB = v.replicas.find((r: { replica: string }) => r.replica === originB);
    console.log(
      `after B is back: state ${v.delivery.state}, observed_by ${JSON.stringify(v.delivery.observed_by)}, ` +
        `B's live relations ${partB.relations_total}, B status ${JSON.stringify((await b.cluster()).status)}`,
    );
    expect(v.delivery.observed_by).toContain(originB);
  });

  it('no key, PSK or API key in any NOTIFY payload, answer or log line (held)', () => {
    const all = [...everything, a.logs(), b.logs()].join('\n');
    expect(all.length).toBeGreaterThan(10_000);
    for (const secret of [key.keyText, Buffer.from(key.keyText).toString('hex'), ...API_KEYS])
      expect(all).not.toContain(secret);
  });
});
