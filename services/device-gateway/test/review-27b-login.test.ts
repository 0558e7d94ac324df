// Cold review 27b of the staged rollouts: what the gateway's login can do through the SECURITY DEFINER functions
// alone (it has SELECT on the rollout tables and EXECUTE on the functions, nothing else). Each test states the
// rule it checks; on main (6bde4f6) each one fails.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import pg from 'pg';
import { sql } from 'kysely';
import request from 'supertest';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';

jest.setTimeout(60_000);

const SITE = 'c27b0000-0000-4000-8000-000000000001';
const key = `Bearer ${API_KEYS[0]}`;
const CONTENT = '0123456789abcdef';

let gw: GatewayFixture;

async function client(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: loginUrl(gw.database.url) });
  await c.connect();
  return c;
}

const PLAN = { first_wave_count: 10, growth_factor: 2, success_share: 0, abort_share: 1, deadline_s: 3600 };

async function createAs(c: pg.Client, deviceIds: string[]): Promise<Record<string, unknown>> {
  const { rows } = await c.query<{ r: Record<string, unknown> }>(
    `SELECT device_gateway.rollout_create($1::jsonb, '{"reporting_interval_s": 300}'::jsonb, $2, $3::jsonb, 100000) AS r`,
    [JSON.stringify({ device_ids: deviceIds }), CONTENT, JSON.stringify(PLAN)],
  );
  return rows[0]!.r;
}

async function cancelAllOpen(): Promise<void> {
  const { rows } = await sql<{ id: string }>`
    SELECT rollout_id::text AS id FROM device_gateway.rollouts WHERE state IN ('active', 'paused')`.execute(
    gw.owner,
  );
  const c = await client();
  try {
    for (const { id } of rows)
      await c.query(`SELECT device_gateway.rollout_control($1::uuid, 'cancel')`, [id]);
  } finally {
    await c.end();
  }
}

beforeAll(async () => {
  gw = await startGateway();
  await gw.owner
    .insertInto('device_gateway.device_registry')
    .values(
      ['r27b-1', 'r27b-2', 'r27b-3', 'r27b-4'].map((device_id) => ({
        device_id,
        site_id: SITE,
        name: device_id,
        model: 'r27b',
        desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
      })),
    )
    .execute();
  await gw.app.service.reload();
});

afterAll(async () => {
  await gw.close();
});

describe('review 27b: a device belongs to at most one open rollout', () => {
  // MEDIUM. rollout_create serialises creations with the lease-row lock and a SHARE ROW EXCLUSIVE table lock, then
  // checks overlaps with a plain SELECT. That is sound only under READ COMMITTED, where the SELECT takes a new
  // snapshot after the locks. Under REPEATABLE READ (or SERIALIZABLE) the snapshot is the transaction's first
  // statement's, taken before the locks: a creation committed in between is invisible to the overlap check, and
  // the locks (FOR UPDATE of a row the other creation only locked, never updated) raise no serialization error.
  // The login gets two open rollouts over the same devices (rollout-migration.ts:160-192).
  it('a creation in a REPEATABLE READ transaction cannot overlap an open rollout created meanwhile', async () => {
    const a = await client();
    const b = await client();
    try {
      await a.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await a.query('SELECT count(*) FROM device_gateway.rollouts'); // the snapshot
      const first = await createAs(b, ['r27b-1', 'r27b-2']);
      expect(first).toHaveProperty('rollout_id');
      // Refused outright (rollout writes run at READ COMMITTED, SQLSTATE 25000), or answered with the conflict.
      const second = await createAs(a, ['r27b-1', 'r27b-2', 'r27b-3']).catch((err: { code?: string }) => ({
        refused: err.code,
      }));
      await a.query(second.refused === undefined ? 'COMMIT' : 'ROLLBACK');
      const { rows } = await sql<{ device_id: string; open: number }>`
        SELECT t.device_id, count(*)::int AS open FROM device_gateway.rollout_targets t
        JOIN device_gateway.rollouts r ON r.rollout_id = t.rollout_id AND r.state IN ('active', 'paused')
        GROUP BY t.device_id HAVING count(*) > 1 ORDER BY t.device_id`.execute(gw.owner);
      // On main: second = { rollout_id, targets: 3, waves: 1 } and r27b-1, r27b-2 are in two open rollouts.
      expect(rows).toEqual([]);
      expect([{ refused: '25000' }, { conflict: first.rollout_id, devices: 2 }]).toContainEqual(second);
    } finally {
      await a.query('ROLLBACK').catch(() => undefined);
      await a.end();
      await b.end();
      await cancelAllOpen();
    }
  });
});

