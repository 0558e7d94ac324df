// Red-team review of 43dd34c (migration 0017, "a notification carries no authority"). Two real replicas
// (dist/main.js) on a private PostgreSQL with the whole platform's migrations. What 0017 closes (forged
// overrides, reload floods, clock poison, listening) stays closed; these cases attack what the bus still
// shares with every other session of the cluster:
// - the advisory lock keys the publishing functions and bus_join take are public knowledge, and
//   pg_advisory_lock is executable by PUBLIC, so any login that may connect (enterprise_api_login,
//   authenticator as enterprise_portal_anon, a login with CONNECT only) can hold them for ever;
// - the NOTIFY queue is one per cluster: a session of ANY database (the `postgres` database still has CONNECT
//   for PUBLIC) that LISTENs and stays in a transaction pins its tail; once it is full every NOTIFY fails at
//   commit, and with it every transaction that sends one (bus_publish_overrides, bus_publish_reload,
//   inspect_ask, rollout steps);
// - the rollout channel's wake-ups have no empty-read gap, unlike the bus's (50 reads a second at most).
// Each case fails against 43dd34c and passes once the gateway no longer depends on what a stranger can hold.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { sql, type Kysely } from 'kysely';
import type pg from 'pg';
import type { GatewayDatabase } from '../src/db/tables.js';
import { gatewayChannels } from './support/channels.js';
import { API_KEYS } from './support/gateway.js';
import { pinNotifyQueue, startPlatformDatabase, type PlatformDatabase } from './support/platform-database.js';
import { startReplica, type Replica } from './support/replicas.js';
import {
  attackersOf,
  connectStranger as connectStrangerOf,
  servedBy as servedByOf,
  until,
} from './support/attack.js';

jest.setTimeout(180_000);

const DEVICE = 'acme-hq-hvac-01';
const env = { LOG_LEVEL: 'info' };

let platform: PlatformDatabase;
let owner: Kysely<GatewayDatabase>;
let replicas: Replica[] = [];

const connectStranger = (): Promise<pg.Client> => connectStrangerOf(platform);
const attackers = attackersOf(() => platform);
const servedBy = (r: Replica): Promise<Record<string, unknown>> => servedByOf(r, DEVICE);

async function metric(r: Replica, line: string): Promise<number> {
  const res = await fetch(`${r.url}/metrics`, { headers: { Authorization: `Bearer ${API_KEYS[0]!}` } });
  const text = await res.text();
  const found = text.split('\n').find((l) => l.startsWith(line));
  return found === undefined ? 0 : Number(found.split(' ').pop());
}

beforeAll(async () => {
  // A small NOTIFY queue (64 pages, 512 KB) so the queue case fills it in a second; the default is 8 GB
  // (max_notify_queue_pages = 1,048,576), which a stranger fills the same way, only for longer.
  platform = await startPlatformDatabase({ notifyQueuePages: 64, stranger: true, nobody: true });
  owner = platform.owner;
  const url = platform.database.url;
  replicas = await Promise.all([startReplica('A', url, env), startReplica('B', url, env)]);
  await Promise.all(replicas.map((r) => r.waitReady()));
});

afterAll(async () => {
  for (const r of replicas) await r.stop();
  await platform?.close();
});

