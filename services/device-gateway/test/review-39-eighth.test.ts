// Eighth cold review of issue 39 §1: the replica bus and the platform database's roles, attacked by (1) a login with
// CONNECT on the platform's database and nothing else, (2) the workflow's login, (3) PostgREST's authenticator, (4) a
// login with no grant (it reaches `postgres`), and, for bounds, (5) the gateway's own login. A private PostgreSQL 18
// with the whole platform's migrations (no replica is needed: every hole here is in the database's roles and in the
// migration run). Each "H" test fails against 08324b8 and passes once the hole is closed; the attacks that held are
// at the end.
//
// - H1 (low-medium; the gateway's own login). The seventh review's H2 fix sets the login's password at every run
//   of the gateway's migrations (`everyRun`), so a re-run of the Job repairs a password the login changed itself.
//   That step runs in a transaction of its own, after the set's migrations, on the Job's connection, where
//   `lock_timeout` is 0 (pinned by PINNED_SESSION_OPTIONS; the 2 s bound of migration-lock.ts is transaction-local
//   and covers only the migrations' transaction) and the Job's pool sets no statement timeout
//   (deploy/src/platform-database.ts). `ALTER ROLE` updates the role's row of pg_authid, and a second update of
//   the same row waits for the first one's transaction. So the login changes its password (committed: every replica
//   that connects afterwards is refused) and then, in another session, runs `BEGIN; ALTER ROLE
//   device_gateway_login PASSWORD '...'` and leaves that transaction open: the Job's repair waits for it without
//   bound (pg_stat_activity: wait_event transactionid), the Job never completes (operations §9 waits 15 min and
//   calls the release failed), and the password stays the attacker's. The "a migration's statement waits at most
//   2 s for a lock" rule does not hold for this step. Fix: run the step with a bounded lock wait (`SET LOCAL
//   lock_timeout = '2s'` in LOGIN_PASSWORD_EVERY_RUN's transaction, also a statement_timeout), and since only the
//   login itself (or the owner) can hold that row, end what blocks it before retrying: on 55P03 the owner runs
//   `SELECT pg_terminate_backend(b) FROM unnest(pg_blocking_pids(<the step's pid>)) b` restricted to sessions whose
//   usename is device_gateway_login (or terminate every session of the login that is `idle in transaction` before
//   the ALTER), then retries; and say so in operations §3.
// - H2 (medium; the workflow's login and PostgREST's authenticator). Operations §3 ("Database passwords") says a
//   rotation is: set the new value in `platform-db-logins`, "re-run the migration Job (with explicit passwords every
//   run sets them)", and the seventh review's report repeated it ("the enterprise logins' passwords are set at every
//   run: enterprise 0002"). They are not: the ALTER ROLE ... PASSWORD branch is inside migration 0002, which runs
//   once per database; a later run applies nothing of the enterprise set and sets no password (there is no
//   `everyRun` for it). Consequences: (a) a rotation does not rotate: the old password (the one that leaked, if
//   that is why it is rotated) keeps working, and the services given the new one are refused; (b) either login may
//   change its own password (`ALTER ROLE CURRENT_USER PASSWORD ...`, no privilege needed: the seventh review's H2
//   for these logins) and the documented repair, a re-run, does not repair it: PostgREST, or the workflow, stays
//   locked out of the database. Fix: an `everyRun` for the enterprise set that runs 0002's ALTER ROLE branch (with
//   the bounded wait and the blocker handling of H1, since either login can hold its own row the same way), when
//   the passwords are explicit (as the deploy's Job passes them).
// - H3 (low; the gateway's own login, or any failure of the step). LOGIN_PASSWORD_EVERY_RUN builds the statement
//   with format('ALTER ROLE ... PASSWORD %L', <the password>) and EXECUTEs it, so when it fails its CONTEXT is
//   `SQL statement "ALTER ROLE device_gateway_login PASSWORD '<the password in clear>'"`: in the error the Job gets
//   (the `where` field of MigrationError's cause) and in the server's log, which writes CONTEXT with every ERROR at
//   the default log_error_verbosity (PostgreSQL manual, "Error Reporting and Logging"; read, not taken from the log
//   here). The login makes it fail at will with H1's hold released with COMMIT each time the step waits ("tuple
//   concurrently updated", retried 5 times, then raised); two Jobs at once do it without an attacker (the
//   migration's own comment). Whoever reads the database's logs (a log pipeline, support staff) then reads the
//   login's password, also the new one of a rotation. Enterprise 0002 and gateway 0001 build their CREATE/ALTER ROLE
//   the same way. Fix: never put the clear password in a statement: compute the SCRAM-SHA-256 verifier in the Job
//   (RFC 7677 / PostgreSQL's `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` form, e.g. with
//   node:crypto pbkdf2 + HMAC-SHA-256) and pass that to `PASSWORD %L`; PostgreSQL stores a verifier given as such
//   unchanged, so a log shows only the verifier. Failing that, catch the error in the DO block and RAISE a message
//   of its own (without the statement in its context).
// - Not tests (reported): the same open `ALTER ROLE <itself> PASSWORD` makes a concurrent `ALTER ROLE` of that
//   role by the owner wait, which is H1's whole mechanism; a login cannot hold another role's row (checked below).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import {
  API_LOGIN,
  AUTHENTICATOR,
  PORTAL_ROLE,
  devRolePasswords,
  enterpriseMigrationsWith,
} from '@platform/enterprise-db';
import { migrateToLatest } from '@platform/service-kit';
import { sql } from 'kysely';
import type pg from 'pg';
import { DEV_GATEWAY_LOGIN_PASSWORD, gatewayMigrations } from '../src/db/migrations.js';
import {
  NOBODY_PASSWORD,
  startPlatformDatabase,
  type PlatformDatabase,
} from './support/platform-database.js';
import {
  attackersOf,
  connectGatewayLogin,
  jobRun,
  loginOutcome,
  migrationJobDb,
  withinOr,
} from './support/attack.js';

