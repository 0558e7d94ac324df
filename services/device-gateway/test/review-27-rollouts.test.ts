// Review of issue 27 (staged rollouts): proofs of concept. Each test states the rule it checks; on the reviewed
// branch (7877106) every test here fails.
import pg from 'pg';
import { sql } from 'kysely';
import request from 'supertest';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';

const SITE = 'c2700000-0000-4000-8000-000000000001';
const HOLDER = 'cccccccccccccccc';
const key = `Bearer ${API_KEYS[0]}`;

let gw: GatewayFixture;
/** One session of the gateway's login (what any code holding DATABASE_URL can open). */
let login: pg.Client;

beforeAll(async () => {
  gw = await startGateway();
  await gw.owner
    .insertInto('device_gateway.device_registry')
    .values(
      ['r27-a', 'r27-b', 'r27-c', 'r27-d'].map((device_id) => ({
        device_id,
        site_id: SITE,
        name: device_id,
        model: 'r27',
        desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
      })),
    )
    .execute();
  await gw.app.service.reload();
  // Named as the replica bus names a replica's session: the lease is held only by a replica that is up (0019).
  login = new pg.Client({
    connectionString: loginUrl(gw.database.url),
    application_name: `device-gateway-bus ${HOLDER}`,
  });
  await login.connect();
  // This test plays the driver (buildApp starts none): the login takes the lease as any replica would.
  await login.query(`SELECT device_gateway.rollout_lease($1, 60000)`, [HOLDER]);
});

afterAll(async () => {
  await login.end();
  await gw.close();
});

const plan = { first_wave_percent: 100, success_share: 0, abort_share: 1, deadline_s: 3600 };

async function createRollout(deviceIds: string[], settings: Record<string, unknown>): Promise<string> {
  const res = await request(gw.app.http)
    .post('/api/rollouts')
    .set('Authorization', key)
    .send({ selector: { device_ids: deviceIds }, settings, plan });
  expect(res.status).toBe(201);
  return res.body.rollout_id as string;
}

async function control(id: string, action: string): Promise<request.Response> {
  return request(gw.app.http).post(`/api/rollouts/${id}/${action}`).set('Authorization', key);
}

async function step(): Promise<Record<string, unknown>> {
  const { rows } = await login.query<{ r: Record<string, unknown> }>(
    `SELECT device_gateway.rollout_step($1, 1000) AS r`,
    [HOLDER],
  );
  return rows[0]!.r;
}

async function assignmentInDb(deviceId: string) {
  const { rows } = await sql<{ rollout_id: string; settings: unknown }>`
    SELECT rollout_id::text AS rollout_id, settings FROM device_gateway.rollout_assignments
    WHERE device_id = ${deviceId}`.execute(gw.owner);
  return rows[0];
}

describe('review 27: the SECURITY DEFINER functions', () => {
  // HIGH. `SET search_path = pg_catalog` leaves pg_temp searched FIRST for types (PostgreSQL docs, "Writing
  // SECURITY DEFINER Functions Safely"). The login may create temporary objects (PUBLIC has TEMP), so it
  // shadows `text` with a temporary table's row type and adds an assignment cast from pg_catalog.text whose
  // function it wrote. rollout_step's `v_actor text := ...` then runs that function as the functions' owner
  // (the migration owner; a superuser in the tests): any SQL, e.g. a write to the registry.
  it('the login cannot run its own SQL as the functions owner through a pg_temp type (rollout_step)', async () => {
    // Since 0031 PUBLIC has no TEMP on the platform's database; given back here, so the definer functions' own
    // search_path (0007) is what this checks.
    await sql.raw(`GRANT TEMP ON DATABASE "${gw.database.name}" TO device_gateway_login`).execute(gw.owner);
    const attacker = new pg.Client({ connectionString: loginUrl(gw.database.url) });
    await attacker.connect();
    try {
      await attacker.query(`CREATE TEMP TABLE "text" (v pg_catalog.text)`);
      await attacker.query(`CREATE FUNCTION pg_temp.evil(pg_catalog.text) RETURNS pg_temp.text LANGUAGE sql AS $f$
        INSERT INTO device_gateway.device_registry (device_id, site_id, name, model, desired_settings)
        VALUES ('r27-pwned', '00000000-0000-4000-8000-000000000000', current_user::pg_catalog.text, 'x', '{}');
        SELECT ROW($1)::pg_temp.text $f$`);
      await attacker.query(
        `CREATE CAST (pg_catalog.text AS pg_temp.text) WITH FUNCTION pg_temp.evil(pg_catalog.text) AS ASSIGNMENT`,
      );
      // The holder is readable by the login (SELECT on rollout_driver); a step in its name is enough.
      const { rows: held } = await attacker.query<{ holder: string }>(
        `SELECT holder FROM device_gateway.rollout_driver`,
      );
      await attacker
        .query(`SELECT device_gateway.rollout_step($1, 1)`, [held[0]!.holder])
        .catch(() => undefined);
    } finally {
      await attacker.end();
      await sql
        .raw(`REVOKE TEMP ON DATABASE "${gw.database.name}" FROM device_gateway_login`)
        .execute(gw.owner);
    }
    const { rows } = await sql<{ name: string }>`
      SELECT name FROM device_gateway.device_registry WHERE device_id = 'r27-pwned'`.execute(gw.owner);
    // On the branch: [{ name: 'postgres' }]: the registry row was written, as the owner.
    expect(rows).toEqual([]);
  });
});

