// Replicas (design §3.6): several gateway processes (dist/main.js) on one PostgreSQL share overrides and reloads over
// LISTEN/NOTIFY. Real processes, real UDP observers, a private PostgreSQL this file may stop and restart.
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { RawCoapClient, json, observe0, pathOptions, type Received } from './support/coap-client.js';
import { startReplica, type Replica } from './support/replicas.js';

// Slow first reconnect so a test can act inside the LISTEN gap; short cap so recovery after an outage is quick.
const env = {
  GATEWAY_BUS_RECONNECT_MIN_MS: '1500',
  GATEWAY_BUS_RECONNECT_MAX_MS: '2000',
  GATEWAY_BUS_HEARTBEAT_MS: '1000',
  // Short database deadlines, so the frozen-server test waits seconds, not the defaults (4 s, 5 s, 2 s).
  DB_STATEMENT_TIMEOUT_MS: '800',
  DB_QUERY_TIMEOUT_MS: '1000',
  DB_CONNECT_TIMEOUT_MS: '700',
};
/** The longest a call may take against a frozen server: one client-side deadline, plus scheduling slack. */
const FROZEN_ANSWER_MS = 1000 + 1500;

interface Doc {
  device_id: string;
  version: number;
  source: string;
  settings: Record<string, unknown>;
}

/** An observer of one device's settings on one replica; `docs` holds every 2.05 it got, in order. */
class Observer {
  private constructor(
    readonly client: RawCoapClient,
    readonly token: Buffer,
  ) {}

  static async open(replica: Replica, deviceId: string): Promise<Observer> {
    const client = await RawCoapClient.connect(replica.coapPort);
    const observer = new Observer(client, Buffer.from(`o-${deviceId}`.slice(0, 8)));
    client.send({
      confirmable: true,
      code: 'GET',
      token: observer.token,
      options: [observe0, ...pathOptions(`/devices/${deviceId}/settings`)],
    });
    await observer.next(() => true);
    return observer;
  }

  /**
   * Every 2.05 it got, in order, without the confirmation of the registration's answer: the same version once
   * more, confirmable (design §3.8).
   */
  get docs(): Doc[] {
    const all = this.client.inbox
      .filter((r: Received) => r.packet.code === '2.05' && r.packet.token.equals(this.token))
      .map((r) => json(r.packet) as unknown as Doc);
    return all.filter((d, i) => i === 0 || d.version !== all[i - 1]!.version);
  }

  get last(): Doc {
    return this.docs.at(-1)!;
  }

  async next(match: (doc: Doc) => boolean, timeoutMs = 8000): Promise<Doc> {
    const r = await this.client.waitFor(
      (p) => p.code === '2.05' && p.token.equals(this.token) && match(json(p) as unknown as Doc),
      timeoutMs,
    );
    return json(r.packet) as unknown as Doc;
  }

  close(): Promise<void> {
    return this.client.close();
  }
}

