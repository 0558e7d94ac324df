// Tenth cold review of issue 39 §1: the replica bus and the platform database's roles. A private PostgreSQL with the
// whole platform's migrations. Each "H" test fails against this code and passes once the hole is closed.
//
// - H1 (low-medium; the gateway's own login, and likewise the workflow's login and PostgREST's authenticator). The
//   ninth review's fix to service-kit setRolePasswords ends the role's sessions that hold a transaction id, sleeps
//   50 ms x attempt, and tries its ALTER ROLE again (5 tries, each waiting up to 2 s). Between the end of the holder
//   and the step's next ALTER, the login takes its row again from another session: sessions that poll
//   `BEGIN; ALTER ROLE CURRENT_USER PASSWORD '<its own>'` with lock_timeout = 1 ms hold no transaction id while they
//   wait (they fail in 1 ms and roll back), so they are not ended, and one of them wins the row within
//   milliseconds of the holder's end, long before the step's pause is over. Lost sessions reconnect (the committed
//   password is the attacker's). The step fails after its tries, the Job fails, and the password stays the
//   attacker's: every replica (or PostgREST / the workflow) stays refused — the residual the ninth review named.
//   Fix: let the step's ALTER ROLE wait *queued* on the row (it then holds the row's tuple lock, and every later
//   session queues behind it), and end the holders from a second connection while it waits (the pids in
//   pg_blocking_pids(<the step's pid>), or the role's sessions with a backend_xid), so that when the holder ends
//   the row goes to the step and not to a newcomer. Ending sessions and retrying in the same session, with a
//   pause, cannot win against a login that polls.
// - H2 (low-medium; same logins). The step's DO block is one transaction, and pg_stat_activity is read once per
//   transaction (the backend-status snapshot is kept until the transaction ends; subtransactions keep it): every try
//   after the first ends the sessions of the *first* look again, so a session that takes the row after the first
//   end is never ended. Shown with one polling session that never reconnects: it wins the row once, stays for the
//   four later tries, and the Job fails after 10.7 s. Fix: `PERFORM pg_catalog.pg_stat_clear_snapshot();` before
//   the pg_terminate_backend query (checked in this worktree: H2 then passes, the run finishes in 4.3 s; H1 still
//   fails without its own fix).
// - H3 (medium; the gateway's login, and by the same PostgreSQL rule the workflow's login and PostgREST's
//   authenticator). `local_preload_libraries` has context `user`, so a login may give it to itself:
//   `ALTER ROLE CURRENT_USER SET local_preload_libraries = 'no_such_library'`. PostgreSQL loads
//   $libdir/plugins/<name> at the start of every later session of the login, before its first statement, and a
//   missing library is FATAL: every new connection of every replica (createDb pool) is refused with `could not
//   access file "$libdir/plugins/no_such_library"`. service-kit's reset of the login's own defaults (onConnect) and
//   the pinned startup options (PINNED_SESSION_OPTIONS) come too late / do not name it, and a re-run of the
//   migrations (the Job) leaves the role default in place. Fix: pin it in the startup packet
//   (`-c local_preload_libraries=` in PINNED_SESSION_OPTIONS; a client-source value wins over the role default),
//   and in the every-run step `ALTER ROLE <login> RESET ALL` plus `ALTER ROLE <login> IN DATABASE <db> RESET ALL`
//   (or at least RESET local_preload_libraries) for each login it owns; the start warning should name it. PostgREST
//   (own libpq connection) needs the Job's reset, since its startup options are not ours.
// - Held: post_auth_delay, ignore_system_indexes, jit_*_support, log_connections (55P02) and
//   session_preload_libraries (42501) cannot be given by a login to itself.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { sql } from 'kysely';
import type pg from 'pg';
import { DEV_GATEWAY_LOGIN_PASSWORD, gatewayMigrations } from '../src/db/migrations.js';
import { startPlatformDatabase, type PlatformDatabase } from './support/platform-database.js';
import { connectGatewayLogin, jobRun, loginOutcome, migrationJobDb, withinOr } from './support/attack.js';
import { loginUrl } from './support/gateway.js';

jest.setTimeout(300_000);

