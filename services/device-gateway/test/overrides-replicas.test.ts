// Development overrides in the open (issue 40 §3; design §3.3, §3.6), across two gateway replicas (dist/main.js) on
// one PostgreSQL, with a real CoAP observer: GET /api/overrides lists what every replica holds, DELETE
// /api/devices/{id}/override ends it on every replica (and on one started later) with a new, higher version, the
// device view shows the layers, and a rollout's assignment ends an older override while a newer override wins.
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { json, RawCoapClient, type Received } from './support/coap-client.js';
import { API_KEYS } from './support/gateway.js';
import { startReplica, type Replica } from './support/replicas.js';

const HVAC = 'acme-hq-hvac-01';
const CHILLER = 'borealis-tower-chiller-01';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

interface Answer {
  status: number;
  body: Record<string, unknown>;
}

async function call(r: Replica, method: string, path: string, body?: unknown): Promise<Answer> {
  const res = await fetch(`${r.url}${path}`, {
    method,
    headers: { ...auth, ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

interface Doc {
  version: number;
  source: string;
  settings: Record<string, unknown>;
}

const doc = (r: Received): Doc => json(r.packet) as unknown as Doc;

/** Polls `read` until `ok` holds (every wait has a deadline). */
async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 8000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await read();
    if (ok(v)) return v;
    if (Date.now() > deadline)
      throw new Error(`condition not met within ${timeoutMs} ms: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('overrides in the open, across two replicas', () => {
  let pg: PostgresServer;
  let database: TestDatabase;
  let owner: Kysely<GatewayDatabase>;
  let a: Replica;
  let b: Replica;
  const later: Replica[] = [];
  const observers: RawCoapClient[] = [];
  const env = { GATEWAY_DELIVERY_FLUSH_MS: '200', GATEWAY_ROLLOUT_STEP_MS: '200' };

  beforeAll(async () => {
    pg = await startPostgres();
    database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg.url });
    owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
    await seedDevices(owner);
    [a, b] = await Promise.all([startReplica('A', database.url, env), startReplica('B', database.url, env)]);
    await Promise.all([a.waitReady(), b.waitReady()]);
  }, 60_000);

  afterAll(async () => {
    for (const o of observers) await o.close();
    for (const r of [a, b, ...later]) await r.stop();
    await owner.destroy();
    await database.drop();
    await pg.stop();
  });

  it('lists an override set on A on both replicas, and a DELETE on A ends it on B and on a replica started later', async () => {
    const observer = await RawCoapClient.observeSettings(b.coapPort, HVAC);
    observers.push(observer);
    const registry = doc(observer.inbox[0]!);
    expect(registry.source).toBe('registry');

    expect(
      (
        await call(a, 'POST', '/api/notify-settings', {
          device_id: HVAC,
          settings: { reporting_interval_s: 45 },
        })
      ).status,
    ).toBe(200);
    const overridden = doc(
      await observer.waitFor((p) => p.code === '2.05' && (json(p) as unknown as Doc).source === 'override'),
    );
    expect(overridden.settings).toEqual({ reporting_interval_s: 45 });

    for (const r of [a, b]) {
      const list = await until(
        () => call(r, 'GET', '/api/overrides'),
        (l) => (l.body.items as unknown[]).length === 1,
      );
      expect(list.status).toBe(200);
      expect(list.body).toMatchObject({
        items: [
          {
            device_id: HVAC,
            settings: { reporting_interval_s: 45 },
            version: overridden.version,
            origin: (await a.cluster()).origin,
            hides: [{ source: 'registry' }],
          },
        ],
        next_cursor: null,
      });
    }
    // The device view names every layer and which one is effective.
    const view = await call(b, 'GET', `/api/devices/${HVAC}`);
    expect(view.body.settings_layers).toEqual({
      effective: 'override',
      layers: [
        { source: 'override', effective: true, settings: { reporting_interval_s: 45 } },
        {
          source: 'registry',
          effective: false,
          hidden_by: { source: 'override' },
          settings: registry.settings,
        },
      ],
    });

    const from = observer.inbox.length;
    const cleared = await call(a, 'DELETE', `/api/devices/${HVAC}/override`);
    expect(cleared.status).toBe(200);
    expect(cleared.body).toMatchObject({ device_id: HVAC, cleared: true, settings: { source: 'registry' } });
    const clearedVersion = (cleared.body.settings as { version: number }).version;
    expect(clearedVersion).toBeGreaterThan(overridden.version);
    // B's observer gets the registry's settings again, as a new, higher version (the same number A serves).
    const back = doc(await observer.waitFor((p) => p.code === '2.05', 5000, from));
    expect(back).toMatchObject({ source: 'registry', settings: registry.settings });
    expect(back.version).toBeGreaterThan(overridden.version);
    expect(back.version).toBe(clearedVersion);
    for (const r of [a, b]) {
      await until(
        () => call(r, 'GET', '/api/overrides'),
        (l) => (l.body.items as unknown[]).length === 0,
      );
      const layers = (await call(r, 'GET', `/api/devices/${HVAC}`)).body.settings_layers as {
        effective: string;
      };
      expect(layers.effective).toBe('registry');
    }

    // A replica started after the clear reads the tombstone at its resync: no override there either.
    const c = await startReplica('C', database.url, env);
    later.push(c);
    await c.waitReady();
    expect((await call(c, 'GET', '/api/overrides')).body.items).toEqual([]);
    const onC = await RawCoapClient.observeSettings(c.coapPort, HVAC, 'c1');
    observers.push(onC);
    expect(doc(onC.inbox[0]!)).toMatchObject({ source: 'registry', settings: registry.settings });

    // Clearing again changes nothing; an unknown device is 404.
    const again = await call(b, 'DELETE', `/api/devices/${HVAC}/override`);
    expect(again.body).toMatchObject({
      cleared: false,
      settings: { source: 'registry', version: clearedVersion },
    });
    expect((await call(b, 'DELETE', '/api/devices/no-such-device/override')).status).toBe(404);
  }, 60_000);

  it('pages the list by device id', async () => {
    for (const [id, s] of [
      [CHILLER, 61],
      [HVAC, 62],
      ['acme-hq-lobby-sensor-03', 63],
    ] as const)
      expect(
        (
          await call(a, 'POST', '/api/notify-settings', {
            device_id: id,
            settings: { reporting_interval_s: s },
          })
        ).status,
      ).toBe(200);
    const first = await until(
      () => call(b, 'GET', '/api/overrides?limit=2'),
      (l) => (l.body.items as unknown[]).length === 2 && l.body.next_cursor !== null,
    );
    const second = await call(b, 'GET', `/api/overrides?limit=2&cursor=${String(first.body.next_cursor)}`);
    const ids = [
      ...(first.body.items as { device_id: string }[]),
      ...(second.body.items as { device_id: string }[]),
    ].map((i) => i.device_id);
    expect(ids).toEqual([HVAC, 'acme-hq-lobby-sensor-03', CHILLER]);
    expect(second.body.next_cursor).toBeNull();
    expect((await call(b, 'GET', '/api/overrides?cursor=nonsense')).status).toBe(400);
    for (const id of ids) expect((await call(a, 'DELETE', `/api/devices/${id}/override`)).status).toBe(200);
  }, 30_000);

  it("a notify right after a clear stamped ahead of this replica's clock is applied, not lost", async () => {
    const device = 'acme-hq-lobby-sensor-03';
    // A clear whose version is 30 s ahead (a rollout's step stamps by the database's clock; another replica's clock
    // may run ahead), not read by the replicas yet: written by the owner, so no wake-up goes out.
    const ahead = String((Date.now() + 30_000) * 1000);
    await sql`SELECT device_gateway.bus_clear_override(${device}, ${ahead}, 'zz-ahead')`.execute(owner);
    const res = await call(a, 'POST', '/api/notify-settings', {
      device_id: device,
      settings: { reporting_interval_s: 77 },
    });
    expect(res.status).toBe(200);
    // Answered `updated`: the override is the last one written, on every replica.
    for (const r of [a, b]) {
      const list = await until(
        () => call(r, 'GET', '/api/overrides'),
        (l) => (l.body.items as { device_id: string }[]).some((i) => i.device_id === device),
        4000,
      );
      expect(list.body.items).toMatchObject([{ device_id: device, settings: { reporting_interval_s: 77 } }]);
    }
    expect((await call(a, 'DELETE', `/api/devices/${device}/override`)).body).toMatchObject({
      cleared: true,
    });
  }, 30_000);

  it("a rollout's assignment ends an older override; an override set after it wins again", async () => {
    const observer = await RawCoapClient.observeSettings(a.coapPort, CHILLER, 'm1');
    observers.push(observer);
    expect(
      (
        await call(b, 'POST', '/api/notify-settings', {
          device_id: CHILLER,
          settings: { reporting_interval_s: 33 },
        })
      ).status,
    ).toBe(200);
    await observer.waitFor((p) => p.code === '2.05' && (json(p) as unknown as Doc).source === 'override');

    const created = await call(a, 'POST', '/api/rollouts', {
      selector: { device_ids: [CHILLER] },
      settings: { reporting_interval_s: 600 },
      plan: { first_wave_count: 1, success_share: 1, abort_share: 1, deadline_s: 30 },
    });
    expect(created.status).toBe(201);
    // The answer says which targets hold an override now.
    expect(created.body).toMatchObject({ targets: 1, overridden: 1, overridden_devices: [CHILLER] });

    // The device gets the rollout's settings (not hidden by the override), on the replica it observes.
    const assigned = doc(
      await observer.waitFor(
        (p) => p.code === '2.05' && (json(p) as unknown as Doc).source === 'rollout',
        10_000,
      ),
    );
    expect(assigned.settings).toEqual({ reporting_interval_s: 600 });
    for (const r of [a, b]) {
      await until(
        () => call(r, 'GET', '/api/overrides'),
        (l) => (l.body.items as unknown[]).length === 0,
      );
      await until(
        () => call(r, 'GET', `/api/devices/${CHILLER}`),
        (v) => (v.body.settings_layers as { effective: string }).effective === 'rollout',
      );
    }
    const rolloutId = created.body.rollout_id as string;
    const rollout = await until(
      () => call(b, 'GET', `/api/rollouts/${rolloutId}`),
      (r) => r.body.state === 'completed',
      15_000,
    );
    expect((rollout.body.events as { kind: string }[]).map((e) => e.kind)).toContain('overrides_ended');

    // A development override set after the assignment wins over it, and the view says what it hides.
    expect(
      (
        await call(b, 'POST', '/api/notify-settings', {
          device_id: CHILLER,
          settings: { reporting_interval_s: 34 },
        })
      ).status,
    ).toBe(200);
    const view = await until(
      () => call(a, 'GET', `/api/devices/${CHILLER}`),
      (v) => (v.body.settings_layers as { effective: string }).effective === 'override',
    );
    expect(view.body.settings_layers).toMatchObject({
      layers: [
        { source: 'override', effective: true },
        {
          source: 'rollout',
          rollout_id: rolloutId,
          effective: false,
          hidden_by: { source: 'override' },
          settings: { reporting_interval_s: 600 },
        },
        { source: 'registry', effective: false, hidden_by: { source: 'override' } },
      ],
    });
    const list = await call(a, 'GET', '/api/overrides');
    expect(list.body.items).toMatchObject([
      { device_id: CHILLER, hides: [{ source: 'rollout', rollout_id: rolloutId }, { source: 'registry' }] },
    ]);
    // Cleared: the device goes back to the rollout's assignment (the next layer), not to the registry.
    const cleared = await call(b, 'DELETE', `/api/devices/${CHILLER}/override`);
    expect(cleared.body).toMatchObject({ cleared: true, settings: { source: 'rollout' } });
  }, 60_000);
});