jest.setTimeout(300_000);

let platform: PlatformDatabase;
beforeAll(async () => {
  platform = await startPlatformDatabase({ stranger: true, nobody: true });
});
afterAll(async () => {
  await (platform as PlatformDatabase | undefined)?.close();
});
const attackers = attackersOf(() => platform);

const sleep = (ms: number): Promise<void> => new Promise((res) => setTimeout(res, ms));

describe('H1 (low-medium): the gateway’s login keeps the Job from repairing its password', () => {
  it('a re-run of the migrations sets the configured password while the login holds its own role row', async () => {
    const chosen = 'chosen-by-the-holder';
    const g = await connectGatewayLogin(platform);
    await g.query(`ALTER ROLE device_gateway_login PASSWORD '${chosen}'`);
    await g.end();
    const hold = await platform.connectAs('device_gateway_login', chosen);
    // A fix may end this session (the Job ending what blocks it): not an error here.
    hold.on('error', () => undefined);
    const db = migrationJobDb(platform);
    let released = false;
    try {
      await hold.query('BEGIN');
      await hold.query(`ALTER ROLE device_gateway_login PASSWORD '${chosen}'`);
      const run = jobRun(db, [gatewayMigrations]);
      // Long enough for a bounded wait retried as migrate.ts retries (2 s, then 2, 4, 8 s between tries).
      const outcome = await withinOr(run, 30_000, 'still waiting after 30 s');
      const { rows } = await sql<{ w: string }>`
        SELECT coalesce(string_agg(state || '/' || coalesce(wait_event_type, '-') || '/' || coalesce(wait_event, '-')
                                   || ': ' || left(query, 60), '; '), 'none') AS w
        FROM pg_catalog.pg_stat_activity WHERE application_name = 'platform-migrate'`.execute(platform.owner);
      const during = await loginOutcome(platform, 'device_gateway_login', DEV_GATEWAY_LOGIN_PASSWORD);
      console.log(
        `H1: the Job's run ${outcome}; the Job's session: ${rows[0]!.w}; the configured password: ${during}`,
      );
      await hold.query('ROLLBACK').catch(() => undefined);
      released = true;
      await run;
      // 08324b8: still waiting after 30 s (active/Lock/transactionid: the DO block's ALTER ROLE); refused.
      expect(outcome).toMatch(/^finished/);
      expect(during).toBe('in');
    } finally {
      if (!released) await hold.query('ROLLBACK').catch(() => undefined);
      await hold.end().catch(() => undefined);
      await db.destroy();
      await sql
        .raw(`ALTER ROLE device_gateway_login PASSWORD '${DEV_GATEWAY_LOGIN_PASSWORD}'`)
        .execute(platform.owner);
    }
  });
});