describe.each(attackers)('$name holding the bus publishing lock', ({ connect: connectAttacker }) => {
  it('does not stop notify-settings (pg_advisory_lock(hashtext(device_gateway.bus_seq)))', async () => {
    const [a, b] = replicas as [Replica, Replica];
    const c = await connectAttacker();
    // Since 0031 the attacker may not even take it (EXECUTE on the advisory-lock functions is not PUBLIC's).
    const held = await c
      .query<{ held: boolean }>(`SELECT pg_try_advisory_lock(hashtext('device_gateway.bus_seq')) AS held`)
      .then(
        (r) => String(r.rows[0]!.held),
        (err: Error) => `refused (${err.message})`,
      );
    try {
      const value = 300 + Math.floor(Math.random() * 200);
      const t0 = Date.now();
      const res = await a.post('/api/notify-settings', {
        device_id: DEVICE,
        settings: { reporting_interval_s: value },
      });
      console.log(
        `lock held by attacker: ${held}; notify-settings ${res.status} after ${Date.now() - t0} ms`,
      );
      expect(res.status).toBe(200);
      await until(async () => (await servedBy(b)).reporting_interval_s === value, 'B to serve the override');
    } finally {
      await c.query(`SELECT pg_advisory_unlock_all()`).catch(() => undefined);
    }
  });
});

describe('a login with CONNECT only holding bus_join’s lock', () => {
  it('does not keep a starting replica from becoming ready', async () => {
    const c = await connectStranger();
    await c.query(`SELECT pg_advisory_lock(hashtext('device_gateway.bus_join'))`).catch(() => undefined);
    const third = await startReplica('C', platform.database.url, env);
    try {
      // 43dd34c: bus_join waits on the lock, the listener's query_timeout (5 s) gives up, the replica
      // reconnects and waits again, for as long as the stranger likes; each attempt leaves one backend
      // waiting in bus_join (the client is gone, the backend stays until the lock is granted).
      const ready = await third.waitReady(15_000).then(
        () => true,
        () => false,
      );
      const { rows } = await sql<{ n: string }>`
        SELECT count(*)::text AS n FROM pg_stat_activity
        WHERE usename = 'device_gateway_login' AND wait_event_type = 'Lock'`.execute(owner);
      console.log(`third replica ready: ${ready}; gateway backends waiting on a lock: ${rows[0]!.n}`);
      expect(ready).toBe(true);
    } finally {
      await c.query(`SELECT pg_advisory_unlock_all()`).catch(() => undefined);
      await third.stop();
    }
  });
});

describe('a flood of wake-ups on the rollout channel', () => {
  it('costs a replica no more reads than the bus channel allows (50 a second)', async () => {
    const [a] = replicas as [Replica];
    const c = await connectStranger();
    const reads = 'gateway_rollout_assignment_reads_total{kind="reads"';
    const before = await metric(a, reads);
    const t0 = Date.now();
    // One notification per transaction: each is delivered on its own. On the channel's name with its secret
    // (migration 0035), as if learned: on the public base no notification reaches a replica at all.
    const { rollout } = await gatewayChannels(owner);
    await Promise.all(Array.from({ length: 3000 }, () => c.query(`NOTIFY ${rollout}`)));
    await new Promise((r) => setTimeout(r, 500));
    const seconds = (Date.now() - t0) / 1000;
    const made = (await metric(a, reads)) - before;
    console.log(
      `rollout flood: 3,000 notifications in ${seconds.toFixed(1)} s; replica A read ${made} times`,
    );
    expect(made).toBeLessThanOrEqual(Math.ceil(50 * seconds) + 5);
  });
});

// Last: the queue stays full after the pin is released until some session next runs LISTEN.
describe('a login without CONNECT on the platform’s database, pinning the NOTIFY queue from `postgres`', () => {
  it('does not stop notify-settings', async () => {
    const [a, b] = replicas as [Replica, Replica];
    const { pin } = await pinNotifyQueue(platform);
    try {
      const value = 500 + Math.floor(Math.random() * 200);
      const res = await a.post('/api/notify-settings', {
        device_id: DEVICE,
        settings: { reporting_interval_s: value },
      });
      console.log(`NOTIFY queue pinned: notify-settings ${res.status} ${JSON.stringify(res.body)}`);
      expect(res.status).toBe(200);
      await until(async () => (await servedBy(b)).reporting_interval_s === value, 'B to serve the override');
    } finally {
      await pin.query('ROLLBACK').catch(() => undefined);
      await pin.end().catch(() => undefined);
    }
  });
});