describe('review 27: rollbacks', () => {
  // MEDIUM. A rolled-back rollout's settings come back: A assigned d, B assigned d on top (prev = A). Rolling A
  // back first changes nothing (d is B's); rolling B back then returns d to A's settings, recorded at B's
  // creation, although A is rolled back. Both rolled back, the device serves A's settings for good.
  it('rolling back A then B (both over one device) leaves the device on the registry, not on A', async () => {
    const a = await createRollout(['r27-c'], { reporting_interval_s: 111 });
    await step();
    expect((await control(a, 'cancel')).status).toBe(200);
    const b = await createRollout(['r27-c'], { reporting_interval_s: 222 });
    await step();
    expect((await control(b, 'cancel')).status).toBe(200);
    expect((await control(a, 'rollback')).status).toBe(200);
    expect((await control(b, 'rollback')).status).toBe(200);
    // On the branch: { rollout_id: a, settings: { reporting_interval_s: 111 } }.
    expect((await assignmentInDb('r27-c'))?.settings ?? null).toBeNull();
    await gw.app.rollouts.assignments.sync();
    expect(gw.app.state.assignmentOf('r27-c')).toBeUndefined();
  });
});

describe('review 27: replicas read assignments by seq', () => {
  // MEDIUM. Replicas read `seq > last seen`, but seq is taken by nextval inside the writer's transaction and
  // the writers are not serialised with each other: a rollback of a finished rollout (rollout_control locks
  // only that rollout's row) and a driver step run at once. If the step (higher seq) commits and a replica
  // reads before the rollback (lower seq) commits, the replica never reads the rollback's rows: its devices
  // keep the rolled-back settings on that replica until it restarts, although the API said "rolled_back".
  it('a rollback committed after a step with a higher seq still reaches the replica', async () => {
    const a = await createRollout(['r27-a'], { reporting_interval_s: 333 });
    await step();
    expect((await control(a, 'cancel')).status).toBe(200);
    await gw.app.rollouts.assignments.sync();
    expect(gw.app.state.assignmentOf('r27-a')?.rolloutId).toBe(a);
    await createRollout(['r27-b'], { reporting_interval_s: 444 });
    // The operator's rollback of A, in flight (its nextval taken, not yet committed).
    const operator = new pg.Client({ connectionString: loginUrl(gw.database.url) });
    await operator.connect();
    try {
      await operator.query('BEGIN');
      const { rows } = await operator.query<{ r: { state: string; returned: number } }>(
        `SELECT device_gateway.rollout_control($1::uuid, 'rollback') AS r`,
        [a],
      );
      expect(rows[0]!.r).toEqual({ state: 'rolled_back', returned: 1 });
      // Meanwhile the driver's step assigns B's device and commits; the replica reads on its NOTIFY. (A fix that
      // serialises the writers makes the step wait for the commit below: then it is awaited after it.)
      const stepped = step();
      const done = await Promise.race([
        stepped.then(() => true),
        new Promise((r) => setTimeout(() => r(false), 500)),
      ]);
      // On the branch the step does not wait: the replica reads B's assignment, past A's uncommitted seq.
      if (done) await gw.app.rollouts.assignments.sync();
      await operator.query('COMMIT');
      expect(await stepped).toMatchObject({ assigned: 1 });
    } finally {
      await operator.end();
    }
    // The rollback's NOTIFY: the replica reads again.
    await gw.app.rollouts.assignments.sync();
    expect((await assignmentInDb('r27-a'))?.settings ?? null).toBeNull();
    // On the branch: still A's assignment (reporting_interval_s 333) on this replica.
    expect(gw.app.state.assignmentOf('r27-a')).toBeUndefined();
  });
});

