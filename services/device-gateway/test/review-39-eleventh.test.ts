// Eleventh cold review of issue 39 §1: the replica bus and the platform database's roles, attacked by (1) a login
// with CONNECT on the platform's database and nothing else, (2) the workflow's login, (3) PostgREST's
// authenticator, (4) a login with no grant (it reaches `postgres`), and, for bounds, (5) the gateway's own login.
// A private PostgreSQL 18 with the whole platform's migrations. Each "H" test fails against e4422ef and passes once
// the hole is closed; the attacks that held are at the end.
//
// - H1 (medium; the gateway's login, and by the same rule PostgREST's authenticator). `role` is an ordinary
//   (context `user`) setting that PostgreSQL hides from pg_settings (GUC_NO_SHOW_ALL), and a login may give it to
//   itself as a default naming any role it may SET ROLE to: `ALTER ROLE device_gateway_login SET role =
//   'pg_use_reserved_connections'` (0022 grants that membership WITH SET, the default). Every later session of the
//   login then runs as pg_use_reserved_connections (current_user), which has no right in device_gateway: every
//   statement of every replica started afterwards is "permission denied for schema device_gateway", the bus never
//   joins and the replica is never ready. service-kit's connection reset reads pg_settings (RESET_OWN_DEFAULTS_SQL),
//   where `role` is not listed; PINNED_SESSION_OPTIONS does not name it; the Job's every-run step resets only
//   local_preload_libraries, so a password rotation leaves it in place; the start-time check names it in a
//   warning, but the replica stays down. PostgREST's `authenticator` may do the same with its portal roles
//   (`SET role = 'enterprise_portal_anon'`: its sessions are refused `postgrest` itself, so pre_config() and the
//   schema cache are out of reach), and the enterprise Job (explicit passwords) leaves that too. Fix: pin `-c role=none` in PINNED_SESSION_OPTIONS (a startup option outranks a role default;
//   shown below), or `SET ROLE NONE` in the connect reset (RESET ROLE would go back to the role default); in the
//   every-run step also `ALTER ROLE <login> RESET role` and `... IN DATABASE <db> RESET role` (PostgREST's
//   connections are not ours); and grant pg_use_reserved_connections `WITH INHERIT TRUE, SET FALSE` (not checked
//   here), and name `role` in the start-time warning as fatal rather than advisory. The class:
//   the reset should not rely on pg_settings alone (`seed` is hidden too; no gateway SQL uses random()).
// - H2 (low-medium where max_prepared_transactions > 0; default 0). A login that takes its own role row in a
//   transaction and PREPAREs it (`BEGIN; ALTER ROLE CURRENT_USER PASSWORD '<its own>'; PREPARE TRANSACTION 'x'`)
//   leaves a lock no session holds: pg_blocking_pids() names pid 0 for a prepared transaction, pg_stat_activity
//   has no session with a backend_xid, so neither the side session nor the step's own tries end anything. The Job
//   fails after 5 tries (11 s) every time it runs, the password the login chose stays, and the prepared
//   transaction outlives its session and pg_terminate_backend (and, by PostgreSQL's design, a restart; not shown
//   here): only COMMIT/ROLLBACK PREPARED by its owner or a superuser ends it. Fix: from the side session, `ROLLBACK PREPARED` every
//   transaction of pg_prepared_xacts owned by one of the roles (outside a transaction block; the migrator is a
//   superuser, or the owner of nothing: then say so in the error), and the start-time check / operations §7: keep
//   `max_prepared_transactions = 0` (no platform service uses two-phase commit) and warn when it is not.
// - Held: no pg_catalog function PUBLIC may call (stranger in the platform's database, nobody in `postgres`) keeps a
//   lock stronger than ROW EXCLUSIVE (a later run saw gin_clean_pending_list keep that one on pg_authid: it conflicts
//   with nothing the platform takes there) on pg_authid, pg_db_role_setting, pg_database or the bus's relations when its
//   error aborts the *top-level* transaction (the earlier probes used savepoints, whose locks go with them). From
//   `postgres`, pg_sequence_last_value(<the bus_turn oid>) keeps RowExclusiveLock on that oid *in postgres*: the
//   fourth review's class in the other databases (operations §7), which conflicts with nothing in the platform's.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { AUTHENTICATOR, devRolePasswords, enterpriseMigrationsWith } from '@platform/enterprise-db';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import {
  preparedTransactionsGap,
  readConnectionReserve,
  roleSettingsGap,
} from '../src/db/connection-reserve.js';
import { DEV_GATEWAY_LOGIN_PASSWORD, gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import {
  NOBODY_PASSWORD,
  startPlatformDatabase,
  type PlatformDatabase,
} from './support/platform-database.js';
import { startReplica, type Replica } from './support/replicas.js';
import {
  connectGatewayLogin,
  connectStranger,
  loginOutcome,
  migrationJobDb,
  withinOr,
} from './support/attack.js';

jest.setTimeout(300_000);

const env = { LOG_LEVEL: 'warn' };

let platform: PlatformDatabase;
beforeAll(async () => {
  platform = await startPlatformDatabase({ stranger: true, nobody: true });
});
afterAll(async () => {
  await (platform as PlatformDatabase | undefined)?.close();
});

/** The login's own defaults as the owner sees them (pg_db_role_setting), or 'none'. */
async function defaultsOf(role: string): Promise<string> {
  const { rows } = await sql<{ c: string }>`
    SELECT coalesce(pg_catalog.string_agg(setconfig::text, ';'), 'none') AS c FROM pg_catalog.pg_db_role_setting
    WHERE setrole = ${role}::regrole`.execute(platform.owner);
  return rows[0]!.c;
}

describe('H1 (medium): a login gives itself `role` as a default (hidden from pg_settings)', () => {
  it('device_gateway_login: a replica started after `ALTER ROLE ... SET role = pg_use_reserved_connections` becomes ready, and the Job clears it', async () => {
    const g = await connectGatewayLogin(platform);
    const altered = await g.query(`ALTER ROLE CURRENT_USER SET role = 'pg_use_reserved_connections'`).then(
      () => 'set',
      (err: Error) => `refused: ${err.message}`,
    );
    await g.end();
    let c: Replica | undefined;
    const db = migrationJobDb(platform);
    try {
      const gateway = createDb<unknown>(gatewayLoginUrl(platform.database.url), {
        max: 1,
        logger: { warn: () => undefined },
      });
      const seen = await sql<{ u: string }>`SELECT current_user AS u`
        .execute(gateway)
        .then((r) => r.rows[0]!.u);
      const read = await sql`SELECT count(*) FROM device_gateway.device_registry`.execute(gateway).then(
        () => 'read',
        (err: Error) => `refused: ${err.message}`,
      );
      const warning = await readConnectionReserve(gateway)
        .then(roleSettingsGap, (err: Error) => `check failed: ${err.message}`)
        .finally(() => gateway.destroy());
      // The Job (a password rotation, or any re-run) is the documented repair of what a login did to itself.
      const job = await migrateToLatest(db, [gatewayMigrations]).then(
        () => 'finished',
        (err: Error) => `failed: ${err.message}`,
      );
      const left = await defaultsOf('device_gateway_login');
      c = await startReplica('C', platform.database.url, env);
      const ready = await c.waitReady().then(
        () => 'ready',
        () => 'not ready in 30 s',
      );
      const denied = c
        .logs()
        .split('\n')
        .filter((l) => /permission denied/.test(l)).length;
      console.log(
        `H1: ${altered}; a pool connection runs as ${seen} (${read}); the start check says: ${String(warning)}; ` +
          `the Job ${job}, the login's defaults after it: ${left}; a replica started then: ${ready}, ` +
          `${denied} 'permission denied' lines logged`,
      );
      // e4422ef: runs as pg_use_reserved_connections ("permission denied for schema device_gateway"); the Job
      // finishes and leaves {role=pg_use_reserved_connections}; the replica is not ready in 20 s.
      expect(seen).toBe('device_gateway_login');
      expect(read).toBe('read');
      expect(ready).toBe('ready');
      expect(left).not.toMatch(/\brole=/);
    } finally {
      await sql.raw(`ALTER ROLE device_gateway_login RESET ALL`).execute(platform.owner);
      await c?.stop();
      await db.destroy();
    }
  });

  it("authenticator (PostgREST's own connections): a re-run of the enterprise migrations (explicit passwords) clears it", async () => {
    const a = await platform.connectAs(AUTHENTICATOR, devRolePasswords.authenticator);
    const altered = await a.query(`ALTER ROLE CURRENT_USER SET role = 'enterprise_portal_anon'`).then(
      () => 'set',
      (err: Error) => `refused: ${err.message}`,
    );
    await a.end();
    try {
      const job = await migrateToLatest(platform.owner, [
        enterpriseMigrationsWith({ ...devRolePasswords, explicit: true }),
      ]).then(
        () => 'finished',
        (err: Error) => `failed: ${err.message}`,
      );
      const left = await defaultsOf(AUTHENTICATOR);
      // A libpq-like session (PostgREST's: no reset of ours) after the Job.
      const p = new pg.Client({
        connectionString: (() => {
          const u = new URL(platform.database.url);
          u.username = AUTHENTICATOR;
          u.password = devRolePasswords.authenticator;
          return u.toString();
        })(),
      });
      await p.connect();
      const config = await p.query(`SELECT current_user AS u, postgrest.pre_config()`).then(
        (r) => `pre_config answered as ${String((r.rows[0] as { u: string }).u)}`,
        (err: Error) => `refused: ${err.message}`,
      );
      await p.end();
      console.log(
        `H1 (authenticator): ${altered}; the Job ${job}, its defaults after: ${left}; PostgREST's session: ${config}`,
      );
      // e4422ef: {role=enterprise_portal_anon} stays; "permission denied for schema postgrest".
      expect(left).not.toMatch(/\brole=/);
      expect(config).toMatch(/^pre_config answered as authenticator/);
    } finally {
      await sql.raw(`ALTER ROLE ${AUTHENTICATOR} RESET ALL`).execute(platform.owner);
    }
  });

  it('(the fix’s ingredient, holds now) a startup option role=none outranks the role default', async () => {
    await sql
      .raw(`ALTER ROLE device_gateway_login SET role = 'pg_use_reserved_connections'`)
      .execute(platform.owner);
    try {
      const u = new URL(gatewayLoginUrl(platform.database.url));
      const c = new pg.Client({ connectionString: u.toString(), options: '-c role=none' });
      await c.connect();
      const { rows } = await c.query<{ u: string }>('SELECT current_user AS u');
      await c.end();
      expect(rows[0]!.u).toBe('device_gateway_login');
    } finally {
      await sql.raw(`ALTER ROLE device_gateway_login RESET ALL`).execute(platform.owner);
    }
  });
});

describe('attacks that held', () => {
  it('no PUBLIC function keeps a lock above ROW EXCLUSIVE on the role catalogs or the bus when its error aborts the transaction', async () => {
    const { rows: rels } = await sql<{ o: number; n: string }>`
      SELECT c.oid::int AS o, c.oid::regclass::text AS n FROM pg_catalog.pg_class c
      WHERE c.oid IN ('pg_authid'::regclass, 'pg_db_role_setting'::regclass, 'pg_database'::regclass,
        'pg_authid_rolname_index'::regclass, 'device_gateway.bus_turn'::regclass,
        'device_gateway.bus_turn_pkey'::regclass, 'device_gateway.bus_overrides'::regclass,
        'device_gateway.bus_seq'::regclass, 'device_gateway.device_registry'::regclass)`.execute(
      platform.owner,
    );
    expect(rels).toHaveLength(9);
    let calls = 0;
    const kept: string[] = [];
    for (const who of ['a login with CONNECT only', 'a login with no grant, in postgres']) {
      const c =
        who === 'a login with CONNECT only'
          ? await connectStranger(platform)
          : await platform.connectAs(platform.nobody, NOBODY_PASSWORD, platform.server.url);
      c.on('error', () => undefined);
      try {
        const pid = (await c.query<{ p: number }>('SELECT pg_catalog.pg_backend_pid() AS p')).rows[0]!.p;
        const { rows: fns } = await c.query<{ sig: string; name: string; types: string[] }>(`
          SELECT p.oid::regprocedure::text AS sig, p.oid::regproc::text AS name,
                 (SELECT pg_catalog.array_agg(t::regtype::text ORDER BY i)
                  FROM unnest(p.proargtypes) WITH ORDINALITY u(t, i)) AS types
          FROM pg_catalog.pg_proc p
          WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind = 'f' AND p.pronargs BETWEEN 1 AND 5
            AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE')
            AND (p.proargtypes::oid[] && ARRAY['oid'::regtype, 'regclass'::regtype]::oid[])
            AND p.proname !~ '(sleep|terminate|cancel|reload|rotate|switch|backup|promote|notify|stat_reset|replication|slot|checkpoint|read_|_ls_|emit)'`);
        for (const f of fns) {
          for (const t of rels) {
            const args = f.types.map((ty) =>
              ty === 'oid' || ty === 'regclass'
                ? `${t.o}::oid::${ty}`
                : ['bigint', 'integer', 'smallint'].includes(ty)
                  ? `1::${ty}`
                  : ty === 'boolean'
                    ? 'true'
                    : ty === 'text' || ty === 'name'
                      ? `'x'::${ty}`
                      : `NULL::${ty}`,
            );
            // No savepoint: an error aborts the transaction, which keeps every lock it took until ROLLBACK.
            await c.query('BEGIN');
            await c.query(`SET LOCAL statement_timeout = '1s'`);
            calls++;
            await c.query(`SELECT ${f.name}(${args.join(', ')})`).catch(() => undefined);
            const { rows } = await sql<{ m: string; rel: string }>`
              SELECT mode AS m, coalesce(relation::regclass::text, locktype) AS rel FROM pg_catalog.pg_locks
              -- RowExclusiveLock conflicts only with SHARE and stronger, which no statement of the platform takes
              -- on these relations but a migration's DDL (bounded, retried: the accepted class). A run here saw
              -- gin_clean_pending_list(<pg_authid>) from postgres keep one on pg_authid (a shared catalog): ALTER
              -- ROLE, logins and the bus take weaker locks or the same, so it waits for nothing of ours.
              WHERE pid = ${pid} AND mode NOT IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock')
                AND locktype NOT IN ('virtualxid', 'transactionid')
                -- A lock's tag carries its database: one taken in postgres on the same oid names another
                -- relation (or none) and conflicts with nothing here (0031's class there is operations §7's).
                AND (database = 0 OR database = (SELECT d.oid FROM pg_catalog.pg_database d
                                                 WHERE d.datname = pg_catalog.current_database()))`.execute(
              platform.owner,
            );
            await c.query('ROLLBACK').catch(() => undefined);
            if (rows.length > 0)
              kept.push(`${who}: ${f.sig} on ${t.n}: ${rows.map((x) => `${x.m} ${x.rel}`).join(', ')}`);
          }
        }
      } finally {
        await c.end();
      }
    }
    console.log(
      `held (top-level errors): ${calls} calls; locks kept: ${kept.length === 0 ? 'none' : kept.join('; ')}`,
    );
    expect(calls).toBeGreaterThan(5000);
    expect(kept).toEqual([]);
  });
});

describe('H2 (low-medium where max_prepared_transactions > 0): a prepared transaction holds the login’s role row', () => {
  let prepared: PlatformDatabase;
  beforeAll(async () => {
    prepared = await startPlatformDatabase({ gatewayOnly: true });
    const admin = new pg.Client({ connectionString: prepared.server.url });
    await admin.connect();
    await admin.query(`ALTER SYSTEM SET max_prepared_transactions = 5`);
    await admin.end();
    await prepared.server.stop();
    await prepared.server.start();
  });
  afterAll(async () => {
    await sql
      .raw(`ROLLBACK PREPARED 'keep-my-row'`)
      .execute(prepared.owner)
      .catch(() => undefined);
    await (prepared as PlatformDatabase | undefined)?.close();
  });

  it('device_gateway_login: a re-run of the migrations sets the configured password (its session long gone)', async () => {
    const chosen = 'chosen-by-the-preparer';
    const g = await connectGatewayLogin(prepared);
    await g.query(`ALTER ROLE CURRENT_USER PASSWORD '${chosen}'`);
    await g.query('BEGIN');
    await g.query(`ALTER ROLE CURRENT_USER PASSWORD '${chosen}'`);
    const prep = await g.query(`PREPARE TRANSACTION 'keep-my-row'`).then(
      () => 'prepared',
      (err: Error) => `refused: ${err.message}`,
    );
    await g.end();
    const { rows: sessions } = await sql<{ n: number }>`
      SELECT pg_catalog.count(*)::int AS n FROM pg_catalog.pg_stat_activity
      WHERE usename = 'device_gateway_login'`.execute(prepared.owner);
    const db = createDb<unknown>(prepared.database.url, {
      applicationName: 'platform-migrate',
      max: 1,
      logger: { warn: () => undefined },
    });
    try {
      const t0 = Date.now();
      const run = migrateToLatest(db, [gatewayMigrations]).then(
        () => `finished in ${Date.now() - t0} ms`,
        (err: Error) => `failed in ${Date.now() - t0} ms: ${err.message}`,
      );
      const outcome = await withinOr(run, 60_000, 'still waiting after 60 s');
      const configured = await loginOutcome(prepared, 'device_gateway_login', DEV_GATEWAY_LOGIN_PASSWORD);
      const attackers = await loginOutcome(prepared, 'device_gateway_login', chosen);
      const { rows: xacts } = await sql<{ n: number }>`
        SELECT pg_catalog.count(*)::int AS n FROM pg_catalog.pg_prepared_xacts`.execute(prepared.owner);
      console.log(
        `H2: ${prep} (sessions of the login left: ${sessions[0]!.n}); the Job's run ${outcome}; ` +
          `configured password: ${configured}; the login's own: ${attackers}; prepared transactions: ${xacts[0]!.n}`,
      );
      // The gateway's start names the setting (operations §7: keep it 0).
      expect(preparedTransactionsGap(await readConnectionReserve(prepared.owner as Kysely<unknown>))).toMatch(
        /^max_prepared_transactions is 5:/,
      );
      // e4422ef: failed in 11.2 s ("the password of role device_gateway_login could not be set (55P03)");
      // the configured password refused, the login's own in; the prepared transaction still there.
      expect(outcome).toMatch(/^finished/);
      expect(configured).toBe('in');
    } finally {
      await sql
        .raw(`ROLLBACK PREPARED 'keep-my-row'`)
        .execute(prepared.owner)
        .catch(() => undefined);
      await db.destroy();
      await sql
        .raw(`ALTER ROLE device_gateway_login PASSWORD '${DEV_GATEWAY_LOGIN_PASSWORD}'`)
        .execute(prepared.owner);
    }
  });
});
