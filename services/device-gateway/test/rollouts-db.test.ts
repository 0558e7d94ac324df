// Staged rollouts in the database (migration 0006, design §3.9): the login writes only through the SECURITY
// DEFINER functions; creation resolves, cuts waves and refuses overlaps; the lease admits one driver; a step
// advances a wave once, reads outcomes from the delivery record, keeps the rate and trips the abort criterion.
import { createDb, sqlState } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { loginUrl } from './support/gateway.js';

const SITE = 'c3000000-0000-4000-8000-000000000001';
const OTHER_SITE = 'c3000000-0000-4000-8000-000000000002';
const CONTENT = '0123456789abcdef';
const A = 'aaaaaaaaaaaaaaaa';
const B = 'bbbbbbbbbbbbbbbb';

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let login: Kysely<GatewayDatabase>;
/** Replicas A and B are up: a session of the login each, named as the replica bus names it (0019). */
const busSessions: pg.Client[] = [];

const plan = (extra: Record<string, unknown> = {}) => ({
  first_wave_count: 2,
  growth_factor: 2,
  success_share: 0.5,
  abort_share: 0.5,
  deadline_s: 1,
  ...extra,
});

async function create(selector: unknown, p: unknown): Promise<Record<string, unknown>> {
  const { rows } = await sql<{ r: Record<string, unknown> }>`
    SELECT device_gateway.rollout_create(${JSON.stringify(selector)}::jsonb, '{"reporting_interval_s": 300}'::jsonb,
      ${CONTENT}, ${JSON.stringify(p)}::jsonb, 100000) AS r`.execute(login);
  return rows[0]!.r;
}

async function step(replica: string, max = 1000, judge = true): Promise<Record<string, unknown>> {
  const { rows } = await sql<{ r: Record<string, unknown> }>`
    SELECT device_gateway.rollout_step(${replica}, ${max}, ${judge}) AS r`.execute(login);
  return rows[0]!.r;
}

async function lease(replica: string, ttlMs = 2000): Promise<boolean> {
  const { rows } = await sql<{ ok: boolean }>`
    SELECT device_gateway.rollout_lease(${replica}, ${ttlMs}) AS ok`.execute(login);
  return rows[0]!.ok;
}

async function targets(id: unknown) {
  const { rows } = await sql<{
    device_id: string;
    wave: number;
    notified: boolean;
    outcome: string | null;
    outcome_reason: string | null;
  }>`SELECT device_id, wave, notified_at IS NOT NULL AS notified, outcome, outcome_reason
     FROM device_gateway.rollout_targets WHERE rollout_id = ${id} ORDER BY position`.execute(owner);
  return rows;
}

/** The delivery record says the device acknowledged CONTENT (as a replica's batch would). */
async function acknowledge(deviceIds: string[]): Promise<void> {
  const now = Date.now();
  const rows = deviceIds.map((d) => ({ d, av: now * 1000, ac: CONTENT, aa: now, at: 'plain', h: now, r: 1 }));
  await sql`SELECT device_gateway.delivery_record(${A}, ${JSON.stringify(rows)}::json)`.execute(owner);
}

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  const quiet = { warn: () => undefined };
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: quiet });
  login = createDb<GatewayDatabase>(loginUrl(database.url), { max: 2, logger: quiet });
  const devices = Array.from({ length: 12 }, (_, i) => ({
    device_id: `ro-${String(i).padStart(2, '0')}`,
    site_id: i < 10 ? SITE : OTHER_SITE,
    name: `device ${i}`,
    model: i % 2 === 0 ? 'hvac' : 'meter',
    desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
  }));
  await owner.insertInto('device_gateway.device_registry').values(devices).execute();
  for (const replica of [A, B]) {
    const c = new pg.Client({
      connectionString: loginUrl(database.url),
      application_name: `device-gateway-bus ${replica}`,
    });
    await c.connect();
    busSessions.push(c);
  }
});

afterAll(async () => {
  for (const c of busSessions) await c.end();
  await login.destroy();
  await owner.destroy();
  await database.drop();
});

