// What the replica bus's fix (6043735) left open, from the same cold review (review-39-redteam, the case "pinning
// the NOTIFY queue from `postgres`"): PostgreSQL's NOTIFY queue is one for the whole cluster, any login of any
// database can fill it, and then every transaction that has called pg_notify fails at its commit ("too many
// notifications in the NOTIFY queue", SQLSTATE 54000). The rollout functions (creation, the driver's step, a
// rollback) and the device view's request and answer (inspect_ask, inspect_answer) sent their NOTIFY inside their
// transaction; migration 0021 takes it out and the gateway sends the wake-up after the commit, best-effort, and
// every replica reads the assignments once a second. Two real replicas (dist/main.js) on a private PostgreSQL
// with a small NOTIFY queue, pinned full from the `postgres` database by a login without CONNECT on the gateway's.
// Against the code before 0021 the creation answered 500 (its commit failed) and the device view's request was
// never stored.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import type pg from 'pg';
import { gatewayLoginUrl } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { inspectStore } from '../src/delivery/sql.js';
import { RawCoapClient, json } from './support/coap-client.js';
import { API_KEYS } from './support/gateway.js';
import { pinNotifyQueue, startPlatformDatabase, type PlatformDatabase } from './support/platform-database.js';
import { startReplica, type Replica } from './support/replicas.js';

jest.setTimeout(180_000);

/** The first wave (first_wave_percent 100: the whole rollout). */
const WAVE = ['acme-hq-hvac-01', 'acme-hq-lobby-sensor-03'];
const VIEWED = 'acme-wh-door-01';
const env = {
  LOG_LEVEL: 'info',
  GATEWAY_ROLLOUT_STEP_MS: '200',
  GATEWAY_DELIVERY_FLUSH_MS: '200',
};
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

let platform: PlatformDatabase;
let owner: Kysely<GatewayDatabase>;
let replicas: Replica[] = [];
let pin: pg.Client | undefined;