describe('H2 (medium): the enterprise logins’ passwords are not set by a re-run of the migrations', () => {
  const logins: [string, string][] = [
    [AUTHENTICATOR, devRolePasswords.authenticator],
    [API_LOGIN, devRolePasswords.enterpriseApi],
  ];
  const restore = async (): Promise<void> => {
    for (const [login, password] of logins)
      await sql.raw(`ALTER ROLE ${login} PASSWORD '${password}'`).execute(platform.owner);
  };

  it('a login that changed its own password is repaired by a re-run with explicit passwords (operations §3)', async () => {
    const changed: string[] = [];
    for (const [login, password] of logins) {
      const c = await platform.connectAs(login, password);
      changed.push(
        await c.query(`ALTER ROLE CURRENT_USER PASSWORD 'chosen-by-the-holder'`).then(
          () => `${login}: changed its own`,
          (err: Error) => `${login}: refused (${err.message})`,
        ),
      );
      await c.end();
    }
    try {
      await migrateToLatest(platform.owner, [
        enterpriseMigrationsWith({ ...devRolePasswords, explicit: true }),
        gatewayMigrations,
      ]);
      const after = await Promise.all(
        logins.map(async ([l, pw]) => `${l}: ${await loginOutcome(platform, l, pw)}`),
      );
      console.log(`H2 repair: ${changed.join('; ')}; after a re-run: ${after.join('; ')}`);
      // 08324b8: both changed their own; after the re-run both refused (password authentication failed).
      for (const line of after) expect(line).toMatch(/: in$/);
    } finally {
      await restore();
    }
  });

  it('a rotation (new passwords, explicit) takes effect and the old passwords stop working', async () => {
    const rotated = { authenticator: 'rotated-authenticator-1', enterpriseApi: 'rotated-enterprise-api-1' };
    try {
      await migrateToLatest(platform.owner, [
        enterpriseMigrationsWith({ ...rotated, explicit: true }),
        gatewayMigrations,
      ]);
      const withNew = [
        `${AUTHENTICATOR}: ${await loginOutcome(platform, AUTHENTICATOR, rotated.authenticator)}`,
        `${API_LOGIN}: ${await loginOutcome(platform, API_LOGIN, rotated.enterpriseApi)}`,
      ];
      const withOld = await Promise.all(
        logins.map(async ([l, pw]) => `${l}: ${await loginOutcome(platform, l, pw)}`),
      );
      console.log(`H2 rotation: new passwords ${withNew.join('; ')}; old passwords ${withOld.join('; ')}`);
      // 08324b8: the new ones refused, the old ones (the leaked ones) still let in.
      for (const line of withNew) expect(line).toMatch(/: in$/);
      for (const line of withOld) expect(line).toMatch(/refused/);
    } finally {
      await restore();
    }
  });
});