describe('migration 0006: the login and the rollout tables', () => {
  it('writes no rollout table directly', async () => {
    for (const statement of [
      sql`INSERT INTO device_gateway.rollout_assignments (device_id, rollout_id, settings, seq) VALUES ('ro-00', gen_random_uuid(), '{}', 1)`,
      sql`UPDATE device_gateway.rollout_driver SET holder = ${A}`,
      sql`DELETE FROM device_gateway.rollouts`,
      sql`UPDATE device_gateway.rollout_targets SET outcome = 'acknowledged'`,
      sql`INSERT INTO device_gateway.rollout_events (rollout_id, kind, actor) VALUES (gen_random_uuid(), 'created', 'x')`,
    ]) {
      const err = await statement.execute(login).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(sqlState(err)).toBe('42501');
    }
  });

  it('the delivery record may say a desired version came from a rollout', async () => {
    const now = Date.now();
    const row = [{ d: 'ro-11', dv: now * 1000, ds: 'rollout', dc: CONTENT, da: now }];
    await sql`SELECT device_gateway.delivery_record(${A}, ${JSON.stringify(row)}::json)`.execute(owner);
    const { rows } = await sql<{ desired_source: string }>`
      SELECT desired_source FROM device_gateway.device_delivery WHERE device_id = 'ro-11'`.execute(owner);
    expect(rows[0]!.desired_source).toBe('rollout');
  });
});

describe('rollout_create', () => {
  it('resolves every criterion given together and cuts growing waves', async () => {
    const r = await create({ site_ids: [SITE], models: ['hvac'] }, plan());
    // 5 hvac devices at SITE: waves of 2, then 4 (3 left).
    expect(r).toMatchObject({ targets: 5, waves: 2 });
    const t = await targets(r.rollout_id);
    expect(t.map((x) => x.wave)).toEqual([1, 1, 2, 2, 2]);
    expect(new Set(t.map((x) => x.device_id))).toEqual(
      new Set(['ro-00', 'ro-02', 'ro-04', 'ro-06', 'ro-08']),
    );
    await sql`SELECT device_gateway.rollout_control(${r.rollout_id}::uuid, 'cancel')`.execute(login);
  });

  it('refuses an overlap with an open rollout, naming it, and finds no targets as such', async () => {
    const first = await create({ device_ids: ['ro-01', 'ro-03'] }, plan());
    const second = await create({ site_ids: [SITE], models: ['meter'] }, plan());
    expect(second).toEqual({ conflict: first.rollout_id, devices: 2 });
    expect(await create({ device_ids: ['nope'] }, plan())).toEqual({ error: 'no_targets' });
    await sql`SELECT device_gateway.rollout_control(${first.rollout_id}::uuid, 'cancel')`.execute(login);
    expect(await create({ site_ids: [SITE], models: ['meter'] }, plan())).toHaveProperty('targets', 5);
    const { rows } = await sql<{ id: string }>`
      SELECT rollout_id::text AS id FROM device_gateway.rollouts WHERE state = 'active'`.execute(owner);
    for (const { id } of rows)
      await sql`SELECT device_gateway.rollout_control(${id}::uuid, 'cancel')`.execute(login);
  });
});

