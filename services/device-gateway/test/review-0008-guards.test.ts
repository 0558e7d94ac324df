// Review of migrations 0008 (rollout guards) and 0009 (delivery order). Each test states the rule it checks;
// on main (01c9d5b) each one fails.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import pg from 'pg';
import { sql } from 'kysely';
import { loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';
import { deliveryOrderMigration } from '../src/db/delivery-order-migration.js';
import { rolloutGuardMigration } from '../src/db/rollout-guard-migration.js';

jest.setTimeout(60_000);

const SITE = 'c0080000-0000-4000-8000-000000000001';
const HOLDER = 'eeeeeeeeeeeeeeee';
const CONTENT = '0123456789abcdef';
const PLAN = {
  first_wave_percent: 100,
  growth_factor: 2,
  success_share: 0,
  abort_share: 1,
  deadline_s: 3600,
};

let gw: GatewayFixture;
let login: pg.Client;

async function ownerClient(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: gw.database.url });
  await c.connect();
  return c;
}

async function register(deviceId: string): Promise<void> {
  await gw.owner
    .insertInto('device_gateway.device_registry')
    .values({
      device_id: deviceId,
      site_id: SITE,
      name: deviceId,
      model: 'r0008',
      desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
    })
    .execute();
}

async function create(deviceIds: string[], interval: number): Promise<string> {
  const { rows } = await login.query<{ r: { rollout_id: string } }>(
    `SELECT device_gateway.rollout_create($1::jsonb, $2::jsonb, $3, $4::jsonb, 100000) AS r`,
    [
      JSON.stringify({ device_ids: deviceIds }),
      JSON.stringify({ reporting_interval_s: interval }),
      CONTENT,
      JSON.stringify(PLAN),
    ],
  );
  expect(rows[0]!.r).toHaveProperty('rollout_id');
  return rows[0]!.r.rollout_id;
}

async function liveAssignmentsOfUnregistered(deviceId: string): Promise<{ device_id: string }[]> {
  const { rows } = await sql<{ device_id: string }>`
    SELECT a.device_id FROM device_gateway.rollout_assignments a
    WHERE a.settings IS NOT NULL AND a.device_id = ${deviceId}
      AND NOT EXISTS (SELECT 1 FROM device_gateway.device_registry r WHERE r.device_id = a.device_id)
    ORDER BY a.device_id`.execute(gw.owner);
  return rows;
}

beforeAll(async () => {
  gw = await startGateway();
  // Named as the replica bus names a replica's session: the lease is held only by a replica that is up (0019).
  login = new pg.Client({
    connectionString: loginUrl(gw.database.url),
    application_name: `device-gateway-bus ${HOLDER}`,
  });
  await login.connect();
  await login.query(`SELECT device_gateway.rollout_lease($1, 60000)`, [HOLDER]);
});

afterAll(async () => {
  await login.end();
  await gw.close();
});

describe('review 0008: an assignment ends with its device, whatever runs at the same time', () => {
  // MEDIUM. rollout_registry_deleted() (rollout-guard-migration.ts:131-135) first asks, without any lock,
  // whether a deleted device has a live assignment, and returns when none does. A driver step running while
  // the registry delete is still uncommitted sees the device (the delete is not visible to it) and assigns it
  // (the step reads the registry without locking it, and rollout_assignments has no foreign key). The trigger
  // had already decided there was nothing to end, so when both commit the deleted device keeps a live
  // assignment: exactly what 0008 set out to make impossible (an id registered again is served the dead
  // unit's rollout settings). Had the trigger taken the writers' lock before looking, the step would have
  // waited for the delete and skipped the device ('left_registry').
  it('a step that overlaps an uncommitted registry delete does not leave the deleted device assigned', async () => {
    await register('r0008-race');
    const rollout = await create(['r0008-race'], 333);
    const owner = await ownerClient();
    try {
      await owner.query('BEGIN');
      await owner.query(`DELETE FROM device_gateway.device_registry WHERE device_id = 'r0008-race'`);
      // The driver's routine step, while the delete is open. On main it does not wait (nothing it locks is
      // held) and assigns the device; a fixed trigger or step may make it wait for the delete, hence the
      // background call.
      const stepping = login.query<{ r: { driver: boolean } }>(
        `SELECT device_gateway.rollout_step($1, 1000) AS r`,
        [HOLDER],
      );
      await new Promise((r) => setTimeout(r, 300));
      await owner.query('COMMIT');
      expect((await stepping).rows[0]!.r).toMatchObject({ driver: true });
    } finally {
      await owner.query('ROLLBACK').catch(() => undefined);
      await owner.end();
    }
    // On main: [{ device_id: 'r0008-race' }] with settings {"reporting_interval_s": 333}.
    expect(await liveAssignmentsOfUnregistered('r0008-race')).toEqual([]);
    // And the next unit registered under that id is served the old rollout's settings.
    await register('r0008-race');
    await gw.app.service.reload();
    await gw.app.rollouts.assignments.sync();
    expect(gw.app.state.settingsDocument('r0008-race')?.body).toMatchObject({ source: 'registry' });
    await login.query(`SELECT device_gateway.rollout_control($1::uuid, 'cancel')`, [rollout]);
  });
});

