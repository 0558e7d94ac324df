// Seventh cold review of issue 39 §1: the replica bus and the platform database's roles, attacked by (1) a login with
// CONNECT on the platform's database and nothing else, (2) the workflow's login, (3) PostgREST's authenticator (as
// the anonymous role and, new here, as the signed-in portal role it may also become), (4) a login with no grant,
// and, for bounds, (5) the gateway's own login. Real replicas (dist/main.js) on a private PostgreSQL 18 with the
// whole platform's migrations. Each "H" test fails against 92eee63 and passes once the hole is closed; the attacks
// that held are at the end.
//
// - H1 (low-medium; the gateway's own login). The sixth review's H3 was closed by pinning some settings in the
//   connections' startup options, but a role may give itself a default for any USERSET setting, and the pinned
//   list (service-kit PINNED_SESSION_OPTIONS) leaves out the session killers: `ALTER ROLE device_gateway_login
//   [IN DATABASE ...] SET idle_session_timeout = '300ms'` (or `transaction_timeout`, PostgreSQL 17+, or
//   `idle_in_transaction_session_timeout`). Every later connection of every replica inherits it; the server ends
//   the replica bus's listening connection, which idles between heartbeats (5 s), a fraction of a second after
//   each (re)connect, and every idle pool connection as well. The start-time check names the default
//   (roleSettingsGap), but a replica started afterwards never keeps its bus. Fix: pin them too
//   (`-c idle_session_timeout=0 -c idle_in_transaction_session_timeout=0 -c transaction_timeout=0`), or, closing
//   the class rather than its members, reset on every new connection whatever the login gave itself:
//   `SELECT pg_catalog.set_config(name, boot_val, false) FROM pg_catalog.pg_settings
//    WHERE source IN ('user', 'database user') AND context = 'user'` (pg-pool's `connect` hook and the listener's
//   connect, before LISTEN); `RESET` does not help (it returns to the role's default).
// - H2 (low-medium; the gateway's own login). Any role may change its own password (`ALTER ROLE
//   device_gateway_login PASSWORD '...'`, no privilege needed, PostgreSQL allows it to every role). Every replica
//   that connects afterwards (a restart, a rolling update, a pool connection replaced) is refused, and the way the
//   runbook gives to set a login's password (operations §2, "re-run the migration Job (with explicit passwords
//   every run sets them)") does not repair this login: the gateway's password is set only when 0001 creates the role
//   (`IF NOT EXISTS ... CREATE ROLE ... PASSWORD`), and 0001 never runs again. (The enterprise logins' passwords are
//   set at every run: enterprise 0002.) Fix: set the login's password at every run of the gateway's migrations when
//   it is given (an `ALTER ROLE device_gateway_login PASSWORD %L` step after the set, as the enterprise set does),
//   so the Job repairs it and rotations work; operations §7 names the check (`rolpassword` cannot be read, so: "the
//   gateway's log says password authentication failed -> re-run the Job").
// - H3 (low; the gateway's own login). The bus's publishing functions lock the one row of `bus_turn` FOR UPDATE
//   before they look at what they were given, so a call that writes nothing (bus_publish_overrides of an empty
//   array or of an unknown device, bus_clear_override of an invented device) takes the turn, and a session that
//   leaves that transaction open holds it: every replica's notify-settings fails with 503 after the statement
//   deadline, and a replica that starts meanwhile never becomes ready (bus_join waits for the same row). 0008's
//   rule for the rollout functions ("a call that will write nothing takes no lock", review 27b) was not applied
//   to the bus; a real publish left open holds it too, which design §3.6 does not mention (§3.9 accepts the
//   rollout's equivalent). Fix: take the turn only once a message will be written (return early on an empty
//   array; check the registry row before the lock and again under it); and, for the open transaction after a
//   real publish, a replica whose publish or join waits on bus_turn ends what blocks it when that is a session of
//   its own login that is `idle in transaction` and not a named replica session (`pg_blocking_pids` +
//   `pg_terminate_backend`, which a login may call on its own sessions), or document it in §3.6/operations §7.
// - H4 (medium; every login that may connect, the platform's or `postgres`). temp_file_limit is -1 (PostgreSQL's
//   default): a session keeps as much temporary file as it likes for as long as it lives, e.g. a cursor WITH HOLD,
//   materialised at commit (128 MB in about 200 ms here; 389 MB in 16 s with a sort in an ad-hoc run). Temporary
//   files live in the cluster's data directory, so a few sessions fill the disk that the WAL, the gateway's tables
//   and the delivery record share: writes fail ("No space left on device") and a WAL write that fails stops the
//   server (PANIC). The same class as the sixth review's H2 (WAL through pg_logical_emit_message, closed by 0036);
//   no grant closes this one. temp_file_limit is PGC_SUSET, so a login cannot lift a limit it was given (checked
//   here: SET is refused). Fix: a cluster-wide `temp_file_limit` (postgresql.conf / ALTER SYSTEM, e.g. 256MB:
//   the bound is then that times the sessions, which the enterprise logins' connection limits already cap), set per
//   login too where a superuser runs the migrations (`ALTER ROLE authenticator SET temp_file_limit = ...`), the
//   start-time check (connection-reserve.ts) warning while it is -1, and operations §7 saying so.
// - Not tests (reported): the gateway's login may pg_terminate_backend any session of its own role (every
//   replica's bus and pool connections), an inherent consequence of one login for every replica (design §3.9
//   "telling a replica's calls apart needs a login per replica"); any session may SET work_mem/hash_mem_multiplier
//   as high as it likes (USERSET), so server memory is bounded only by the OS (vm.overcommit_memory = 2 turns an
//   overcommit into an ERROR instead of the OOM killer ending the postmaster's children); a stranger's NOTIFY
//   commits of 40,000 x 8 kB each (6-8 s apiece, two sessions back to back) did not delay another session's
//   NOTIFY (1-10 ms): the cluster-wide NOTIFY commit lock is not held while the statement runs (measured ad hoc).
import { describe, expect, it, jest } from '@jest/globals';
import {
  API_LOGIN,
  AUTHENTICATOR,
  PORTAL_ROLE,
  devRolePasswords,
  enterpriseMigrationsWith,
} from '@platform/enterprise-db';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { sql } from 'kysely';
import type pg from 'pg';
import { readConnectionReserve, roleSettingsGap, tempFileGap } from '../src/db/connection-reserve.js';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import { NOBODY_PASSWORD, platformWithTwoReplicas } from './support/platform-database.js';
import { startReplica, type Replica } from './support/replicas.js';
import { attackersOf, connectGatewayLogin, postWithin } from './support/attack.js';

