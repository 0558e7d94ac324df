// Fourth cold review of issue 39 §1: the replica bus and the platform database's roles, attacked by (1) a login with
// CONNECT on the platform's database and nothing else, (2) the workflow's login, (3) PostgREST's authenticator (as
// the anonymous role), (4) a login with no grant (it reaches `postgres`), and, for bounds, (5) the gateway's own
// login. Two real replicas (dist/main.js) on a private PostgreSQL 18 with the whole platform's migrations. Each "H"
// test fails against c7535b2 and passes once the hole is closed; the attacks that held are at the end.
//
// - H1 (high). PostgreSQL's lock table is one for the whole cluster (max_locks_per_transaction x (max_connections +
//   max_prepared_transactions) entries, plus whatever shared memory is left), and no login has a quota on it. Any
//   session can fill it: the sequence functions lock the relation they are given by oid for the top transaction
//   before they check that it exists, is a sequence, or may be used (sequence.c, lock_and_open_sequence), so
//   `nextval(<any number>::oid::regclass)` in an open transaction leaves one ROW EXCLUSIVE lock per invented oid,
//   even when it fails inside a savepoint or an exception block (about 24,000 in 4 s here, then "out of shared
//   memory"); currval, both setval and pg_sequence_last_value do the same (a probe of every pg_catalog function
//   taking a regclass found these five), and so do `pg_advisory_lock` (EXECUTE for PUBLIC; session locks stay after
//   an error) and temporary tables (TEMP for PUBLIC). Once it is full, no session of the cluster can take a lock that
//   is not fast-path: a new connection of the gateway's login is refused ("out of shared memory"; the reserved slots
//   do not help, a superuser's connection is refused too), and every write of a running replica fails (a transaction
//   id is a lock), so notify-settings answers 503. It lasts as long as the attacker keeps its transaction (or, for
//   advisory locks, its session). A login with no grant does the same through `postgres` (advisory locks), where
//   PUBLIC keeps CONNECT unless operations §7 was followed; not tested here (the migrations cannot close that).
// - H2 (medium; the gateway's own login; 0033). device_reports bounds a reported version by 2^53 - 1 only and by
//   greatest(p_lv, the record's versions), where p_lv is the caller's word: a report at 2^53 - 1 is recorded, and
//   from then on every true report of the device is `older` and moves nothing (until the year 2255). The record's
//   desired version, which delivery_record_arrays accepts up to now + 1 day, opens the same door for a day.
// - H3 (low-medium; the login). A rollout's settings (rollouts.settings, each target's settings of a patch rollout)
//   may be 64 KiB, where a device takes 1 KiB and an override 4 KiB (the third review's H6); the driver copies them
//   into rollout_assignments (no bound at all), which every replica reads 20,000 rows a page at every start.
// - H4 (low; the login). bus_clear_override keeps a tombstone for any string shaped like a device id, in the
//   registry or not (bus_publish_overrides refuses those): the login can grow bus_overrides without bound, and every
//   replica reads all of it at every resync (readRetained has no limit); only a reload prunes them.
// - Not here (reported, no test): any login with CONNECT can keep a snapshot open for ever and so hold back the
//   xmin horizon of the platform's database (dead rows of rollout_driver, bus_overrides, device_delivery are never
//   removed while it lasts; idle_in_transaction_session_timeout and transaction_timeout are the session's own to
//   change), and can stall a migration's DDL with the sequence-function lock until the run gives up (operations §6
//   documents finding and ending the holder).
import { beforeAll, describe, expect, it, jest } from '@jest/globals';
import { sql, type Kysely } from 'kysely';
import type pg from 'pg';
import type { GatewayDatabase } from '../src/db/tables.js';
import { platformWithTwoReplicas, type PlatformDatabase } from './support/platform-database.js';
import { type Replica } from './support/replicas.js';
import {
  attackersOf,
  connectGatewayLogin,
  postWithin,
  servedBy as servedByOf,
  until,
  within,
} from './support/attack.js';

jest.setTimeout(240_000);

const DEVICE = 'acme-hq-hvac-01';
const env = { LOG_LEVEL: 'warn', GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS: '5000' };
const PLAN = { first_wave_percent: 100, growth_factor: 2, success_share: 0, abort_share: 1, deadline_s: 30 };

let platform: PlatformDatabase;
let owner: Kysely<GatewayDatabase>;
let replicas: Replica[] = [];

