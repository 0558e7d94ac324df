// Settings as patches (issue 40 §4; design §3.9), on two gateway replicas (dist/main.js) and one PostgreSQL, with
// real CoAP observers as the devices: a rollout of an RFC 7396 merge patch keeps each device's other settings (a
// freezer monitor's thresholds), skips and names the one device whose result would not fit one datagram, and its
// rollback gives every device exactly the document it had before.
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import type { Kysely } from 'kysely';
import { maxDocumentBytes } from '../src/coap/representations.js';
import { gatewayMigrations } from '../src/db/migrations.js';
import { demoSites, seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { settingsDocument, type Settings } from '../src/domain/documents.js';
import { json, RawCoapClient } from './support/coap-client.js';
import { API_KEYS } from './support/gateway.js';
import { startReplica, type Replica } from './support/replicas.js';

const FREEZER = 'acme-wh-freezer-02';
const HVAC = 'acme-hq-hvac-01';
const SHORT = 'acme-wh-freezer-s';
const LONG = `acme-wh-freezer-${'l'.repeat(128 - 'acme-wh-freezer-'.length)}`;
const ZONE = 'America/Argentina/Buenos_Aires';
const PATCH = { reporting_interval_s: 240, timezone: ZONE };
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

async function call(r: Replica, method: string, path: string, body?: unknown) {
  const res = await fetch(`${r.url}${path}`, {
    method,
    headers: { ...auth, ...(body === undefined ? {} : { 'Content-Type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await read();
    if (ok(v)) return v;
    if (Date.now() > deadline)
      throw new Error(`condition not met within ${timeoutMs} ms: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

interface Doc {
  version: number;
  source: string;
  settings: Settings;
}

/** The settings document a device's observer saw last. */
const lastDoc = (o: RawCoapClient): Doc =>
  json([...o.inbox].reverse().find((r) => r.packet.code === '2.05')!.packet) as unknown as Doc;

/** Its larger encoding at the largest version, as the gateway measures a document against one datagram. */
const widest = (deviceId: string, settings: Settings): number => {
  const d = settingsDocument(deviceId, Number.MAX_SAFE_INTEGER, 'override', settings);
  return Math.max(d.json.length, d.cbor.length);
};

/**
 * Settings that fit one datagram for LONG, and no longer once the patch adds its time zone, while SHORT's
 * patched document (118 characters of id fewer) still fits: thresholds grown one key character at a time.
 */
function nearTheLimit(): Settings {
  const limit = maxDocumentBytes(64);
  for (let count = 1; count <= 16; count++) {
    for (let len = 1; len <= 32; len++) {
      const thresholds: Record<string, unknown> = {};
      for (let i = 0; i < count; i++) {
        const name =
          i === count - 1 ? `z${'k'.repeat(len - 1)}` : `t${String(i).padStart(2, '0')}${'x'.repeat(29)}`;
        thresholds[name] = { min: -1000.5, max: 1000.5 };
      }
      const base = { reporting_interval_s: 60, thresholds };
      const patched = { ...base, ...PATCH };
      if (widest(LONG, base) <= limit && widest(LONG, patched) > limit && widest(SHORT, patched) <= limit)
        return base;
    }
  }
  throw new Error('no settings near the limit');
}

describe('a rollout of a merge patch', () => {
  let pg: PostgresServer;
  let database: TestDatabase;
  let owner: Kysely<GatewayDatabase>;
  let a: Replica;
  let b: Replica;
  const observers: RawCoapClient[] = [];
  const env = { GATEWAY_DELIVERY_FLUSH_MS: '200', GATEWAY_ROLLOUT_STEP_MS: '200' };
  const near = nearTheLimit();

  beforeAll(async () => {
    pg = await startPostgres();
    database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg.url });
    owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
    await seedDevices(owner);
    await owner
      .insertInto('device_gateway.device_registry')
      .values(
        [SHORT, LONG].map((id) => ({
          device_id: id,
          site_id: demoSites.acmeWarehouse,
          name: id.slice(0, 40),
          model: 'freezer-monitor',
          enabled: true,
          desired_settings: JSON.stringify(near),
        })),
      )
      .execute();
    [a, b] = await Promise.all([startReplica('A', database.url, env), startReplica('B', database.url, env)]);
    await Promise.all([a.waitReady(), b.waitReady()]);
  }, 60_000);

  afterAll(async () => {
    for (const o of observers) await o.close();
    await a.stop();
    await b.stop();
    await owner.destroy();
    await database.drop();
    await pg.stop();
  });

  const plan = { first_wave_count: 10, success_share: 1, abort_share: 1, deadline_s: 30 };

  it('refuses a patch that is not a settings patch, a body with both forms, and a patch no target can take', async () => {
    for (const body of [
      { selector: { device_ids: [FREEZER] }, settings_patch: { reporting_interval_s: 5 }, plan },
      { selector: { device_ids: [FREEZER] }, settings_patch: { colour: 'red' }, plan },
      { selector: { device_ids: [FREEZER] }, settings_patch: {}, plan },
      {
        selector: { device_ids: [FREEZER] },
        settings: { reporting_interval_s: 60 },
        settings_patch: { reporting_interval_s: 60 },
        plan,
      },
    ]) {
      const res = await call(a, 'POST', '/api/rollouts', body);
      expect(res.status).toBe(400);
      expect(res.body.code).toBe('invalid_body');
    }
    // Every target's patched document would be too large: nothing to roll out, nothing written.
    const none = await call(a, 'POST', '/api/rollouts', {
      selector: { device_ids: [LONG] },
      settings_patch: PATCH,
      plan,
    });
    expect(none.status).toBe(400);
    expect(none.body).toMatchObject({ code: 'invalid_body', errors: [{ path: '/settings_patch' }] });
    expect(String(none.body.detail)).toMatch(
      /every target invalid \(1\); the first: the patched settings do not fit/,
    );
    expect((await call(a, 'GET', '/api/rollouts')).body.items).toEqual([]);
  });

  it("keeps each device's other settings, skips the device it would make too large, and its rollback restores exactly", async () => {
    const watch = async (r: Replica, id: string) => {
      const o = await RawCoapClient.observeSettings(r.coapPort, id, id.slice(-6));
      observers.push(o);
      return o;
    };
    const freezer = await watch(b, FREEZER);
    const hvac = await watch(a, HVAC);
    const short = await watch(a, SHORT);
    const long = await watch(b, LONG);

    // An earlier rollout gives the freezer its own thresholds: what it has before the patch.
    const earlier = { reporting_interval_s: 120, thresholds: { temp_c: { min: -30, max: -10 } } };
    const first = await call(a, 'POST', '/api/rollouts', {
      selector: { device_ids: [FREEZER] },
      settings: earlier,
      plan,
    });
    expect(first.status).toBe(201);
    await until(
      () => call(b, 'GET', `/api/rollouts/${String(first.body.rollout_id)}`),
      (r) => r.body.state === 'completed',
    );
    await freezer.waitFor((p) => p.code === '2.05' && (json(p) as unknown as Doc).source === 'rollout');
    const before = new Map(
      [
        [FREEZER, freezer],
        [HVAC, hvac],
        [SHORT, short],
        [LONG, long],
      ].map(([id, o]) => [id as string, lastDoc(o as RawCoapClient)]),
    );
    expect(before.get(FREEZER)!.settings).toEqual(earlier);

    const created = await call(a, 'POST', '/api/rollouts', {
      selector: { device_ids: [FREEZER, HVAC, SHORT, LONG] },
      settings_patch: PATCH,
      plan,
    });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ targets: 4, skipped: 1, state: 'active' });
    const skipped = created.body.skipped_devices as { device_id: string; reason: string }[];
    expect(skipped.map((s) => s.device_id)).toEqual([LONG]);
    expect(skipped[0]!.reason).toMatch(/do not fit one CoAP datagram/);
    const id = String(created.body.rollout_id);

    // Each device gets its own settings with the patch merged in: the freezer keeps its thresholds.
    const expected = (base: Settings): Settings => ({ ...base, ...PATCH });
    for (const [device, o] of [
      [FREEZER, freezer],
      [HVAC, hvac],
      [SHORT, short],
    ] as const) {
      const got = json(
        (
          await o.waitFor(
            (p) => p.code === '2.05' && (json(p) as unknown as Doc).settings.timezone === ZONE,
            15_000,
          )
        ).packet,
      ) as unknown as Doc;
      expect(got.source).toBe('rollout');
      expect(got.settings).toEqual(expected(before.get(device)!.settings));
    }
    expect(lastDoc(freezer).settings).toEqual({
      reporting_interval_s: 240,
      timezone: ZONE,
      thresholds: { temp_c: { min: -30, max: -10 } },
    });
    const done = await until(
      () => call(b, 'GET', `/api/rollouts/${id}`),
      (r) => r.body.state === 'completed',
    );
    expect(done.body).toMatchObject({
      settings_patch: PATCH,
      totals: { targeted: 4, acknowledged: 3, skipped: 1, failed: 0 },
    });
    expect(done.body.settings).toBeUndefined();
    // The rollout names what it skipped, also after the creation's answer.
    expect(done.body.skipped_devices).toEqual([{ device_id: LONG, reason: skipped[0]!.reason }]);
    expect((done.body.events as { kind: string }[]).map((e) => e.kind)).toContain('patch_skipped');
    // The skipped device was never sent anything new.
    expect(lastDoc(long)).toEqual(before.get(LONG));

    // Rolled back: every device it changed gets exactly what it had, as a new, higher version.
    const rolledBack = await call(b, 'POST', `/api/rollouts/${id}/rollback`);
    expect(rolledBack.body).toMatchObject({ state: 'rolled_back', devices_returned: 3 });
    for (const [device, o] of [
      [FREEZER, freezer],
      [HVAC, hvac],
      [SHORT, short],
    ] as const) {
      const had = before.get(device)!;
      const back = json(
        (
          await o.waitFor(
            (p) => p.code === '2.05' && (json(p) as unknown as Doc).settings.timezone !== ZONE,
            10_000,
            o.inbox.findIndex(
              (r) =>
                r.packet.code === '2.05' && (json(r.packet) as unknown as Doc).settings.timezone === ZONE,
            ),
          )
        ).packet,
      ) as unknown as Doc;
      expect(back.settings).toEqual(had.settings);
      expect(back.source).toBe(had.source);
      expect(back.version).toBeGreaterThan(had.version);
    }
  }, 90_000);

  it('skips a device whose merged settings are not valid Device Settings, with the reason, and sends it nothing', async () => {
    // The HVAC unit's registry threshold is 12..18: a minimum of 20 would put it above its maximum. The freezer's
    // threshold of that name does not exist, so it gets one with a minimum only.
    const created = await call(a, 'POST', '/api/rollouts', {
      selector: { device_ids: [HVAC, FREEZER] },
      settings_patch: { thresholds: { supply_temp_c: { min: 20 } } },
      plan,
    });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ targets: 2, skipped: 1 });
    const skipped = created.body.skipped_devices as { device_id: string; reason: string }[];
    expect(skipped.map((s) => s.device_id)).toEqual([HVAC]);
    expect(skipped[0]!.reason).toMatch(/not valid Device Settings: \/thresholds\/supply_temp_c\/min/);
    const rollout = await until(
      () => call(a, 'GET', `/api/rollouts/${String(created.body.rollout_id)}`),
      (r) => r.body.state === 'completed',
    );
    expect(rollout.body).toMatchObject({ totals: { skipped: 1, acknowledged: 1 } });
    const layers = await call(b, 'GET', `/api/devices/${FREEZER}`);
    expect(layers.body.settings).toMatchObject({
      source: 'rollout',
      settings: {
        reporting_interval_s: 120,
        thresholds: { temp_c: { min: -30, max: -10 }, supply_temp_c: { min: 20 } },
      },
    });
    const hvac = await call(b, 'GET', `/api/devices/${HVAC}`);
    expect(hvac.body.settings).toMatchObject({ source: 'registry' });
  }, 60_000);
});