describe('H3 (low): the login’s configured password in the Job’s error and the server log', () => {
  it('a password step that fails does not carry the password in its error (CONTEXT), which PostgreSQL also logs', async () => {
    // The login holds its own row and lets go (COMMIT, same password: nothing changes for the replicas) each time
    // the Job's step waits on it: the step's ALTER ROLE then fails "tuple concurrently updated" (XX000), which
    // LOGIN_PASSWORD_EVERY_RUN retries 5 times and then raises.
    const hold = await connectGatewayLogin(platform);
    hold.on('error', () => undefined);
    const db = migrationJobDb(platform);
    try {
      const holdRow = async (): Promise<void> => {
        await hold.query('BEGIN');
        await hold.query(`ALTER ROLE device_gateway_login PASSWORD '${DEV_GATEWAY_LOGIN_PASSWORD}'`);
      };
      await holdRow();
      let settled = false;
      const run = migrateToLatest(db, [gatewayMigrations]).then(
        () => undefined,
        (err: unknown) => err,
      );
      void run.then(() => (settled = true));
      let rounds = 0;
      while (!settled && rounds < 8) {
        const deadline = Date.now() + 10_000;
        while (!settled && Date.now() < deadline) {
          const { rows } = await sql<{ n: number }>`
            SELECT count(*)::int AS n FROM pg_catalog.pg_stat_activity
            WHERE application_name = 'platform-migrate' AND wait_event = 'transactionid'`.execute(
            platform.owner,
          );
          if (rows[0]!.n > 0) break;
          await sleep(10);
        }
        // A fix may end this session (the Job ending what blocks it): the attack is then over.
        const gone = await hold.query('COMMIT').then(
          () => false,
          () => true,
        );
        rounds++;
        await sleep(5);
        if (
          gone ||
          (!settled &&
            !(await holdRow().then(
              () => true,
              () => false,
            )))
        )
          break;
      }
      await hold.query('ROLLBACK').catch(() => undefined);
      const err = await run;
      const cause = (err as { cause?: { where?: string; message?: string } } | undefined)?.cause;
      const shown = `${String((err as Error | undefined)?.message)} | where: ${String(cause?.where)}`;
      console.log(
        `H3: after ${rounds} rounds the Job's run ${err === undefined ? 'finished' : `failed: ${shown}`}`,
      );
      // 08324b8: failed: ... tuple concurrently updated | where: SQL statement "ALTER ROLE device_gateway_login
      // PASSWORD 'device-gateway-dev'" PL/pgSQL function inline_code_block line 5 at EXECUTE
      expect(shown).not.toContain(DEV_GATEWAY_LOGIN_PASSWORD);
    } finally {
      await hold.query('ROLLBACK').catch(() => undefined);
      await hold.end().catch(() => undefined);
      await db.destroy();
    }
  });
});