describe('review 27: HTTP edge', () => {
  // MEDIUM. Valid Device Settings (a threshold of 1e300, accepted by the schema and by notify-settings) are
  // 1024 bytes or more as jsonb text (numeric prints every digit), so the rollouts table's CHECK raises 23514,
  // which mapDbError rethrows: a 500 for a valid request (design §2: never a 5xx for the caller's input).
  it('POST /api/rollouts with valid settings whose jsonb text is long is not a 5xx', async () => {
    const settings = {
      thresholds: { t: { min: 1e300 }, u: { max: 1e300 }, v: { min: -1e300 }, w: { max: 9e300 } },
    };
    const notify = await request(gw.app.http)
      .post('/api/notify-settings')
      .set('Authorization', key)
      .send({ device_id: 'r27-d', settings });
    expect(notify.status).toBe(200);
    const res = await request(gw.app.http)
      .post('/api/rollouts')
      .set('Authorization', key)
      .send({ selector: { device_ids: ['r27-d'] }, settings, plan });
    // On the branch: 500 (the CHECK violation 23514 falls through mapDbError as a bug).
    expect(res.status).toBeLessThan(500);
    // Adapted with the fix (rollout-fixes): the table's bound is measured as stored and holds every valid
    // document, so valid settings are a rollout (the review asked for "not a 5xx", and a 4xx as problem+json).
    expect(res.status).toBe(201);
    expect((await control(res.body.rollout_id as string, 'cancel')).status).toBe(200);
    // A CHECK the schema does not express (the selector's stored size) is still the caller's input: 400
    // problem+json naming the field (the log of a real process: review-27-lag.test.ts).
    // 10,000 device ids of three characters: 60 KB as the request's compact JSON (under the 64 KiB body limit),
    // 70 KB as jsonb prints it (", " between items): over the selector's 64 KiB bound as stored.
    const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
    const three = (i: number): string =>
      abc[i % 62]! + abc[Math.floor(i / 62) % 62]! + abc[Math.floor(i / 3844)]!;
    const ids = ['r27-d', ...Array.from({ length: 9999 }, (_, i) => three(i))];
    const big = await request(gw.app.http)
      .post('/api/rollouts')
      .set('Authorization', key)
      .send({ selector: { device_ids: ids }, settings: { reporting_interval_s: 61 }, plan });
    expect(big.status).toBe(400);
    expect(big.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(big.body).toMatchObject({ code: 'invalid_body', errors: [{ path: '/selector' }] });
  });
});

describe('review 27: the criteria', () => {
  // LOW. The criteria compare an integer count with `share * total` in double precision: 0.28 * 25 is
  // 7.000000000000001, so 7 failures of 25 (exactly the 28 % abort share, "abort at 28%") do not abort, and the
  // wave completes; likewise 0.07 * 100, 0.14 * 50, ... (39 exact boundaries of whole percents up to 200
  // devices), and a success share of 0.07 pauses a wave of 100 with exactly 7 acknowledged.
  it('a wave whose failed share equals the abort share aborts', async () => {
    const CONTENT = 'fedcba9876543210';
    const ids = Array.from({ length: 25 }, (_, i) => `r27-f-${String(i).padStart(2, '0')}`);
    await gw.owner
      .insertInto('device_gateway.device_registry')
      .values(ids.map((device_id) => ({ device_id, site_id: SITE, name: device_id, model: 'r27f' })))
      .execute();
    const { rows } = await login.query<{ r: { rollout_id: string } }>(
      `SELECT device_gateway.rollout_create($1::jsonb, '{"reporting_interval_s": 300}'::jsonb, $2, $3::jsonb, 100000) AS r`,
      [
        JSON.stringify({ device_ids: ids }),
        CONTENT,
        JSON.stringify({
          first_wave_count: 25,
          growth_factor: 2,
          success_share: 0,
          abort_share: 0.28,
          deadline_s: 1,
        }),
      ],
    );
    const id = rows[0]!.r.rollout_id;
    await step();
    // 18 acknowledge (as a replica's delivery batch records it); 7 never do.
    const now = Date.now();
    const acks = ids
      .slice(0, 18)
      .map((d) => ({ d, av: now * 1000, ac: CONTENT, aa: now, at: 'plain', h: now, r: 1 }));
    await sql`SELECT device_gateway.delivery_record(${HOLDER}, ${JSON.stringify(acks)}::json)`.execute(
      gw.owner,
    );
    await new Promise((r) => setTimeout(r, 1200));
    await step();
    const state = await sql<{ state: string; aborted: boolean; failed: number }>`
      SELECT r.state, r.aborted,
        (SELECT count(*)::int FROM device_gateway.rollout_targets t
         WHERE t.rollout_id = r.rollout_id AND t.outcome = 'failed') AS failed
      FROM device_gateway.rollouts r WHERE r.rollout_id = ${id}::uuid`.execute(gw.owner);
    expect(state.rows[0]!.failed).toBe(7);
    // On the branch: { state: 'completed', aborted: false }.
    expect(state.rows[0]).toMatchObject({ state: 'paused', aborted: true });
  });
});

describe('review 27: what the issue asks besides code', () => {
  // INFO. The code cites "design §3.9" everywhere, but docs/design.md has no §3.9, §3.3 still says an override
  // replaces the registry's settings and §3.4 lists only "override" | "registry" as sources; docs/operations.md
  // has no rollout runbook, and no alert rule watches gateway_rollouts_aborted (issue 27, Deliver 2 and 5).
  it('design §3.9, the precedence in §3.3, a runbook and an alert exist', async () => {
    const { readFile } = await import('node:fs/promises');
    const root = new URL('../../../', import.meta.url);
    const design = await readFile(new URL('docs/design.md', root), 'utf8');
    const operations = await readFile(new URL('docs/operations.md', root), 'utf8');
    const alerts =
      (await readFile(new URL('deploy/k8s/base/monitoring.yaml', root), 'utf8')) +
      (await readFile(new URL('deploy/monitoring/alerts.yaml', root), 'utf8'));
    expect(design).toMatch(/^### 3\.9 /m);
    expect(design).toMatch(/override[^\n]*>[^\n]*rollout[^\n]*>[^\n]*registry/);
    expect(operations).toMatch(/\/api\/rollouts/);
    expect(alerts).toMatch(/gateway_rollouts_aborted/);
  });
});

// Added with the fixes (rollout-fixes), from the review's "not proven" notes: a replica whose read of the
// assignments fails after a notification read them again only at the next notification or bus resync, so its
// devices could keep old settings for as long as the rollouts were quiet. The read is now retried (0.5 s
// doubling to 10 s) until it succeeds. The failure here is real: the login loses SELECT on the table for a
// while (the step, a SECURITY DEFINER function, still writes).
describe('rollout-fixes: assignment reads', () => {
  it('a failed read after a notification is retried until it succeeds', async () => {
    await gw.owner
      .insertInto('device_gateway.device_registry')
      .values({
        device_id: 'r27-e',
        site_id: SITE,
        name: 'r27-e',
        model: 'r27',
        desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
      })
      .execute();
    await gw.app.service.reload();
    const id = await createRollout(['r27-e'], { reporting_interval_s: 555 });
    const failures = gw.app.rollouts.assignments.stats.failures;
    await sql`REVOKE SELECT ON device_gateway.rollout_assignments FROM device_gateway_login`.execute(
      gw.owner,
    );
    try {
      expect(await step()).toMatchObject({ assigned: 1 });
      // The step's NOTIFY, as the bus hands it over.
      gw.app.rollouts.assignments.receive();
      await new Promise((r) => setTimeout(r, 300));
      expect(gw.app.rollouts.assignments.stats.failures).toBeGreaterThan(failures);
      expect(gw.app.state.assignmentOf('r27-e')).toBeUndefined();
    } finally {
      await sql`GRANT SELECT ON device_gateway.rollout_assignments TO device_gateway_login`.execute(gw.owner);
    }
    for (let i = 0; i < 50 && gw.app.state.assignmentOf('r27-e') === undefined; i++)
      await new Promise((r) => setTimeout(r, 100));
    expect(gw.app.state.assignmentOf('r27-e')?.rolloutId).toBe(id);
    expect((await control(id, 'cancel')).status).toBe(200);
  });
});