const connectGateway = (): Promise<pg.Client> => connectGatewayLogin(platform);
const attackers = attackersOf(() => platform);
const servedBy = (r: Replica, device = DEVICE): Promise<Record<string, unknown>> => servedByOf(r, device);

/**
 * The attack of H1: fills the cluster's lock table from `c` with what PUBLIC may do by default, each way tried
 * only while the one before was refused: ROW EXCLUSIVE locks through nextval() on invented oids (kept for the
 * transaction, which stays open), then session advisory locks, then temporary tables in the open transaction.
 * Returns how many locks each way took and how it stopped.
 */
async function fillLockTable(c: pg.Client): Promise<string[]> {
  const report: string[] = [];
  const full = (msg: string): boolean => /out of shared memory/.test(msg);
  // 1. nextval(<oid>) on oids no relation has: the lock is taken before the oid is looked up.
  await c.query('BEGIN');
  let base = 900_000_000;
  let stopped = '';
  for (let round = 0; round < 100 && stopped === ''; round++) {
    try {
      // Each round in a savepoint of its own: the error that ends the fill aborts that savepoint only, and the
      // locks, held for the top transaction, stay (an error outside a savepoint would abort the transaction).
      await c.query(`SAVEPOINT n${round}`);
      await c.query(`DO $$ BEGIN
        FOR i IN ${base}..${base + 999} LOOP
          BEGIN PERFORM pg_catalog.nextval(i::oid::regclass);
          EXCEPTION WHEN insufficient_privilege OR out_of_memory THEN RAISE; WHEN OTHERS THEN NULL;
          END;
        END LOOP; END $$`);
      base += 1000;
    } catch (err) {
      stopped = (err as Error).message;
    }
  }
  report.push(`nextval on invented oids: ${base - 900_000_000} locks, then ${stopped || 'no refusal'}`);
  if (full(stopped)) return report;
  await c.query('ROLLBACK');
  // 2. Session advisory locks (kept after an error, until the session ends).
  let taken = 0;
  stopped = '';
  for (let round = 0; round < 20 && stopped === ''; round++) {
    try {
      await c.query(
        `SELECT count(pg_catalog.pg_advisory_lock(x)) FROM generate_series(${taken + 1}::bigint, ${taken + 5000}) x`,
      );
      taken += 5000;
    } catch (err) {
      stopped = (err as Error).message;
    }
  }
  report.push(`advisory locks: ${taken}, then ${stopped || 'no refusal'}`);
  if (full(stopped)) return report;
  // 3. Temporary tables, each locked ACCESS EXCLUSIVE until the transaction ends.
  await c.query('BEGIN');
  let tables = 0;
  stopped = '';
  for (let round = 0; round < 40 && stopped === ''; round++) {
    try {
      await c.query(`SAVEPOINT t${round}`);
      await c.query(`DO $$ BEGIN
        FOR i IN ${tables + 1}..${tables + 1000} LOOP
          EXECUTE pg_catalog.format('CREATE TEMP TABLE r39e_%s (x int)', i);
        END LOOP; END $$`);
      tables += 1000;
    } catch (err) {
      stopped = (err as Error).message;
    }
  }
  report.push(`temporary tables: ${tables}, then ${stopped || 'no refusal'}`);
  return report;
}

const fixture = platformWithTwoReplicas(env);
beforeAll(() => {
  ({ platform, owner, replicas } = fixture);
});

describe.each(attackers)('H1 (high): $name filling the cluster’s lock table', ({ connect }) => {
  it("does not lock the gateway's login out, nor stop notify-settings", async () => {
    const [a, b] = replicas as [Replica, Replica];
    const c = await connect();
    let ended = false;
    try {
      const report = await fillLockTable(c);
      const fresh = await within(
        connectGateway().then(
          async (g) => {
            await g.query('SELECT 1');
            return 'connected';
          },
          (err: Error) => `refused: ${err.message}`,
        ),
        5000,
      );
      const value = 300 + Math.floor(Math.random() * 200);
      const res = await postWithin(
        a,
        '/api/notify-settings',
        { device_id: DEVICE, settings: { reporting_interval_s: value } },
        8000,
      );
      console.log(
        `H1: ${report.join('; ')}; a new connection of the gateway's login: ${fresh}; ` +
          `notify-settings on a running replica: ${res.status} after ${res.ms} ms`,
      );
      // c7535b2: "nextval on invented oids: 24000 locks, then out of shared memory"; the new connection is
      // "refused: out of shared memory" (a superuser's too); notify-settings 503 (the publish cannot take its
      // transaction id's lock).
      expect(fresh).toBe('connected');
      expect(res.status).toBe(200);
      await c.end();
      ended = true;
      await until(async () => (await servedBy(b)).reporting_interval_s === value, 'B to serve the override');
    } finally {
      if (!ended) await c.end().catch(() => undefined);
      // The lock table is free again once the attacker's session is gone; both replicas recover by themselves.
      await Promise.all(replicas.map((r) => r.waitReady(20_000)));
    }
  });
});