async function get(r: Replica, path: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${r.url}${path}`, { headers: auth });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** The settings document a fresh observer of `deviceId` gets from `r` now. */
async function servedBy(r: Replica, deviceId: string): Promise<Record<string, unknown>> {
  const client = await RawCoapClient.observeSettings(r.coapPort, deviceId);
  try {
    const first = client.inbox.find((x) => x.packet.code === '2.05')!;
    return json(first.packet);
  } finally {
    await client.close();
  }
}

async function until(check: () => Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}

const allServe = async (value: number): Promise<boolean> => {
  for (const r of replicas)
    for (const d of WAVE) {
      const doc = await servedBy(r, d);
      if ((doc.settings as Record<string, unknown>).reporting_interval_s !== value) return false;
    }
  return true;
};

beforeAll(async () => {
  // A small NOTIFY queue (64 pages, 512 KB) so it fills in a second; the default is 8 GB, which a stranger fills
  // the same way, only for longer (as review-39-redteam does).
  platform = await startPlatformDatabase({ gatewayOnly: true, notifyQueuePages: 64, nobody: true });
  owner = platform.owner;
  const url = platform.database.url;
  replicas = await Promise.all([startReplica('A', url, env), startReplica('B', url, env)]);
  await Promise.all(replicas.map((r) => r.waitReady()));
  // Both replicas serve the registry's settings to the wave's devices before the queue is pinned.
  await until(async () => {
    for (const r of replicas)
      for (const d of WAVE) if ((await servedBy(r, d)).source !== 'registry') return false;
    return true;
  }, 'the registry settings');

  // A login with no right on the gateway's database pins the queue full from the `postgres` database.
  const pinned = await pinNotifyQueue(platform);
  pin = pinned.pin;
  const { stopped } = pinned;
  if (!/too many notifications in the NOTIFY queue/.test(stopped))
    throw new Error(`queue not full: ${stopped}`);
});

afterAll(async () => {
  await pin?.query('ROLLBACK').catch(() => undefined);
  for (const r of replicas) await r.stop();
  await platform?.close();
});

describe('the NOTIFY queue pinned full from `postgres`', () => {
  it('a rollout is created (201), its first wave is served by both replicas, and a rollback returns it', async () => {
    const [a, b] = replicas as [Replica, Replica];
    const value = 700 + Math.floor(Math.random() * 100);
    const created = await a.post('/api/rollouts', {
      selector: { device_ids: WAVE },
      settings: { reporting_interval_s: value },
      plan: { first_wave_percent: 100, success_share: 0, abort_share: 1, deadline_s: 30 },
    });
    console.log(`NOTIFY queue pinned: create ${created.status} ${JSON.stringify(created.body)}`);
    expect(created.status).toBe(201);
    const id = created.body.rollout_id as string;
    const t0 = Date.now();
    await until(() => allServe(value), 'both replicas to serve the first wave the rollout settings');
    console.log(`first wave served by both replicas ${Date.now() - t0} ms after the creation`);
    for (const r of replicas) for (const d of WAVE) expect((await servedBy(r, d)).source).toBe('rollout');

    // The rollback writes assignments too (rollout_control_body), which notified in its transaction as well.
    const back = await b.post(`/api/rollouts/${id}/rollback`, {});
    console.log(`NOTIFY queue pinned: rollback ${back.status} ${JSON.stringify(back.body)}`);
    expect(back.status).toBe(200);
    expect(back.body).toMatchObject({ state: 'rolled_back', devices_returned: WAVE.length });
    await until(async () => {
      for (const r of replicas)
        for (const d of WAVE) if ((await servedBy(r, d)).source !== 'registry') return false;
      return true;
    }, 'both replicas to serve the registry settings again');
  });

  it('the device view answers 200, its request stored', async () => {
    const [a] = replicas as [Replica, Replica];
    const before = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM device_gateway.inspect_queries WHERE device_id = ${VIEWED}`.execute(
      owner,
    );
    const res = await get(a, `/api/devices/${VIEWED}`);
    console.log(`NOTIFY queue pinned: device view ${res.status} ${JSON.stringify(res.body).slice(0, 300)}`);
    expect(res.status).toBe(200);
    const after = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM device_gateway.inspect_queries WHERE device_id = ${VIEWED}`.execute(
      owner,
    );
    // Before 0021 inspect_ask's commit failed: the request was never stored, so no replica could answer it.
    expect(after.rows[0]!.n).toBe(before.rows[0]!.n + 1);
  });

  it('the device view’s store writes a request and an answer, and only logs the notices it cannot send', async () => {
    const login = createDb<GatewayDatabase>(gatewayLoginUrl(platform.database.url), {
      max: 1,
      logger: { warn: () => undefined },
    });
    const warnings: string[] = [];
    try {
      // A winston LeveledLogMethod's type is wider than a test double needs.
      const warn = ((message: string) => {
        warnings.push(message);
      }) as never;
      const store = inspectStore(login, { warn });
      const query = randomUUID();
      await store.publishRequest(query, VIEWED, 'aaaaaaaaaaaaaaaa');
      await store.writeAnswer(
        query,
        'bbbbbbbbbbbbbbbb',
        JSON.stringify({ relations: [], relations_total: 0, dtls_sessions: [], dtls_sessions_total: 0 }),
      );
      expect(await store.queryDevice(query, 'aaaaaaaaaaaaaaaa')).toBe(VIEWED);
      expect((await store.readAnswers(query, ['bbbbbbbbbbbbbbbb'])).map((r) => r.replica)).toEqual([
        'bbbbbbbbbbbbbbbb',
      ]);
      // Both notices failed at their own commit, the queue being full, and said so.
      expect(warnings).toEqual(['device view: notice not sent', 'device view: notice not sent']);
    } finally {
      await login.destroy();
    }
  });
});