let platform: PlatformDatabase;
beforeAll(async () => {
  platform = await startPlatformDatabase({ stranger: true, nobody: true });
});
afterAll(async () => {
  await (platform as PlatformDatabase | undefined)?.close();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `n` sessions of the gateway's login that poll for its own role row (lock_timeout 1 ms) and hold it once won. */
function pollers(n: number, reconnect: boolean) {
  const login = 'device_gateway_login';
  const chosen = 'chosen-by-the-poller';
  let stop = false;
  let wins = 0;
  let reconnects = 0;
  const poller = async (): Promise<void> => {
    do {
      let c: pg.Client;
      try {
        c = await platform.connectAs(login, chosen);
      } catch {
        await sleep(20);
        continue;
      }
      c.on('error', () => undefined);
      try {
        await c.query(`SET lock_timeout = '1ms'`);
        await c.query(`SET statement_timeout = 0`);
        while (!stop) {
          await c.query('BEGIN');
          try {
            await c.query(`ALTER ROLE CURRENT_USER PASSWORD '${chosen}'`);
            wins++;
            // Hold the row, idle in the transaction, until ended (a query then fails) or told to stop.
            while (!stop) {
              await sleep(20);
              await c.query('SELECT 1');
            }
          } catch (err) {
            if ((err as { code?: string }).code !== '55P03') throw err;
            await c.query('ROLLBACK');
            await sleep(15);
          }
        }
      } catch {
        reconnects++;
      } finally {
        await c.end().catch(() => undefined);
      }
    } while (reconnect && !stop);
  };
  const running = Array.from({ length: n }, () => poller());
  return {
    wins: () => wins,
    ended: () => reconnects,
    stop: async () => {
      stop = true;
      await Promise.all(running);
    },
  };
}

describe('H1 (low-medium): a login that polls for its own role row wins it back between the step’s tries', () => {
  // The step's ALTER ROLE now waits queued on the row while a side session ends its holders (service-kit
  // setRolePasswords); this was it.failing until then.
  it('device_gateway_login: a re-run of the migrations sets the configured password against 3 polling sessions', async () => {
    const login = 'device_gateway_login';
    const password = DEV_GATEWAY_LOGIN_PASSWORD;
    const chosen = 'chosen-by-the-poller';
    const first = await connectGatewayLogin(platform);
    await first.query(`ALTER ROLE CURRENT_USER PASSWORD '${chosen}'`);
    await first.end();

    const p = pollers(3, true);
    const db = migrationJobDb(platform);
    try {
      await sleep(500);
      const run = jobRun(db, [gatewayMigrations]);
      const outcome = await withinOr(run, 60_000, 'still waiting after 60 s');
      await p.stop();
      const after = await loginOutcome(platform, login, password);
      console.log(
        `H1: the Job's run ${outcome}; row taken ${p.wins()} times, ${p.ended()} sessions ended; configured password: ${after}`,
      );
      expect(outcome).toMatch(/^finished/);
      expect(after).toBe('in');
    } finally {
      await p.stop();
      await db.destroy();
      await sql.raw(`ALTER ROLE ${login} PASSWORD '${password}'`).execute(platform.owner);
    }
  });
});

describe('H2 (low-medium): each try of the step ends the holders of its first look (one pg_stat_activity snapshot)', () => {
  it('device_gateway_login: one polling session that never reconnects is ended once it holds the row', async () => {
    const login = 'device_gateway_login';
    const password = DEV_GATEWAY_LOGIN_PASSWORD;
    const first = await connectGatewayLogin(platform);
    await first.query(`ALTER ROLE CURRENT_USER PASSWORD 'chosen-by-the-poller'`);
    await first.end();
    const holder = await platform.connectAs(login, 'chosen-by-the-poller');
    holder.on('error', () => undefined);
    await holder.query('BEGIN');
    await holder.query(`ALTER ROLE CURRENT_USER PASSWORD 'chosen-by-the-poller'`);
    const p = pollers(1, false);
    const db = migrationJobDb(platform);
    try {
      const run = jobRun(db, [gatewayMigrations]);
      const outcome = await withinOr(run, 60_000, 'still waiting after 60 s');
      await p.stop();
      const after = await loginOutcome(platform, login, password);
      console.log(
        `H2: the Job's run ${outcome}; row taken ${p.wins()} times by the poller; configured password: ${after}`,
      );
      // With a fresh look at each try: the poller (if it won the row) is ended at the next try, and a later try wins.
      expect(outcome).toMatch(/^finished/);
      expect(after).toBe('in');
    } finally {
      await p.stop();
      await holder.end().catch(() => undefined);
      await db.destroy();
      await sql.raw(`ALTER ROLE ${login} PASSWORD '${password}'`).execute(platform.owner);
    }
  });
});

describe('H3 (medium): a login gives itself local_preload_libraries, which acts before the connection’s reset', () => {
  it('device_gateway_login: a replica’s pool (createDb) still connects, and a re-run of the migrations repairs it', async () => {
    const g = await connectGatewayLogin(platform);
    const pool = createDb<unknown>(loginUrl(platform.database.url), {
      applicationName: 'device-gateway-probe',
      max: 1,
      logger: { warn: () => undefined },
    });
    try {
      // Any name: PostgreSQL loads $libdir/plugins/<name> at every start of a session of the login, before the
      // first statement, so service-kit's reset of the login's own defaults (onConnect) never runs.
      await g.query(`ALTER ROLE CURRENT_USER SET local_preload_libraries = 'no_such_library'`);
      const viaPool = await sql`SELECT 1`.execute(pool).then(
        () => 'in',
        (err: Error) => `refused: ${err.message}`,
      );
      await migrateToLatest(platform.owner, [gatewayMigrations]).catch(() => undefined);
      const afterJob = await connectGatewayLogin(platform).then(
        async (c) => {
          await c.end();
          return 'in';
        },
        (err: Error) => `refused: ${err.message}`,
      );
      console.log(`H3: a pool connection: ${viaPool}; after a re-run of the migrations: ${afterJob}`);
      expect(viaPool).toBe('in');
      expect(afterJob).toBe('in');
    } finally {
      await g.end().catch(() => undefined);
      await pool.destroy();
      await sql`ALTER ROLE device_gateway_login RESET ALL`.execute(platform.owner);
    }
  });
});

describe('held: the other session-start settings a login might give itself', () => {
  it('post_auth_delay, ignore_system_indexes, jit_*_support, log_connections, session_preload_libraries: refused', async () => {
    const g = await connectGatewayLogin(platform);
    try {
      const tried: string[] = [];
      for (const [name, value] of [
        ['post_auth_delay', '60'],
        ['ignore_system_indexes', 'on'],
        ['jit_debugging_support', 'on'],
        ['jit_profiling_support', 'on'],
        ['log_connections', 'on'],
        ['session_preload_libraries', "'x'"],
      ] as const) {
        tried.push(
          await g.query(`ALTER ROLE CURRENT_USER SET ${name} = ${value}`).then(
            () => `${name}: accepted`,
            () => `${name}: refused`,
          ),
        );
      }
      expect(tried.filter((t) => t.endsWith('accepted'))).toEqual([]);
    } finally {
      await g.query('ALTER ROLE CURRENT_USER RESET ALL').catch(() => undefined);
      await g.end();
    }
  });
});