jest.setTimeout(300_000);

const DEVICE = 'acme-hq-hvac-01';
const env = { LOG_LEVEL: 'warn' };

// Replica A serves notify-settings while the attacks run (B only shares the bus).
const fixture = platformWithTwoReplicas(env);
const attackers = attackersOf(() => fixture.platform);

/** /api/ready of `r` every 250 ms for `ms`: how many answers were not 200. */
async function notReadyDuring(r: Replica, ms: number): Promise<{ probes: number; notReady: number }> {
  const end = Date.now() + ms;
  let probes = 0;
  let notReady = 0;
  while (Date.now() < end) {
    const status = await fetch(`${r.url}/api/ready`, { signal: AbortSignal.timeout(2000) }).then(
      (res) => res.status,
      () => 0,
    );
    probes++;
    if (status !== 200) notReady++;
    await new Promise((res) => setTimeout(res, 250));
  }
  return { probes, notReady };
}

describe('H1 (low-medium): session killers the gateway’s login gives itself as role defaults', () => {
  for (const setting of ["idle_session_timeout = '300ms'", "transaction_timeout = '1ms'"]) {
    it(`a replica started after \`ALTER ROLE device_gateway_login IN DATABASE ... SET ${setting}\` keeps its bus`, async () => {
      const scope = `IN DATABASE "${fixture.platform.database.name}"`;
      const g = await connectGatewayLogin(fixture.platform);
      const altered = await g.query(`ALTER ROLE device_gateway_login ${scope} SET ${setting}`).then(
        () => 'set',
        (err: Error) => `refused: ${err.message}`,
      );
      await g.end();
      let c: Replica | undefined;
      try {
        // The start-time check names it (so this is not about the warning, which holds).
        const gateway = createDb<unknown>(gatewayLoginUrl(fixture.platform.database.url), {
          max: 1,
          logger: { warn: () => undefined },
        });
        const warning = await readConnectionReserve(gateway)
          .then(roleSettingsGap, (err: Error) => `check failed: ${err.message}`)
          .finally(() => gateway.destroy());
        console.log(`H1 ${setting}: the start-time check says: ${String(warning)}`);

        c = await startReplica('C', fixture.platform.database.url, env);
        const ready = await c.waitReady(20_000).then(
          () => 'ready',
          () => 'not ready in 20 s',
        );
        const watched = ready === 'ready' ? await notReadyDuring(c, 6000) : { probes: 0, notReady: 0 };
        const res =
          ready === 'ready'
            ? await postWithin(
                c,
                '/api/notify-settings',
                { device_id: DEVICE, settings: { reporting_interval_s: 321 } },
                8000,
              )
            : { status: 0 };
        const lines = c.logs().split('\n');
        const lost = lines.filter((l) =>
          /listener connection lost|connect or resync failed|terminating connection/.test(l),
        );
        console.log(
          `H1 ${setting}: ${altered}; new replica ${ready}, not ready ${watched.notReady}/${watched.probes} ` +
            `probes over 6 s, notify-settings ${res.status}; ${lost.length} bus losses logged: ` +
            lost
              .slice(0, 2)
              .map((l) => l.slice(0, 220))
              .join(' | '),
        );
        // 92eee63: idle_session_timeout: the listener is ended 300 ms after each connect ("terminating connection
        // due to idle-session timeout"), the replica loses its bus over and over.
        expect(ready).toBe('ready');
        expect(watched.notReady).toBe(0);
        expect(res.status).toBe(200);
        expect(lost).toEqual([]);
      } finally {
        // As the owner: the login's own sessions would inherit the setting.
        await sql.raw(`ALTER ROLE device_gateway_login ${scope} RESET ALL`).execute(fixture.owner);
        await c?.stop();
      }
    });
  }
});