describe('review 0008: a registry delete in a REPEATABLE READ transaction', () => {
  // LOW (owner side). The triggers read and update rollout_assignments with the deleting transaction's snapshot
  // and do not refuse REPEATABLE READ / SERIALIZABLE the way the rollout writers now do. An owner session (a
  // migration script, a bulk decommissioning job) whose snapshot predates a step's commit does not see the
  // assignment that step wrote, so its DELETE ends nothing, and the deleted device keeps a live assignment
  // (rollout-guard-migration.ts:131-144). Taking the lock first does not help here; the trigger must refuse
  // the level (or not depend on its snapshot).
  it('a DELETE whose snapshot predates a step still ends the assignment the step wrote', async () => {
    await register('r0008-rr');
    const rollout = await create(['r0008-rr'], 335);
    const owner = await ownerClient();
    try {
      await owner.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
      await owner.query('SELECT count(*) FROM device_gateway.rollout_assignments'); // the snapshot
      const { rows } = await login.query<{ r: { assigned: number } }>(
        `SELECT device_gateway.rollout_step($1, 1000) AS r`,
        [HOLDER],
      );
      expect(rows[0]!.r).toMatchObject({ driver: true, assigned: 1 });
      const refused = await owner
        .query(`DELETE FROM device_gateway.device_registry WHERE device_id = 'r0008-rr'`)
        .then(() => owner.query('COMMIT'))
        .then(
          () => undefined,
          (err: { code?: string }) => err.code,
        );
      // Refused (25000 or a serialization failure) is a fix; on main the delete commits and ends nothing.
      const live = refused === undefined ? await liveAssignmentsOfUnregistered('r0008-rr') : [];
      expect(live).toEqual([]);
    } finally {
      await owner.query('ROLLBACK').catch(() => undefined);
      await owner.end();
      await sql`DELETE FROM device_gateway.rollout_assignments WHERE device_id = 'r0008-rr'`.execute(
        gw.owner,
      );
      await login.query(`SELECT device_gateway.rollout_control($1::uuid, 'cancel')`, [rollout]);
    }
  });
});

describe('review 0008: no rollback gives a new unit the settings of the unit it replaced', () => {
  // MEDIUM. The trigger ends a deleted device's assignment but leaves its targets in open rollouts as they
  // were: not yet notified, with prev_rollout_id/prev_settings recording the dead unit's assignment. When the
  // id is registered again (the replaced unit of design §3.9's example) the open rollout's next step notifies
  // the new unit (the step only checks that the id is in the registry and enabled, rollout-migration.ts:
  // 478-497; design §3.9 says a device that left "stays a target and counts as skipped"), and a rollback of that
  // rollout then walks back to the dead unit's prev and assigns it: the new unit is served the settings of a
  // rollout that only ever targeted the old one, source 'rollout', the thing 0008 says cannot happen.
  it('rolling back an open rollout after its target was deleted and registered again gives the registry', async () => {
    await register('r0008-rb');
    // The old unit gets rollout A's settings, and A is finished (cancelled: its assignments stay).
    const a = await create(['r0008-rb'], 501);
    await login.query(`SELECT device_gateway.rollout_step($1, 1000)`, [HOLDER]);
    await login.query(`SELECT device_gateway.rollout_control($1::uuid, 'cancel')`, [a]);
    // Rollout B over it, created before the unit is replaced: it records A's assignment as what it had before.
    const b = await create(['r0008-rb'], 502);
    // The unit is replaced: its row deleted (the trigger ends A's assignment), a new unit under the same id.
    await sql`DELETE FROM device_gateway.device_registry WHERE device_id = 'r0008-rb'`.execute(gw.owner);
    await sql`INSERT INTO device_gateway.device_registry (device_id, site_id, name, model, desired_settings)
      VALUES ('r0008-rb', ${SITE}::uuid, 'new unit', 'new-model', '{"reporting_interval_s": 900}')`.execute(
      gw.owner,
    );
    // B goes on (on main the new unit is notified B's settings here, not skipped), then is rolled back.
    await login.query(`SELECT device_gateway.rollout_step($1, 1000)`, [HOLDER]);
    const { rows } = await login.query<{ r: Record<string, unknown> }>(
      `SELECT device_gateway.rollout_control($1::uuid, 'rollback') AS r`,
      [b],
    );
    expect(rows[0]!.r).toMatchObject({ state: 'rolled_back' });
    const assigned = await sql<{ rollout_id: string; settings: unknown }>`
      SELECT rollout_id::text AS rollout_id, settings FROM device_gateway.rollout_assignments
      WHERE device_id = 'r0008-rb'`.execute(gw.owner);
    // On main: [{ rollout_id: <A>, settings: { reporting_interval_s: 501 } }]: the dead unit's rollout.
    expect(assigned.rows.filter((r) => r.settings !== null)).toEqual([]);
    await gw.app.service.reload();
    await gw.app.rollouts.assignments.sync();
    expect(gw.app.state.settingsDocument('r0008-rb')?.body).toMatchObject({
      source: 'registry',
      settings: { reporting_interval_s: 900 },
    });
  });
});