describe('H2 (medium): what the gateway’s login reports for a device is bounded like the bus', () => {
  const device = 'acme-wh-door-01';
  const FAR = '9007199254740991';
  async function report(
    g: pg.Client,
    version: string,
    localVersion: string | null,
    outcome: 'applied' | 'rejected',
  ): Promise<string> {
    return g
      .query<{ result: string }>(
        `SELECT result FROM device_gateway.device_reports_batch($1, ARRAY[$2]::text[], ARRAY[$3]::bigint[],
           ARRAY[$4]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::jsonb[], ARRAY['plain'], ARRAY[$5]::bigint[],
           ARRAY['0123456789abcdef'], 1000)`,
        ['0123456789abcdef', device, version, outcome, localVersion],
      )
      .then(
        (r) => r.rows[0]?.result ?? 'no row',
        (err: Error) => `refused: ${err.message}`,
      );
  }
  async function clearReported(): Promise<void> {
    await sql`UPDATE device_gateway.device_delivery SET reported_version = NULL, reported_content = NULL,
      reported_outcome = NULL, reported_reason = NULL, reported_settings = NULL, reported_at = NULL,
      reported_by = NULL, reported_transport = NULL WHERE device_id = ${device}`.execute(owner);
  }

  it('a report at 2^53 - 1 (p_lv says the replica issued it) does not stop the device’s later reports', async () => {
    const g = await connectGateway();
    try {
      const poisoned = await report(g, FAR, FAR, 'rejected');
      const now = String(Date.now() * 1000);
      const inStep = await report(g, now, now, 'applied');
      const { rows } = await sql<{ v: string | null; outcome: string | null }>`
        SELECT reported_version::text AS v, reported_outcome AS outcome FROM device_gateway.device_delivery
        WHERE device_id = ${device}`.execute(owner);
      console.log(
        `H2a: report at 2^53-1: ${poisoned}; then an in-step report: ${inStep}; record: ${JSON.stringify(rows[0])}`,
      );
      // c7535b2: recorded; then `older`; the record keeps 9007199254740991 / rejected.
      expect(inStep).toBe('recorded');
      expect(Number(rows[0]!.v)).toBeLessThanOrEqual(Date.now() * 1000 + 60_000_000);
    } finally {
      await clearReported();
    }
  });

  it('nor does a report at a desired version the login dated a day ahead (no p_lv needed)', async () => {
    const g = await connectGateway();
    const ahead = String((Date.now() + 23 * 3600_000) * 1000);
    try {
      const written = await g
        .query<{ n: number }>(
          `SELECT device_gateway.delivery_record_arrays($1, ARRAY[$2]::text[], ARRAY[$3]::bigint[],
             ARRAY['registry'], ARRAY['0123456789abcdef'], ARRAY[$4]::float8[], ARRAY[NULL]::bigint[],
             ARRAY[NULL]::text[], ARRAY[NULL]::float8[], ARRAY[NULL]::text[], ARRAY[NULL]::boolean[],
             ARRAY[NULL]::bigint[], ARRAY[NULL]::text[], ARRAY[NULL]::float8[], ARRAY[NULL]::text[],
             ARRAY[NULL]::float8[], ARRAY[NULL]::integer[]) AS n`,
          ['0123456789abcdef', device, ahead, Date.now()],
        )
        .then(
          (r) => `written ${r.rows[0]!.n}`,
          (err: Error) => `refused: ${err.message}`,
        );
      const poisoned = await report(g, ahead, null, 'rejected');
      const now = String(Date.now() * 1000);
      const inStep = await report(g, now, now, 'applied');
      console.log(
        `H2b: desired version 23 h ahead: ${written}; a report at it: ${poisoned}; then an in-step report: ${inStep}`,
      );
      // c7535b2: written 1; recorded; then `older` (for 23 hours).
      expect(inStep).toBe('recorded');
    } finally {
      await clearReported();
    }
  });
});