describe('H1, the class: any other default the gateway’s login gives itself', () => {
  it('does not reach a new pool connection (createDb resets it to the built-in value)', async () => {
    const scope = `IN DATABASE "${fixture.platform.database.name}"`;
    const g = await connectGatewayLogin(fixture.platform);
    await g.query(`ALTER ROLE device_gateway_login ${scope} SET synchronous_commit = off`);
    await g.query(`ALTER ROLE device_gateway_login SET row_security = off`);
    await g.query(`ALTER ROLE device_gateway_login SET extra_float_digits = -15`);
    await g.end();
    const gateway = createDb<unknown>(gatewayLoginUrl(fixture.platform.database.url), {
      max: 1,
      logger: { warn: () => undefined },
    });
    try {
      const { rows } = await sql<{ s: string }>`
        SELECT pg_catalog.string_agg(name || '=' || setting, ', ' ORDER BY name) AS s FROM pg_catalog.pg_settings
        WHERE name IN ('synchronous_commit', 'row_security', 'extra_float_digits')`.execute(gateway);
      // 92eee63: extra_float_digits=-15, row_security=off, synchronous_commit=off.
      expect(rows[0]!.s).toBe('extra_float_digits=1, row_security=on, synchronous_commit=on');
    } finally {
      await gateway.destroy();
      await sql.raw(`ALTER ROLE device_gateway_login ${scope} RESET ALL`).execute(fixture.owner);
      await sql.raw(`ALTER ROLE device_gateway_login RESET ALL`).execute(fixture.owner);
    }
  });
});

describe('H2 (low-medium): the gateway’s login changes its own password', () => {
  it('a re-run of the migrations with the login’s password (the Job) lets replicas in again', async () => {
    const g = await connectGatewayLogin(fixture.platform);
    const changed = await g.query(`ALTER ROLE device_gateway_login PASSWORD 'chosen-by-the-holder'`).then(
      () => 'changed',
      (err: Error) => `refused: ${err.message}`,
    );
    await g.end();
    const tryLogin = (): Promise<string> =>
      connectGatewayLogin(fixture.platform).then(
        async (c) => {
          await c.end();
          return 'in';
        },
        (err: Error) => `refused: ${err.message}`,
      );
    const before = await tryLogin();
    try {
      // What operations §2 says repairs or rotates a login's password: run the platform's migrations again with
      // the password (here the development one, as `gatewayMigrations` carries it).
      await migrateToLatest(fixture.owner, [gatewayMigrations]);
      const after = await tryLogin();
      console.log(
        `H2: ${changed}; the login with its configured password: ${before}; after a migration run: ${after}`,
      );
      // 92eee63: changed; refused (password authentication failed) before and after the run.
      expect(after).toBe('in');
    } finally {
      await sql
        .raw(
          `ALTER ROLE device_gateway_login PASSWORD '${new URL(gatewayLoginUrl(fixture.platform.database.url)).password}'`,
        )
        .execute(fixture.owner);
    }
  });
});