describe('review 0009: down() restores a working 0007 state', () => {
  // LOW. DELIVERY_ORDER_DOWN (delivery-order-migration.ts:115) is `CREATE FUNCTION delivery_record(text, json)`
  // while 0009's up left that function in place (CREATE OR REPLACE): the down migration fails with 42723
  // (function already exists), so 0009 cannot be rolled back at all (and nothing before it either).
  it('0009 down() runs', async () => {
    {
      const err = await gw.owner
        .transaction()
        .execute(async (trx) => {
          await deliveryOrderMigration.down!(trx);
          throw new Error('rollback');
        })
        .catch((e: Error & { code?: string }) => e);
      // On main: error 42723, function "delivery_record" already exists with same argument types.
      expect({ message: err.message, code: err.code }).toEqual({ message: 'rollback', code: undefined });
    }
  });
});

describe('review 0008: up() applies to a database in the state it was written to fix', () => {
  // LOW. Before 0008, rollout_lease(id, NULL) wrote a lease with a holder and a NULL expiry (the NOT BETWEEN
  // on NULL of review 27b). 0008 adds CHECK ((holder IS NULL) = (expires_at IS NULL)) without first clearing
  // such a row (rollout-guard-migration.ts:57-58), so on a database where that ever happened the migration
  // fails with 23514 and nothing of 0008 (nor 0009) can be applied until someone repairs the row by hand.
  it('0008 up() runs after the old rollout_lease wrote a lease with no expiry', async () => {
    const err = await gw.owner
      .transaction()
      .execute(async (trx) => {
        await rolloutGuardMigration.down!(trx);
        // The 0007 function, as the login could call it then.
        await sql`SELECT device_gateway.rollout_release(holder) FROM device_gateway.rollout_driver`.execute(
          trx,
        );
        await sql`SELECT device_gateway.rollout_lease('abababababababab', NULL)`.execute(trx);
        const { rows } = await sql<{ holder: string | null; expires_at: Date | null }>`
          SELECT holder, expires_at FROM device_gateway.rollout_driver`.execute(trx);
        if (rows[0]?.holder !== 'abababababababab' || rows[0].expires_at !== null) throw new Error('setup');
        await rolloutGuardMigration.up(trx);
        throw new Error('rollback');
      })
      .catch((e: Error & { code?: string }) => e);
    // On main: 23514, check constraint "rollout_driver_lease_check" is violated by some row.
    expect({ message: err.message, code: err.code }).toEqual({ message: 'rollback', code: undefined });
  });
});

describe('review 0008: on-call finds the session that stalls the driver', () => {
  // LOW. Design §3.9 / operations §14: a login session left idle in a transaction after a real write stalls the
  // driver, and on-call finds it as an `idle in transaction` session holding a lock on rollout_driver. A
  // pause, resume or cancel takes no writers' lock, but locks the rollout's row (rollout_control_body, FOR
  // UPDATE); the next step locks the rollout_driver row and then waits for that row lock (it locks every open
  // rollout, rollout-migration.ts:374), so every step, lease renewal, creation and rollback waits behind the
  // step. The session that causes it holds no lock on rollout_driver, and the documented query does not list
  // that session (the step that does hold it is 'active', not idle).
  it('a session idle after a pause either does not stall a step or is what the operations query lists', async () => {
    await register('r0008-idle');
    const rollout = await create(['r0008-idle'], 336);
    const idle = new pg.Client({ connectionString: loginUrl(gw.database.url) });
    const driver = new pg.Client({ connectionString: loginUrl(gw.database.url) });
    await idle.connect();
    await driver.connect();
    try {
      await idle.query('BEGIN');
      await idle.query(`SELECT device_gateway.rollout_control($1::uuid, 'pause')`, [rollout]);
      const pid = (await idle.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      await driver.query(`SET statement_timeout = 1500`);
      const stepped = await driver.query(`SELECT device_gateway.rollout_step($1, 1000)`, [HOLDER]).then(
        () => 'ran',
        (err: { code?: string }) => err.code,
      );
      // The query of operations §14, as written there.
      const listed = await sql<{ pid: number }>`
        SELECT pid, application_name, client_addr, state, now() - xact_start AS open_for
        FROM pg_stat_activity
        WHERE usename = 'device_gateway_login' AND state LIKE 'idle in transaction%'`.execute(gw.owner);
      // On main: stepped = '57014' (the step waited for the idle session), and the query lists nothing.
      expect(stepped === 'ran' || listed.rows.some((r) => r.pid === pid)).toBe(true);
    } finally {
      await idle.query('ROLLBACK').catch(() => undefined);
      await idle.end();
      await driver.end();
      await login.query(`SELECT device_gateway.rollout_control($1::uuid, 'cancel')`, [rollout]);
    }
  });
});