describe('the driver', () => {
  it('one lease holder at a time; a step by anyone else does nothing', async () => {
    expect(await lease(A, 300)).toBe(true);
    expect(await lease(B, 300)).toBe(false);
    expect(await step(B)).toEqual({ driver: false });
    await new Promise((r) => setTimeout(r, 400));
    expect(await lease(B, 300)).toBe(true);
    expect(await step(A)).toEqual({ driver: false });
    await sql`SELECT device_gateway.rollout_release(${B})`.execute(login);
  });

  it('advances wave by wave on acknowledgements, skips a disabled device, and trips the abort criterion', async () => {
    expect(await lease(A, 60_000)).toBe(true);
    const r = await create({ site_ids: [SITE] }, plan({ first_wave_count: 2, growth_factor: 3 }));
    expect(r).toMatchObject({ targets: 10, waves: 3 }); // 2, 6, 2
    const id = r.rollout_id as string;
    expect(await step(A)).toMatchObject({ driver: true, assigned: 2 });
    let t = await targets(id);
    // A second step assigns nothing more: the wave's devices are notified, not acknowledged.
    expect(await step(A)).toMatchObject({ assigned: 0 });
    await acknowledge(t.filter((x) => x.wave === 1).map((x) => x.device_id));
    // Wave 2: one device is disabled meanwhile (skipped, not failed).
    const disabled = t.find((x) => x.wave === 2)!.device_id;
    await owner
      .updateTable('device_gateway.device_registry')
      .set({ enabled: false })
      .where('device_id', '=', disabled)
      .execute();
    // The disabled device is skipped, not assigned.
    expect(await step(A)).toMatchObject({ assigned: 5 });
    expect(await step(A)).toMatchObject({ assigned: 0 });
    t = await targets(id);
    expect(t.filter((x) => x.wave === 1).every((x) => x.outcome === 'acknowledged')).toBe(true);
    expect(t.find((x) => x.device_id === disabled)).toMatchObject({
      outcome: 'skipped',
      outcome_reason: 'disabled',
    });
    // Wave 2: three of five acknowledge, two never do, and one of those leaves the registry after it was
    // notified: at the deadline it is skipped, the other failed (1 of 4, below the 50 % abort share); 3 of 4
    // acknowledged meets the 50 % success share: wave 3 starts.
    const wave2 = t.filter((x) => x.wave === 2 && x.outcome === null).map((x) => x.device_id);
    await acknowledge(wave2.slice(0, 3));
    const leaving = await owner
      .deleteFrom('device_gateway.device_registry')
      .where('device_id', '=', wave2[4]!)
      .returningAll()
      .executeTakeFirstOrThrow();
    await new Promise((res) => setTimeout(res, 1100));
    expect(await step(A)).toMatchObject({ assigned: 2 });
    t = await targets(id);
    expect(t.filter((x) => x.outcome === 'failed').map((x) => x.outcome_reason)).toEqual(['no_relation']);
    expect(t.find((x) => x.device_id === wave2[4])).toMatchObject({
      outcome: 'skipped',
      outcome_reason: 'left_registry',
    });
    await owner
      .insertInto('device_gateway.device_registry')
      .values({ ...leaving, desired_settings: JSON.stringify(leaving.desired_settings) })
      .execute();
    // Wave 3: both silent: 2 of 2 failed, the rollout pauses itself with the reason.
    await new Promise((res) => setTimeout(res, 1100));
    await step(A);
    const { rows } = await sql<{ state: string; aborted: boolean; reason: string }>`
      SELECT state, aborted, reason FROM device_gateway.rollouts WHERE rollout_id = ${id}::uuid`.execute(
      owner,
    );
    expect(rows[0]).toMatchObject({ state: 'paused', aborted: true });
    expect(rows[0]!.reason).toMatch(/^aborted: wave 3 had 2 of 2 devices fail/);
    const events = await sql<{ kind: string; wave: number | null }>`
      SELECT kind, wave FROM device_gateway.rollout_events WHERE rollout_id = ${id}::uuid ORDER BY event_id`.execute(
      owner,
    );
    expect(events.rows.filter((e) => e.kind === 'wave_started').map((e) => e.wave)).toEqual([1, 2, 3]);
    expect(events.rows.at(-1)).toEqual({ kind: 'aborted', wave: 3 });
    // Roll back: the notified devices still on this rollout get what they had (the registry's: NULL settings),
    // in new rows. Nine were assigned; the one that left the registry lost its assignment when it left
    // (migration 0008), so eight are returned.
    const back = await sql<{ r: Record<string, unknown> }>`
      SELECT device_gateway.rollout_control(${id}::uuid, 'rollback') AS r`.execute(login);
    expect(back.rows[0]!.r).toEqual({ state: 'rolled_back', returned: 8 });
    const assigned = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM device_gateway.rollout_assignments
      WHERE rollout_id = ${id}::uuid AND settings IS NOT NULL`.execute(owner);
    expect(assigned.rows[0]!.n).toBe(0);
    await owner
      .updateTable('device_gateway.device_registry')
      .set({ enabled: true })
      .where('device_id', '=', disabled)
      .execute();
  });

  it('the rate limit: no more than max_per_minute a minute, one second of burst', async () => {
    expect(await lease(A, 60_000)).toBe(true);
    const r = await create(
      { site_ids: [SITE] },
      plan({ first_wave_count: undefined, first_wave_percent: 100, max_per_minute: 120 }),
    );
    expect(r).toMatchObject({ targets: 10, waves: 1 });
    const id = r.rollout_id as string;
    const started = Date.now();
    let assigned = 0;
    while (Date.now() - started < 2000) {
      assigned += (await step(A)).assigned as number;
      await new Promise((res) => setTimeout(res, 100));
    }
    // 2 a second for 2 s, plus at most a second's worth (2).
    expect(assigned).toBeGreaterThanOrEqual(3);
    expect(assigned).toBeLessThanOrEqual(6);
    await sql`SELECT device_gateway.rollout_control(${id}::uuid, 'cancel')`.execute(login);
  });
});