describe('the enterprise logins change their own passwords (the same hole as H2)', () => {
  it('a re-run given their passwords (explicit, as the Job is) lets them in again', async () => {
    const url = (role: string, password: string) => {
      const u = new URL(fixture.platform.database.url);
      u.username = role;
      u.password = password;
      return u.toString();
    };
    const tryLogin = async (role: string, password: string): Promise<string> => {
      const db = createDb(url(role, password), { max: 1, logger: { warn: () => undefined } });
      try {
        await sql`SELECT 1`.execute(db);
        return 'in';
      } catch (err) {
        return `refused: ${(err as Error).message}`;
      } finally {
        await db.destroy();
      }
    };
    const logins = [
      [AUTHENTICATOR, devRolePasswords.authenticator],
      [API_LOGIN, devRolePasswords.enterpriseApi],
    ] as const;
    try {
      for (const [role, password] of logins) {
        const own = createDb(url(role, password), { max: 1, logger: { warn: () => undefined } });
        await sql.raw(`ALTER ROLE ${role} PASSWORD 'chosen-by-the-holder'`).execute(own);
        await own.destroy();
        expect(await tryLogin(role, password)).toMatch(/^refused/);
      }
      await migrateToLatest(fixture.owner, [
        enterpriseMigrationsWith({ ...devRolePasswords, explicit: true }),
      ]);
      // Before setRolePasswords in the enterprise set: refused after the run too.
      for (const [role, password] of logins) expect(await tryLogin(role, password)).toBe('in');
    } finally {
      for (const [role, password] of logins)
        await sql.raw(`ALTER ROLE ${role} PASSWORD '${password}'`).execute(fixture.owner);
    }
  });
});

describe('H3 (low): the gateway’s login holding the bus’s turn in an open transaction', () => {
  const calls: [string, string][] = [
    ['bus_publish_overrides of an empty array', `SELECT device_gateway.bus_publish_overrides('{}'::text[])`],
    [
      'bus_clear_override of an invented device',
      `SELECT device_gateway.bus_clear_override('no-such-device',
         (extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text, 'aaaaaaaaaaaaaaaa')`,
    ],
  ];
  for (const [what, call] of calls) {
    it(`${what} (writes nothing) left open does not stop notify-settings`, async () => {
      const g = await connectGatewayLogin(fixture.platform);
      try {
        await g.query('BEGIN');
        const answer = (await g.query<{ r: unknown }>(call.replace('SELECT', 'SELECT (') + ')::text AS r'))
          .rows[0]!.r;
        const res = await postWithin(
          fixture.replicas[0]!,
          '/api/notify-settings',
          { device_id: DEVICE, settings: { reporting_interval_s: 111 } },
          8000,
        );
        console.log(
          `H3 ${what}: answered ${String(answer)}; notify-settings meanwhile: ${res.status} in ${res.ms} ms`,
        );
        // 92eee63: 503 after the statement deadline (the publish waits for bus_turn's row).
        expect(res.status).toBe(200);
      } finally {
        await g.query('ROLLBACK').catch(() => undefined);
        await g.end();
      }
    });
  }
});

describe('H4 (medium): any login that may connect keeps temporary files without bound (the cluster’s disk)', () => {
  it('each attacker, and a login with no grant from `postgres`: temp_file_limit bounds it and it cannot lift it', async () => {
    const sessions: [string, () => Promise<pg.Client>][] = [
      ...attackers.map((x): [string, () => Promise<pg.Client>] => [x.name, x.connect]),
      [
        'a login with no grant, in `postgres`',
        () =>
          fixture.platform.connectAs(fixture.platform.nobody, NOBODY_PASSWORD, fixture.platform.server.url),
      ],
    ];
    const found: string[] = [];
    const results: [string, string, string][] = [];
    for (const [name, connect] of sessions) {
      const c = await connect();
      try {
        const limit = (
          await c.query<{ l: string }>(`SELECT pg_catalog.current_setting('temp_file_limit') AS l`)
        ).rows[0]!.l;
        const lift = await c.query('SET temp_file_limit = -1').then(
          () => 'lifted',
          (err: Error) => `refused: ${err.message}`,
        );
        // A cursor WITH HOLD is materialised at commit into a temporary file that lives as long as the session
        // (128 MB here; 389 MB in 16 s with a sort, and nothing stops at the disk's size).
        const t0 = Date.now();
        const held = await c
          .query(
            `BEGIN; DECLARE k CURSOR WITH HOLD FOR
               SELECT i, pg_catalog.repeat('x', 100000) FROM pg_catalog.generate_series(1, 1280) i; COMMIT`,
          )
          .then(
            () => `kept 128 MB in ${Date.now() - t0} ms`,
            (err: Error) => `refused: ${err.message}`,
          );
        const { rows } = await sql<{ mb: number }>`
          SELECT coalesce(round(sum(size) / 1048576), 0)::int AS mb FROM pg_catalog.pg_ls_tmpdir()`.execute(
          fixture.owner,
        );
        found.push(
          `${name}: temp_file_limit ${limit}, SET -1 ${lift}; ${held} (temp files now ${rows[0]!.mb} MB)`,
        );
        results.push([name, limit, lift]);
      } finally {
        await c.query('ROLLBACK').catch(() => undefined);
        await c.end();
      }
    }
    console.log(`H4: ${found.join('; ')}`);
    // 92eee63: -1 (no limit) for every one of them; each kept its 128 MB until it disconnected.
    for (const [name, limit, lift] of results) {
      expect([name, limit]).not.toEqual([name, '-1']);
      expect([name, lift]).toEqual([name, expect.stringMatching(/^refused/)]);
    }
  });
});

