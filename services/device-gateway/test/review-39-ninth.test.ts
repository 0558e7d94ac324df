// Ninth cold review of issue 39 §1: the replica bus and the platform database's roles, attacked by (1) a login with
// CONNECT on the platform's database and nothing else, (2) the workflow's login, (3) PostgREST's authenticator, (4) a
// login with no grant (it reaches `postgres`), and, for bounds, (5) the gateway's own login. A private PostgreSQL
// with the whole platform's migrations. Each "H" test fails against bde0ffe and passes once the hole is closed; the
// attacks that held are at the end.
//
// - H1 (low-medium; the gateway's own login, the workflow's login, PostgREST's authenticator). The eighth review's
//   H1 fix (service-kit setRolePasswords) waits 2 s for a role's row, then ends the role's own sessions whose state
//   is 'idle in transaction', and tries again (5 tries). A session that holds its row while it is *running* a
//   statement is not in that state: `BEGIN; ALTER ROLE CURRENT_USER PASSWORD '<its own>'; SELECT pg_sleep(3600)`
//   (statement_timeout and idle_in_transaction_session_timeout are the session's own to set) stays 'active'. The
//   step is not ended by anything, fails after its tries, the Job fails, and the password stays the holder's:
//   every replica (or PostgREST / the workflow) stays refused, as before the eighth review's fix.
//   Fix: end the role's sessions that hold a transaction id, whatever their state (`WHERE a.usename = v_role AND
//   a.backend_xid IS NOT NULL`; an uncommitted ALTER ROLE has one), or those in pg_blocking_pids of the waiting
//   ALTER (run it in another session/with a probe), not only those 'idle in transaction'. With
//   `a.backend_xid IS NOT NULL AND a.pid <> pg_backend_pid()` in place of the state test, both H1 cases pass
//   (checked in the review's worktree, finished in about 2.2 s). Residual: a holder that reconnects and takes the
//   row again within the step's 50-150 ms pause races it; say so in operations §3 or end the role's sessions with
//   its password changed first (ALTER ROLE ... NOLOGIN, set the password, LOGIN).
// - Held (tested below): the gateway's login cannot pass the bounds of delivery_report, rollout_lease (100 ms -
//   60 s) or inspect_answer (16 KiB).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import {
  API_LOGIN,
  AUTHENTICATOR,
  devRolePasswords,
  enterpriseMigrationsWith,
} from '@platform/enterprise-db';
import type { MigrationSet } from '@platform/service-kit';
import { sql } from 'kysely';
import { DEV_GATEWAY_LOGIN_PASSWORD, gatewayMigrations } from '../src/db/migrations.js';
import { startPlatformDatabase, type PlatformDatabase } from './support/platform-database.js';
import { connectGatewayLogin, jobRun, loginOutcome, migrationJobDb, withinOr } from './support/attack.js';

jest.setTimeout(300_000);

let platform: PlatformDatabase;
beforeAll(async () => {
  platform = await startPlatformDatabase({ stranger: true, nobody: true });
});
afterAll(async () => {
  await (platform as PlatformDatabase | undefined)?.close();
});

describe('H1 (low-medium): a login that holds its own role row while running a statement keeps its password', () => {
  const cases: [string, string, () => MigrationSet[]][] = [
    ['device_gateway_login', DEV_GATEWAY_LOGIN_PASSWORD, () => [gatewayMigrations]],
    [
      AUTHENTICATOR,
      devRolePasswords.authenticator,
      () => [enterpriseMigrationsWith({ ...devRolePasswords, explicit: true }), gatewayMigrations],
    ],
    [
      API_LOGIN,
      devRolePasswords.enterpriseApi,
      () => [enterpriseMigrationsWith({ ...devRolePasswords, explicit: true }), gatewayMigrations],
    ],
  ];
  it.each(cases)(
    '%s: a re-run of the migrations sets the configured password (the holder is active, not idle)',
    async (login, password, sets) => {
      const chosen = 'chosen-by-the-holder';
      const first =
        login === 'device_gateway_login'
          ? await connectGatewayLogin(platform)
          : await platform.connectAs(login, password);
      await first.query(`ALTER ROLE CURRENT_USER PASSWORD '${chosen}'`);
      await first.end();
      const hold = await platform.connectAs(login, chosen);
      hold.on('error', () => undefined);
      const db = migrationJobDb(platform);
      let sleeping: Promise<unknown> | undefined;
      try {
        await hold.query(`SET statement_timeout = 0`);
        await hold.query('BEGIN');
        await hold.query(`ALTER ROLE CURRENT_USER PASSWORD '${chosen}'`);
        // Running, not idle: the fix may end this session (then the query rejects).
        sleeping = hold.query('SELECT pg_catalog.pg_sleep(120)').catch(() => undefined);
        const run = jobRun(db, sets());
        const outcome = await withinOr(run, 60_000, 'still waiting after 60 s');
        const during = await loginOutcome(platform, login, password);
        console.log(`H1 ${login}: the Job's run ${outcome}; the configured password: ${during}`);
        // bde0ffe: failed (the password of role ... could not be set (55P03)); refused.
        expect(outcome).toMatch(/^finished/);
        expect(during).toBe('in');
      } finally {
        await sql`SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
                WHERE usename = ${login} AND state = 'active' AND query LIKE '%pg_sleep(120)%'`.execute(
          platform.owner,
        );
        await sleeping;
        await hold.end().catch(() => undefined);
        await db.destroy();
        await sql.raw(`ALTER ROLE ${login} PASSWORD '${password}'`).execute(platform.owner);
      }
    },
  );
});

describe('held: the gateway’s login (bounds only)', () => {
  it('delivery_report, rollout_lease and inspect_answer refuse values outside their bounds', async () => {
    const g = await connectGatewayLogin(platform);
    try {
      const refused = async (q: string): Promise<string> =>
        g.query(q).then(
          () => `accepted: ${q}`,
          (err: Error & { code?: string }) => `refused ${err.code}`,
        );
      const outcomes = [
        await refused(`SELECT device_gateway.delivery_report('0123456789abcdef', -1, 5000)`),
        await refused(`SELECT device_gateway.delivery_report('0123456789abcdef', 0, 600001)`),
        await refused(`SELECT device_gateway.delivery_report('not-a-replica', 0, 5000)`),
        await refused(`SELECT device_gateway.rollout_lease('0123456789abcdef', 99)`),
        await refused(`SELECT device_gateway.rollout_lease('0123456789abcdef', 60001)`),
        await refused(
          `SELECT device_gateway.inspect_answer(gen_random_uuid(), '0123456789abcdef',
                  json_build_object('x', repeat('a', 17000)))`,
        ),
      ];
      expect(outcomes).toEqual([
        'refused 22023',
        'refused 22023',
        'refused 22023',
        'refused 22023',
        'refused 22023',
        'refused 22023',
      ]);
    } finally {
      await g.end();
    }
  });
});