describe('review 27b: no login session can stall the driver', () => {
  // MEDIUM. Design §3.9: "The login cannot take that lock itself (it has SELECT only, and FOR UPDATE needs
  // UPDATE)". It can, through the functions: rollout_control(any uuid, 'rollback') locks the rollout_driver row
  // FOR UPDATE before it even looks the rollout up (rollout-migration.ts:249-251), and so does rollout_step for
  // any p_replica (line 366). In a transaction left open, the row stays locked: every replica's lease renewal
  // (an UPDATE of that row), every step, every creation and every rollback waits on it (in production each
  // fails after DB_STATEMENT_TIMEOUT_MS, 4 s, and the next tick waits again). No wave advances and no
  // operator rollback gets through for as long as the session idles (idle_in_transaction_session_timeout is 0).
  it('a login transaction left open after a call does not hold the lease row', async () => {
    const res = await request(gw.app.http)
      .post('/api/rollouts')
      .set('Authorization', key)
      .send({
        selector: { device_ids: ['r27b-4'] },
        settings: { reporting_interval_s: 444 },
        plan: { first_wave_count: 1, success_share: 0, abort_share: 1, deadline_s: 3600 },
      });
    expect(res.status).toBe(201);
    const attacker = await client();
    try {
      await attacker.query('BEGIN');
      // A rollback of a rollout that does not exist: answers {error: unknown}, keeps the lock.
      const { rows } = await attacker.query<{ r: unknown }>(
        `SELECT device_gateway.rollout_control(gen_random_uuid(), 'rollback') AS r`,
      );
      expect(rows[0]!.r).toEqual({ error: 'unknown' });
      // The replica's driver: one tick takes the lease and steps (buildApp does not start it; a tick is what
      // its timer would run).
      const tick = gw.app.rollouts.driver.tick();
      const finished = await Promise.race([
        tick.then(() => true),
        new Promise<boolean>((r) => setTimeout(() => r(false), 5000)),
      ]);
      // On main: false (the tick waits on the lease row for as long as the attacker's transaction is open).
      expect(finished).toBe(true);
    } finally {
      await attacker.query('ROLLBACK').catch(() => undefined);
      await attacker.end();
    }
    await gw.app.rollouts.driver.tick();
    await cancelAllOpen();
  });
});

describe('review 27b: a lease always expires', () => {
  // MEDIUM (with finding 2). rollout_lease checks `p_ttl_ms NOT BETWEEN 100 AND 600000`, which is NULL, not true,
  // for a NULL TTL (and `p_replica !~ ...` for a NULL id), so the call passes and writes expires_at = NULL
  // (rollout-migration.ts:317-327). A NULL expiry never compares `< clock_timestamp()`: no other replica's
  // rollout_lease can take the row (WHERE ... OR expires_at < clock_timestamp()), and rollout_step accepts the
  // holder forever (line 367). One call with the id of a replica that is gone, or of no replica, stops rollouts
  // for good: no wave advances until someone finds the row and releases it by hand.
  it('a lease taken with a NULL TTL is refused (or expires like any other)', async () => {
    const attacker = await client();
    try {
      const { rows: held } = await attacker.query<{ holder: string | null }>(
        `SELECT holder FROM device_gateway.rollout_driver`,
      );
      if (held[0]!.holder !== null)
        await attacker.query(`SELECT device_gateway.rollout_release($1)`, [held[0]!.holder]);
      const taken = await attacker
        .query<{ ok: boolean }>(`SELECT device_gateway.rollout_lease('0123456789abcdef', NULL) AS ok`)
        .then(
          (r) => r.rows[0]!.ok,
          () => false,
        );
      const { rows } = await sql<{ holder: string | null; expires: boolean }>`
        SELECT holder, expires_at IS NOT NULL AS expires FROM device_gateway.rollout_driver`.execute(
        gw.owner,
      );
      // On main: taken = true and { holder: '0123456789abcdef', expires: false }: a lease that never ends.
      expect({ taken, ...rows[0] }).not.toMatchObject({ taken: true, expires: false });
    } finally {
      await attacker
        .query(`SELECT device_gateway.rollout_release('0123456789abcdef')`)
        .catch(() => undefined);
      await attacker.end();
    }
  });
});