describe('H4, the start-time check', () => {
  it('names a cluster where temp_file_limit is still -1 for the login, and is silent once it is set', async () => {
    const read = async (): Promise<string | undefined> => {
      const gateway = createDb<unknown>(gatewayLoginUrl(fixture.platform.database.url), {
        max: 1,
        logger: { warn: () => undefined },
      });
      try {
        return tempFileGap(await readConnectionReserve(gateway));
      } finally {
        await gateway.destroy();
      }
    };
    const set = await read();
    // What a cluster whose migrations were not run by a superuser looks like (the server's test role is one).
    await sql.raw(`ALTER ROLE ALL RESET temp_file_limit`).execute(fixture.owner);
    try {
      expect(await read()).toMatch(/temp_file_limit is -1/);
    } finally {
      await sql.raw(`ALTER ROLE ALL SET temp_file_limit = '1GB'`).execute(fixture.owner);
    }
    expect(set).toBeUndefined();
  });
});

describe('attacks that held', () => {
  it('no attacker learns the channels’ secret: the table, the listener’s statement and the catalogs say nothing', async () => {
    const { rows } = await sql<{ secret: string }>`SELECT secret FROM device_gateway.bus_channels`.execute(
      fixture.owner,
    );
    const secret = rows[0]!.secret;
    for (const { name, connect } of attackers) {
      const c = await connect();
      const table = await c.query('SELECT secret FROM device_gateway.bus_channels').then(
        () => 'read',
        (err: Error) => `refused: ${err.message}`,
      );
      // Every column any role may read of every session, every setting, every statement statistic there is.
      const { rows: seen } = await c.query<{ t: string }>(
        `SELECT coalesce(string_agg(a::text, ' '), '') AS t FROM pg_catalog.pg_stat_activity a`,
      );
      const { rows: settings } = await c.query<{ t: string }>(
        `SELECT coalesce(string_agg(s::text, ' '), '') AS t FROM pg_catalog.pg_settings s`,
      );
      const statements = await c
        .query<{ t: string }>(`SELECT coalesce(string_agg(s::text, ' '), '') AS t FROM pg_stat_statements s`)
        .then(
          (r) => r.rows[0]!.t,
          () => '',
        );
      await c.end();
      expect([name, table]).toEqual([name, expect.stringMatching(/^refused/)]);
      expect(seen[0]!.t.includes(secret)).toBe(false);
      expect(settings[0]!.t.includes(secret)).toBe(false);
      expect(statements.includes(secret)).toBe(false);
    }
  });

  it('PostgREST’s authenticator as the signed-in portal role: no right in device_gateway, no lock on the platform’s sites the gateway could wait for', async () => {
    const c = await fixture.platform.connectAs(AUTHENTICATOR, devRolePasswords.authenticator);
    await c.query(`SET ROLE ${PORTAL_ROLE}`);
    const outcomes: string[] = [];
    const attempt = async (text: string): Promise<void> => {
      await c.query('BEGIN');
      outcomes.push(
        `${text.slice(0, 60)}: ${await c.query(text).then(
          () => 'done',
          (err: Error) => `refused (${(err as { code?: string }).code})`,
        )}`,
      );
      await c.query('ROLLBACK');
    };
    try {
      await attempt('LOCK TABLE enterprise.sites IN SHARE MODE');
      await attempt('LOCK TABLE enterprise.sites IN ACCESS EXCLUSIVE MODE');
      await attempt('SELECT 1 FROM enterprise.sites FOR UPDATE');
      await attempt('SELECT 1 FROM enterprise.sites FOR KEY SHARE');
      await attempt('SELECT device_gateway.platform_sites()');
      await attempt('SELECT * FROM device_gateway.bus_overrides');
      await attempt(`SELECT pg_catalog.set_config('role', 'device_gateway_login', false)`);
      await attempt('SET ROLE device_gateway_login');
    } finally {
      await c.end();
    }
    console.log(`held (portal role): ${outcomes.join('; ')}`);
    for (const o of outcomes) expect(o).toMatch(/refused/);
  });
});
