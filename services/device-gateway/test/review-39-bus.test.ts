// Issue 39, section 1: only the gateway's own replicas steer devices. Two real replicas (dist/main.js) on a
// private PostgreSQL with the whole platform's migrations; two attackers: a login with CONNECT and nothing else,
// and the workflow's login (enterprise_api_login). Each tries what an outside probe did against the bus before
// migration 0017: a forged override, a reload flood, the version clock's poison (also across a restart of every
// replica), and listening. Every attempt must fail. Before 0017 the override was applied and retained, the flood
// made thousands of reloads, the poison stopped versions from rising and survived the restart, and a listener
// read every override's settings and every device the view was asked about.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { API_LOGIN, devRolePasswords } from '@platform/enterprise-db';
import { sql, type Kysely } from 'kysely';
import type pg from 'pg';
import type { GatewayDatabase } from '../src/db/tables.js';
import {
  NOBODY_PASSWORD,
  STRANGER_PASSWORD,
  startPlatformDatabase,
  type PlatformDatabase,
} from './support/platform-database.js';
import { startReplica, type Replica } from './support/replicas.js';
import { documentServedBy, until } from './support/attack.js';
import { gatewayChannels, type GatewayChannels } from './support/channels.js';
import { viewOf } from './support/view-cluster.js';

jest.setTimeout(180_000);

const DEVICE = 'acme-hq-hvac-01';
const CHANNELS = ['device_gateway_bus', 'device_gateway_inspect', 'device_gateway_rollout'];
const env = { LOG_LEVEL: 'info' };
const nowMicros = (): number => Date.now() * 1000;

let platform: PlatformDatabase;
let owner: Kysely<GatewayDatabase>;
/**
 * The channels' names with their secret (migration 0035), as if the attacker had learned them: what a forged
 * message would have to be sent on to reach a replica at all.
 */
let channels: GatewayChannels;
let replicas: Replica[] = [];

const connectAs = (user: string, password: string): Promise<pg.Client> => platform.connectAs(user, password);

async function startBoth(): Promise<Replica[]> {
  const started = await Promise.all([
    startReplica('A', platform.database.url, env),
    startReplica('B', platform.database.url, env),
  ]);
  await Promise.all(started.map((r) => r.waitReady()));
  return started;
}

interface Doc {
  version: number;
  source: string;
  settings: Record<string, unknown>;
}

/** The settings document a fresh observer of DEVICE gets from `r` now. */
const servedBy = async (r: Replica): Promise<Doc> => (await documentServedBy(r, DEVICE)) as unknown as Doc;

const bus = async (r: Replica): Promise<Record<string, number>> =>
  (await r.cluster()) as unknown as Record<string, number>;
/** Notifications a replica heard on the bus channel (`received` counted them before migration 0017). */
const heardBy = (stats: Record<string, number>): number => stats.wakeups ?? stats.received ?? 0;

const attackers: { name: string; connect: () => Promise<pg.Client> }[] = [
  { name: 'a login with CONNECT only', connect: () => connectAs(platform.stranger, STRANGER_PASSWORD) },
  { name: "the workflow's login", connect: () => connectAs(API_LOGIN, devRolePasswords.enterpriseApi) },
];

beforeAll(async () => {
  platform = await startPlatformDatabase({ stranger: true, nobody: true });
  owner = platform.owner;
  channels = await gatewayChannels(owner);
  replicas = await startBoth();
});

afterAll(async () => {
  for (const r of replicas) await r.stop();
  await platform?.close();
});

describe('who may connect', () => {
  it('CONNECT is not PUBLIC: a login without a grant is refused, the services’ logins are let in', async () => {
    await expect(connectAs(platform.nobody, NOBODY_PASSWORD)).rejects.toThrow(
      /permission denied for database/,
    );
    for (const attacker of attackers) await expect(attacker.connect()).resolves.toBeDefined();
  });
});