async function until(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** Every 2.05 an observer got has a strictly higher version than the one before. */
function expectIncreasing(docs: Doc[]): void {
  for (let i = 1; i < docs.length; i++) expect(docs[i]!.version).toBeGreaterThan(docs[i - 1]!.version);
}

describe('gateway replicas over PostgreSQL LISTEN/NOTIFY', () => {
  let pg: PostgresServer;
  let database: TestDatabase;
  let owner: Kysely<GatewayDatabase>;
  let a: Replica;
  let b: Replica;
  const replicas: Replica[] = [];
  const observers: Observer[] = [];

  const observe = async (replica: Replica, deviceId: string): Promise<Observer> => {
    const o = await Observer.open(replica, deviceId);
    observers.push(o);
    return o;
  };
  const start = async (name: string): Promise<Replica> => {
    const r = await startReplica(name, database.url, env);
    replicas.push(r);
    await r.waitReady();
    return r;
  };

  beforeAll(async () => {
    pg = await startPostgres();
    database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg.url });
    owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
    await seedDevices(owner);
    [a, b] = await Promise.all([start('A'), start('B')]);
  });

  afterAll(async () => {
    for (const o of observers) await o.close();
    for (const r of replicas) await r.stop();
    await owner.destroy();
    await database.drop();
    await pg.destroy();
  });

  it('notify through B reaches an observer on A with a higher version, answered after commit', async () => {
    const observer = await observe(a, 'acme-hq-hvac-01');
    const before = observer.last;
    const res = await b.post('/api/notify-settings', {
      device_id: 'acme-hq-hvac-01',
      settings: { reporting_interval_s: 300 },
    });
    expect(res.status).toBe(200);
    expect(res.body).toMatchObject({ status: 'updated', version: expect.any(Number) });
    // `updated` came after the commit: the retained message is visible to any other session now.
    const row = await sql<{ settings: unknown; version: string }>`
      SELECT settings, version::text AS version FROM device_gateway.bus_overrides
      WHERE device_id = 'acme-hq-hvac-01'`.execute(owner);
    expect(row.rows[0]?.settings).toEqual({ reporting_interval_s: 300 });
    const doc = await observer.next((d) => d.settings.reporting_interval_s === 300);
    expect(doc.source).toBe('override');
    expect(doc.version).toBeGreaterThan(before.version);
    // Every replica serves the override under the version the accepting replica stamped.
    expect(doc.version).toBe(Number(row.rows[0]!.version));
    const onB = await observe(b, 'acme-hq-hvac-01');
    expect(onB.last).toEqual(doc);
    expectIncreasing(observer.docs);
  });

  it('reload through B makes A reload and notify its observers of changed devices only', async () => {
    const changed = await observe(a, 'acme-hq-lobby-sensor-03');
    const unchanged = await observe(a, 'acme-wh-door-01');
    const before = changed.last;
    await sql`
      UPDATE device_gateway.device_registry SET desired_settings = '{"sampling_interval_s": 15}'
      WHERE device_id = 'acme-hq-lobby-sensor-03'`.execute(owner);
    const res = await b.post('/api/reload-registry');
    expect(res.status).toBe(200);
    const doc = await changed.next((d) => d.settings.sampling_interval_s === 15);
    expect(doc.version).toBeGreaterThan(before.version);
    expect(doc.source).toBe('registry');
    await new Promise((r) => setTimeout(r, 300));
    expect(unchanged.docs).toHaveLength(1);
  });

  it('a burst of concurrent notifies (batched into shared commits) leaves A and B agreeing', async () => {
    const onA = await observe(a, 'acme-hq-hvac-01');
    const results = await Promise.all(
      Array.from({ length: 60 }, (_, i) =>
        b.post('/api/notify-settings', {
          device_id: 'acme-hq-hvac-01',
          settings: { reporting_interval_s: 1000 + i },
        }),
      ),
    );
    expect(results.map((r) => r.status)).toEqual(results.map(() => 200));
    const row = await sql<{ settings: { reporting_interval_s: number } }>`
      SELECT settings FROM device_gateway.bus_overrides WHERE device_id = 'acme-hq-hvac-01'`.execute(owner);
    const winner = row.rows[0]!.settings.reporting_interval_s;
    const last = await onA.next((d) => d.settings.reporting_interval_s === winner);
    const onB = await observe(b, 'acme-hq-hvac-01');
    expect(onB.last).toEqual(last);
    expectIncreasing(onA.docs);
  });

  it('a killed LISTEN connection reconnects and resynchronises: nothing sent meanwhile is lost', async () => {
    const observer = await observe(a, 'acme-wh-freezer-02');
    const { origin } = await a.cluster();
    const killed = await sql<{ ok: boolean }>`
      SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
      WHERE application_name LIKE ${`device-gateway-bus ${String(origin)}%`}`.execute(owner);
    expect(killed.rows).toEqual([{ ok: true }]);
    // Inside the gap A says it is not ready (PostgreSQL is reachable, so others can publish).
    await until(async () => (await a.ready()) === 503, 1000, 'A to report not ready');
    const res = await b.post('/api/notify-settings', {
      device_id: 'acme-wh-freezer-02',
      settings: { reporting_interval_s: 777 },
    });
    expect(res.status).toBe(200);
    expect((await a.cluster()).status).not.toBe('listening');
    const doc = await observer.next((d) => d.settings.reporting_interval_s === 777);
    expect(doc.source).toBe('override');
    await a.waitReady();
    const cluster = await a.cluster();
    expect(cluster.status).toBe('listening');
    expect(cluster.reconnects).toBeGreaterThanOrEqual(1);
    expect(cluster.resyncs).toBeGreaterThanOrEqual(2);
    expectIncreasing(observer.docs);
  });

  it('a restarted replica and a new one serve the current override with a higher version', async () => {
    const observer = await observe(a, 'borealis-tower-chiller-01');
    const res = await b.post('/api/notify-settings', {
      device_id: 'borealis-tower-chiller-01',
      settings: { firmware_channel: 'stable', reporting_interval_s: 120 },
    });
    expect(res.status).toBe(200);
    const seen = await observer.next((d) => d.settings.firmware_channel === 'stable');
    expect(await a.stop()).toBe(0);
    a = await start('A2');
    const [again, onC] = await Promise.all([
      observe(a, 'borealis-tower-chiller-01'),
      start('C').then((c) => observe(c, 'borealis-tower-chiller-01')),
    ]);
    for (const doc of [again.last, onC.last]) {
      expect(doc.source).toBe('override');
      expect(doc.settings).toEqual({ firmware_channel: 'stable', reporting_interval_s: 120 });
      expect(doc.version).toBeGreaterThanOrEqual(seen.version);
    }
    const servedBefore = Math.max(seen.version, again.last.version, onC.last.version);
    // A change after the restart is above everything any replica served before.
    const next = await b.post('/api/notify-settings', {
      device_id: 'borealis-tower-chiller-01',
      settings: { firmware_channel: 'beta' },
    });
    expect(next.status).toBe(200);
    const doc = await again.next((d) => d.settings.firmware_channel === 'beta');
    expect(doc.version).toBeGreaterThan(servedBefore);
    expect((await onC.next((d) => d.settings.firmware_channel === 'beta')).version).toBe(doc.version);
  });

  it('with PostgreSQL down notify answers 503 and replicas keep serving; afterwards the bus recovers', async () => {
    const observer = await observe(a, 'borealis-tower-lift-02');
    await pg.stop();
    try {
      const res = await b.post('/api/notify-settings', {
        device_id: 'borealis-tower-lift-02',
        settings: { telemetry_enabled: false },
      });
      expect(res.status).toBe(503);
      expect(res.body.code).toBe('backend_unavailable');
      expect(res.headers.get('retry-after')).not.toBeNull();
      // Nobody can publish, so nothing can be missed: replicas stay ready and serve from memory.
      await until(async () => (await a.ready()) === 200, 5000, 'A ready during the outage');
      expect(observer.docs.every((d) => d.settings.telemetry_enabled !== false)).toBe(true);
    } finally {
      await pg.start();
    }
    await until(async () => (await a.cluster()).status === 'listening', 15000, 'A to listen again');
    await until(async () => (await b.cluster()).status === 'listening', 15000, 'B to listen again');
    const res = await b.post('/api/notify-settings', {
      device_id: 'borealis-tower-lift-02',
      settings: { telemetry_enabled: false },
    });
    expect(res.status).toBe(200);
    await observer.next((d) => d.settings.telemetry_enabled === false);
    expectIncreasing(observer.docs);
  });

  it('with PostgreSQL frozen, notify and reload answer 503 within the deadline; after a thaw the same replicas recover', async () => {
    const observer = await observe(a, 'acme-hq-hvac-01');
    // Each replica's pool has an idle connection to the server that is about to stop answering.
    expect((await b.post('/api/reload-registry')).status).toBe(200);
    await pg.freeze();
    let frozenNotify: { status: number; body: Record<string, unknown>; headers: Headers };
    try {
      const timed = async <T>(call: () => Promise<T>): Promise<{ result: T; ms: number }> => {
        const t0 = performance.now();
        const result = await call();
        return { result, ms: performance.now() - t0 };
      };
      const notify = await timed(() =>
        b.post('/api/notify-settings', {
          device_id: 'acme-hq-hvac-01',
          settings: { sampling_interval_s: 17 },
        }),
      );
      frozenNotify = notify.result;
      expect(notify.result.status).toBe(503);
      expect(notify.result.body.code).toBe('backend_unavailable');
      expect(notify.result.headers.get('retry-after')).not.toBeNull();
      expect(notify.ms).toBeLessThan(FROZEN_ANSWER_MS);
      // A new connection (the pool's was discarded) meets a server that accepts TCP and never answers.
      const reload = await timed(() => b.post('/api/reload-registry'));
      expect(reload.result.status).toBe(503);
      expect(reload.result.body.code).toBe('backend_unavailable');
      expect(reload.ms).toBeLessThan(FROZEN_ANSWER_MS);
      expect(JSON.stringify([notify.result.body, reload.result.body])).not.toMatch(/timeout|postgres|stack/i);
    } finally {
      await pg.thaw();
    }
    expect(frozenNotify.status).toBe(503);
    // The timed-out publish was already with the server: once it answers again the override takes effect on
    // every replica through the bus, as if it had been answered late (never on one replica alone).
    await observer.next((d) => d.settings.sampling_interval_s === 17);
    await until(async () => (await a.cluster()).status === 'listening', 15000, 'A to listen again');
    await until(async () => (await b.cluster()).status === 'listening', 15000, 'B to listen again');
    expect((await b.post('/api/reload-registry')).status).toBe(200);
    const res = await b.post('/api/notify-settings', {
      device_id: 'acme-hq-hvac-01',
      settings: { sampling_interval_s: 23 },
    });
    expect(res.status).toBe(200);
    await observer.next((d) => d.settings.sampling_interval_s === 23);
    expectIncreasing(observer.docs);
  });

  it('a replica whose registry is a reload behind answers 404 for a device the database has disabled', async () => {
    const deviceId = 'acme-wh-freezer-02';
    await sql`UPDATE device_gateway.device_registry SET enabled = false WHERE device_id = ${deviceId}`.execute(
      owner,
    );
    try {
      const res = await b.post('/api/notify-settings', {
        device_id: deviceId,
        settings: { reporting_interval_s: 55 },
      });
      expect(res.status).toBe(404);
      expect(res.body.code).toBe('unknown_device');
      const retained = await sql<{ settings: unknown }>`
        SELECT settings FROM device_gateway.bus_overrides WHERE device_id = ${deviceId}`.execute(owner);
      expect(retained.rows.map((r) => r.settings)).not.toContainEqual({ reporting_interval_s: 55 });
    } finally {
      await sql`UPDATE device_gateway.device_registry SET enabled = true WHERE device_id = ${deviceId}`.execute(
        owner,
      );
    }
  });

  const retainedRows = async (): Promise<string> =>
    JSON.stringify(
      (
        await sql`SELECT device_id, version::text, origin, settings FROM device_gateway.bus_overrides ORDER BY device_id`.execute(
          owner,
        )
      ).rows,
    );

  it('replicas whose LISTEN connections broke put the overrides they hold back into a cleared table', async () => {
    const before = await retainedRows();
    expect(JSON.parse(before)).not.toHaveLength(0);
    // What a replica starting alone inside that gap does (bus_join): the retained table is cleared.
    await sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'device-gateway-bus %'`.execute(
      owner,
    );
    await sql`DELETE FROM device_gateway.bus_overrides`.execute(owner);
    await until(async () => (await retainedRows()) === before, 15000, 'the overrides to be retained again');
    await Promise.all([a.waitReady(), b.waitReady()]);
  });

  it('an override does not outlive the gateway: after every replica stopped, a new one serves the registry', async () => {
    const observer = await observe(a, 'acme-hq-hvac-01');
    const served = observer.last;
    expect(served.source).toBe('override');
    for (const r of replicas) expect(await r.stop()).toBe(0);
    const d = await start('D');
    expect(d.logs()).toContain('cleared the overrides retained by the previous gateway');
    expect(await retainedRows()).toBe('[]');
    const after = (await observe(d, 'acme-hq-hvac-01')).last;
    expect(after.source).toBe('registry');
    // Its clock started above the versions the cleared overrides carried.
    expect(after.version).toBeGreaterThan(served.version);
  });
});