describe('attacks that held', () => {
  it('no attacker can hold (or change) another role’s row: ALTER ROLE of the gateway’s login and of the enterprise logins is refused', async () => {
    const outcomes: string[] = [];
    const sessions: [string, () => Promise<pg.Client>][] = [
      ...attackers.map((x): [string, () => Promise<pg.Client>] => [x.name, x.connect]),
      [
        'PostgREST’s authenticator as the portal role',
        async () => {
          const c = await platform.connectAs(AUTHENTICATOR, devRolePasswords.authenticator);
          await c.query(`SET ROLE ${PORTAL_ROLE}`);
          return c;
        },
      ],
      ['the gateway’s login', () => connectGatewayLogin(platform)],
    ];
    for (const [name, connect] of sessions) {
      const c = await connect();
      try {
        for (const target of ['device_gateway_login', AUTHENTICATOR, API_LOGIN]) {
          const self = (await c.query<{ u: string }>('SELECT session_user AS u')).rows[0]!.u === target;
          if (self) continue;
          await c.query('BEGIN');
          outcomes.push(
            `${name} -> ${target}: ${await c.query(`ALTER ROLE ${target} PASSWORD 'x'`).then(
              () => 'done',
              (err: Error) => `refused (${(err as { code?: string }).code})`,
            )}`,
          );
          await c.query('ROLLBACK');
        }
      } finally {
        await c.end();
      }
    }
    console.log(`held (other roles' rows): ${outcomes.join('; ')}`);
    for (const o of outcomes) expect(o).toMatch(/refused/);
  });

  it('PostgreSQL 18’s new pg_get_sequence_data(regclass), EXECUTE for PUBLIC, leaves no lock (the fourth review’s nextval class)', async () => {
    const { rows } = await sql<{ o: number }>`
      SELECT 'device_gateway.bus_turn'::regclass::oid::int AS o`.execute(platform.owner);
    const gatewayTable = rows[0]!.o;
    for (const { name, connect } of attackers) {
      const c = await connect();
      try {
        await c.query('BEGIN');
        // An invented oid per call (the lock-table filler) and the bus's turn table (a lock the gateway waits for).
        await c.query(`DO $$ BEGIN
          FOR i IN 1000000..1002000 LOOP
            BEGIN PERFORM pg_catalog.pg_get_sequence_data(i::oid::regclass); EXCEPTION WHEN OTHERS THEN NULL; END;
          END LOOP; END $$`);
        await c.query('SAVEPOINT s');
        const onTable = await c
          .query(`SELECT pg_catalog.pg_get_sequence_data(${gatewayTable}::oid::regclass)::text AS d`)
          .then(
            (r) => `answered ${String((r.rows[0] as { d: string }).d)}`,
            (err: Error) => `refused: ${err.message}`,
          );
        await c.query('ROLLBACK TO s');
        const { rows: held } = await c.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_catalog.pg_locks
           WHERE pid = pg_catalog.pg_backend_pid() AND locktype = 'relation' AND mode <> 'AccessShareLock'`,
        );
        const { rows: onGateway } = await sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_catalog.pg_locks WHERE relation = ${gatewayTable}::oid`.execute(
          platform.owner,
        );
        console.log(`held (${name}): pg_get_sequence_data on bus_turn ${onTable}; locks kept ${held[0]!.n}`);
        expect(held[0]!.n).toBe(0);
        expect(onGateway[0]!.n).toBe(0);
      } finally {
        await c.query('ROLLBACK').catch(() => undefined);
        await c.end();
      }
    }
  });

  it('PostgreSQL 18’s statistics functions (pg_restore_*_stats, pg_clear_*_stats, EXECUTE for PUBLIC) lock nothing of the gateway’s or the platform’s sites', async () => {
    const calls = [
      `SELECT pg_catalog.pg_clear_relation_stats('device_gateway', 'bus_overrides')`,
      `SELECT pg_catalog.pg_restore_relation_stats('schemaname', 'device_gateway', 'relname', 'bus_turn',
         'relpages', 1::integer)`,
      `SELECT pg_catalog.pg_clear_attribute_stats('device_gateway', 'device_delivery', 'device_id', false)`,
      `SELECT pg_catalog.pg_clear_relation_stats('enterprise', 'sites')`,
      `SELECT pg_catalog.pg_clear_relation_stats('pg_catalog', 'pg_class')`,
    ];
    const outcomes: string[] = [];
    for (const { name, connect } of [
      ...attackers,
      { name: 'the gateway’s login', connect: () => connectGatewayLogin(platform) },
    ]) {
      const c = await connect();
      try {
        await c.query('BEGIN');
        for (const call of calls) {
          await c.query('SAVEPOINT s');
          outcomes.push(
            `${name}: ${call.slice(25, 70)}: ${await c.query(call).then(
              () => 'done',
              (err: Error) => `refused (${(err as { code?: string }).code})`,
            )}`,
          );
          await c.query('ROLLBACK TO s');
        }
        const { rows } = await c.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_catalog.pg_locks
           WHERE pid = pg_catalog.pg_backend_pid() AND locktype = 'relation' AND mode <> 'AccessShareLock'`,
        );
        expect([name, rows[0]!.n]).toEqual([name, 0]);
      } finally {
        await c.query('ROLLBACK').catch(() => undefined);
        await c.end();
      }
    }
    console.log(`held (statistics functions): ${outcomes.join('; ')}`);
    for (const o of outcomes) expect(o).toMatch(/refused/);
  });

  it('a login with no grant, from `postgres`, locking the gateway’s login or the platform’s database as objects does not stall the password step', async () => {
    const nobody = await platform.connectAs(platform.nobody, NOBODY_PASSWORD, platform.server.url);
    const db = migrationJobDb(platform);
    try {
      await nobody.query('BEGIN');
      const locked: string[] = [];
      for (const [type, name] of [
        ['role', 'device_gateway_login'],
        ['database', platform.database.name],
      ] as const)
        locked.push(
          await nobody
            .query(`SELECT pg_catalog.pg_get_object_address($1, ARRAY[$2], '{}')::text AS a`, [type, name])
            .then(
              () => `${type} locked`,
              (err: Error) => `${type}: ${err.message}`,
            ),
        );
      const run = jobRun(db, [gatewayMigrations]);
      const outcome = await withinOr(run, 20_000, 'still waiting after 20 s');
      await nobody.query('ROLLBACK');
      await run;
      console.log(`held (object locks from postgres): ${locked.join(', ')}; the Job's run ${outcome}`);
      expect(outcome).toMatch(/^finished/);
    } finally {
      await nobody.query('ROLLBACK').catch(() => undefined);
      await db.destroy();
    }
  });
});