describe.each(attackers)('$name against the replica bus', ({ connect }) => {
  it('cannot write the bus: its functions and tables are refused to it', async () => {
    const c = await connect();
    const message = JSON.stringify({ k: 'override', d: DEVICE, v: nowMicros(), o: 'evil', s: { x: 1 } });
    await expect(
      c.query('SELECT device_gateway.bus_publish_overrides($1::text[])', [[message]]),
    ).rejects.toThrow(/permission denied/);
    await expect(
      c.query('SELECT device_gateway.bus_publish_reload($1)', [
        JSON.stringify({ k: 'reload', v: 1, o: 'evil' }),
      ]),
    ).rejects.toThrow(/permission denied/);
    await expect(
      c.query(
        `INSERT INTO device_gateway.bus_overrides (device_id, version, origin, settings, seq)
         VALUES ($1, 1, 'evil', '{}', 1)`,
        [DEVICE],
      ),
    ).rejects.toThrow(/permission denied/);
    await expect(c.query('SELECT * FROM device_gateway.bus_overrides')).rejects.toThrow(/permission denied/);
    await expect(c.query('SELECT * FROM device_gateway.inspect_queries')).rejects.toThrow(
      /permission denied/,
    );
  });

  it('a forged override on the channel is applied by no replica and retained nowhere', async () => {
    const c = await connect();
    const [a, b] = replicas as [Replica, Replica];
    const before = await bus(a);
    const forged = {
      k: 'override',
      d: DEVICE,
      v: nowMicros() + 1000,
      o: 'evil',
      s: { reporting_interval_s: 611 },
    };
    await c.query(`SELECT pg_notify('${channels.bus}', $1)`, [JSON.stringify(forged)]);
    // Heard (a wake-up) by both replicas, and then nothing applied.
    await until(async () => heardBy(await bus(a)) > heardBy(before), 'A to hear the notification');
    await new Promise((r) => setTimeout(r, 300));
    for (const r of [a, b]) expect((await servedBy(r)).settings.reporting_interval_s).not.toBe(611);
    const { rows } = await sql<{ n: string }>`
      SELECT count(*) AS n FROM device_gateway.bus_overrides WHERE origin = 'evil'`.execute(owner);
    expect(rows[0]!.n).toBe('0');
  });

  it('a flood of reload requests on the channel makes no replica reload', async () => {
    const c = await connect();
    const before = await Promise.all(replicas.map(bus));
    const t0 = Date.now();
    for (let i = 0; i < 4; i++) {
      await c.query(
        `SELECT pg_notify('${channels.bus}', json_build_object('k', 'reload', 'v', $1::bigint + i, 'o', 'evil')::text)
         FROM generate_series(1, 1000) AS i`,
        [nowMicros()],
      );
    }
    const rate = Math.round(4000 / ((Date.now() - t0) / 1000));
    await until(
      async () => heardBy(await bus(replicas[0]!)) >= heardBy(before[0]!) + 4000,
      'A to hear the flood',
    );
    const after = await Promise.all(replicas.map(bus));
    console.log(
      `flood: 4,000 notifications at ~${rate}/s; per replica reloads before/after:`,
      after.map(
        (s, i) =>
          `${before[i]!.remoteReloads}/${s.remoteReloads} (heard +${heardBy(s) - heardBy(before[i]!)})`,
      ),
    );
    after.forEach((s, i) => expect(s.remoteReloads).toBe(before[i]!.remoteReloads));
  });

  it('the clock poison (2^53 - 1, two days ahead) stops nothing, also across a restart of every replica', async () => {
    const c = await connect();
    for (const v of [Number.MAX_SAFE_INTEGER, nowMicros() + 2 * 86_400_000_000]) {
      for (const k of ['override', 'reload']) {
        const m = { k, d: DEVICE, v, o: 'evil', s: { reporting_interval_s: 612 } };
        await c.query(`SELECT pg_notify('${channels.bus}', $1)`, [JSON.stringify(m)]);
      }
    }
    await new Promise((r) => setTimeout(r, 300));
    const check = async (rs: Replica[], value: number): Promise<void> => {
      const before = await servedBy(rs[1]!);
      const res = await rs[0]!.post('/api/notify-settings', {
        device_id: DEVICE,
        settings: { reporting_interval_s: value },
      });
      expect(res.status).toBe(200);
      let doc: Doc | undefined;
      await until(async () => {
        doc = await servedBy(rs[1]!);
        return doc.settings.reporting_interval_s === value;
      }, `the other replica to serve ${value}`);
      expect(doc!.version).toBeGreaterThan(before.version);
      // Near the wall clock, not dragged towards 2^53.
      expect(doc!.version).toBeLessThan(nowMicros() + 60_000_000);
    };
    await check(replicas, 700 + Math.floor(Math.random() * 100));
    for (const r of replicas) await r.stop();
    replicas = await startBoth();
    await check([replicas[1]!, replicas[0]!], 800 + Math.floor(Math.random() * 100));
    const { rows } = await sql<{ top: string }>`
      SELECT coalesce(max(version), 0)::text AS top FROM device_gateway.bus_overrides`.execute(owner);
    expect(Number(rows[0]!.top)).toBeLessThan(nowMicros() + 60_000_000);
  });

  it('listening on every channel learns no device id and no settings', async () => {
    const c = await connect();
    const heard: string[] = [];
    c.on('notification', (n) => heard.push(`${n.channel}: ${n.payload ?? ''}`));
    // Their names carry a secret since migration 0035 (a stranger hears nothing on the public bases); here the
    // listener is given the names, and still learns nothing from what it hears.
    const names = Object.values(channels);
    for (const channel of [...CHANNELS, ...names]) await c.query(`LISTEN ${channel}`);
    const [a, b] = replicas as [Replica, Replica];
    const value = 900 + Math.floor(Math.random() * 90);
    expect(
      (await a.post('/api/notify-settings', { device_id: DEVICE, settings: { reporting_interval_s: value } }))
        .status,
    ).toBe(200);
    expect((await viewOf(b, DEVICE)).status).toBe(200);
    expect((await a.post('/api/reload-registry')).status).toBe(200);
    await until(() => Promise.resolve(heard.length >= 3), 'the notifications to reach the listener');
    await new Promise((r) => setTimeout(r, 300));
    console.log('a listener heard:', heard);
    expect(
      heard.filter(
        (h) => h.includes(DEVICE) || new RegExp(`:\\s*${value}\\b`).test(h) || h.includes('reporting'),
      ),
    ).toEqual([]);
  });
});