describe('H3 (low-medium): a rollout’s settings are bounded like an override’s', () => {
  it('the login cannot create a rollout whose settings, or a target’s, are 60 KiB', async () => {
    const g = await connectGateway();
    const big: Record<string, string> = {};
    for (let i = 0; i < 38; i++) big[`k${i}`] = 'x'.repeat(1600);
    const created: string[] = [];
    const outcome = (r: { rows: { r: Record<string, unknown> }[] }): string => {
      const v = r.rows[0]!.r;
      if (typeof v.rollout_id === 'string') created.push(v.rollout_id);
      return JSON.stringify(v);
    };
    try {
      const whole = await g
        .query<{ r: Record<string, unknown> }>(
          `SELECT device_gateway.rollout_create($1::jsonb, $2::jsonb, '0123456789abcdef', $3::jsonb, 100) AS r`,
          [JSON.stringify({ device_ids: ['acme-wh-freezer-02'] }), JSON.stringify(big), JSON.stringify(PLAN)],
        )
        .then(outcome, (err: Error) => `refused: ${err.message}`);
      const patchDevice = 'borealis-tower-lift-02';
      const { rows: base } = await sql<{ md5: string }>`
        SELECT md5(coalesce(a.settings, r.desired_settings)::text) AS md5 FROM device_gateway.device_registry r
        LEFT JOIN device_gateway.rollout_assignments a ON a.device_id = r.device_id AND a.settings IS NOT NULL
        WHERE r.device_id = ${patchDevice}`.execute(owner);
      const patch = await g
        .query<{ r: Record<string, unknown> }>(
          `SELECT device_gateway.rollout_create_patch($1::jsonb, '{}'::jsonb, $2::jsonb, 100, ARRAY[$3]::text[],
             ARRAY[0], $4::jsonb) AS r`,
          [
            JSON.stringify({ device_ids: [patchDevice] }),
            JSON.stringify(PLAN),
            patchDevice,
            JSON.stringify([{ settings: big, content: '0123456789abcdef', base_md5: base[0]!.md5 }]),
          ],
        )
        .then(outcome, (err: Error) => `refused: ${err.message}`);
      let assigned = 0;
      if (created.length > 0) {
        // The driver (one of the replicas) assigns the first wave: the 60 KiB go into rollout_assignments.
        await until(
          async () => {
            const { rows } = await sql<{ n: number | null }>`
              SELECT max(octet_length(settings::text)) AS n FROM device_gateway.rollout_assignments
              WHERE device_id IN ('acme-wh-freezer-02', ${patchDevice})`.execute(owner);
            assigned = rows[0]?.n ?? 0;
            return assigned > 4096;
          },
          'the driver to assign',
          10_000,
        ).catch(() => undefined);
      }
      console.log(`H3: whole ${whole}; patch ${patch}; largest assignment written: ${assigned} bytes`);
      // c7535b2: both created ({"waves": 1, "targets": 1, ...}); the driver writes 61,209-byte assignments.
      expect(whole).toMatch(/^refused/);
      expect(patch).toMatch(/^refused/);
    } finally {
      for (const id of created)
        await g
          .query(`SELECT device_gateway.rollout_control($1::uuid, 'rollback')`, [id])
          .catch(() => undefined);
    }
  });
});

describe('H4 (low): cleared overrides are kept for registry devices only', () => {
  it('the login cannot fill bus_overrides with tombstones of devices that do not exist', async () => {
    const g = await connectGateway();
    try {
      const outcome = await g
        .query(
          `SELECT count(device_gateway.bus_clear_override('review39e-ghost-' || i, $1, 'eeeeeeeeeeeeeeee'))
           FROM generate_series(1, 500) i`,
          [String(Date.now() * 1000)],
        )
        .then(
          () => 'accepted',
          (err: Error) => `refused: ${err.message}`,
        );
      const { rows } = await sql<{ n: string }>`
        SELECT count(*)::text AS n FROM device_gateway.bus_overrides
        WHERE device_id LIKE 'review39e-ghost-%'`.execute(owner);
      console.log(
        `H4: 500 clears of devices not in the registry: ${outcome}; tombstones kept: ${rows[0]!.n}`,
      );
      // c7535b2: accepted; 500 kept (and every replica reads them at each resync).
      expect(rows[0]!.n).toBe('0');
    } finally {
      await sql`DELETE FROM device_gateway.bus_overrides WHERE device_id LIKE 'review39e-ghost-%'`.execute(
        owner,
      );
    }
  });
});

describe('attacks that held', () => {
  it.each(attackers)(
    '$name: the sequence-function lock on every relation the bus and the driver write blocks nothing, and draws no number',
    async ({ connect }) => {
      const [a, b] = replicas as [Replica, Replica];
      const c = await connect();
      const relations = ['bus_turn', 'bus_overrides', 'bus_reload', 'bus_seq', 'rollout_driver', 'rollouts'];
      const relations2 = [
        'rollout_targets',
        'rollout_assignments',
        'rollout_assignment_seq',
        'device_delivery',
      ];
      const { rows: oids } = await c.query<{ relname: string; oid: number }>(
        `SELECT c.relname, c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'device_gateway' AND c.relname = ANY ($1)`,
        [[...relations, ...relations2]],
      );
      expect(oids).toHaveLength(relations.length + relations2.length);
      const { rows: before } = await sql<{ v: string }>`
        SELECT last_value::text AS v FROM device_gateway.bus_seq`.execute(owner);
      await c.query('BEGIN');
      const errors: string[] = [];
      for (const { oid } of oids) {
        await c.query('SAVEPOINT s');
        await c.query(`SELECT pg_catalog.nextval(${oid}::oid::regclass)`).catch((err: Error) => {
          errors.push(err.message);
        });
        await c.query('ROLLBACK TO SAVEPOINT s');
      }
      const { rows: after } = await sql<{ v: string }>`
        SELECT last_value::text AS v FROM device_gateway.bus_seq`.execute(owner);
      // Refused every time (not a sequence, or no right on it), and bus_seq did not move.
      expect(errors).toHaveLength(oids.length);
      expect(after[0]!.v).toBe(before[0]!.v);
      let rolloutId: string | undefined;
      try {
        const value = 500 + Math.floor(Math.random() * 200);
        const res = await postWithin(
          a,
          '/api/notify-settings',
          { device_id: DEVICE, settings: { reporting_interval_s: value } },
          8000,
        );
        expect(res.status).toBe(200);
        await until(
          async () => (await servedBy(b)).reporting_interval_s === value,
          'B to serve the override',
        );
        const created = await postWithin(
          a,
          '/api/rollouts',
          {
            selector: { device_ids: ['acme-hq-lobby-sensor-03'] },
            settings: { reporting_interval_s: 91 },
            plan: { first_wave_percent: 100, success_share: 0, abort_share: 1, deadline_s: 30 },
          },
          8000,
        );
        expect(created.status).toBe(201);
        rolloutId = created.body.rollout_id as string;
        const back = await postWithin(a, `/api/rollouts/${rolloutId}/rollback`, {}, 8000);
        expect(back.status).toBe(200);
        rolloutId = undefined;
      } finally {
        await c.query('ROLLBACK').catch(() => undefined);
        if (rolloutId !== undefined) await a.post(`/api/rollouts/${rolloutId}/rollback`, {});
      }
    },
  );

  it("an attacker reads no statement, address or state of the gateway's sessions in pg_stat_activity", async () => {
    for (const { connect } of attackers) {
      const c = await connect();
      const { rows } = await c.query<{ n: number; shown: number; names: string[] }>(
        `SELECT count(*)::int AS n,
                count(*) FILTER (WHERE query IS DISTINCT FROM '<insufficient privilege>' OR client_addr IS NOT NULL
                                 OR state IS NOT NULL OR xact_start IS NOT NULL)::int AS shown,
                array_agg(DISTINCT split_part(application_name, ' ', 1)) AS names
         FROM pg_catalog.pg_stat_activity WHERE usename = 'device_gateway_login'`,
      );
      // The replicas' sessions are visible by name (device-gateway-bus <replica id>), nothing more.
      expect(rows[0]!.n).toBeGreaterThan(0);
      expect(rows[0]!.shown).toBe(0);
      await c.end();
    }
  });
});
