// Twelfth cold review of issue 39 §1: the replica bus and the platform database's roles, attacked by (1) a login
// with CONNECT on the platform's database and nothing else, (2) the workflow's login, (3) PostgREST's
// authenticator (as its portal roles), and, for bounds, (5) the gateway's own login. A private PostgreSQL with the
// whole platform's migrations. No hole was found in this (time-boxed) round: every test below is an attack that
// held, written so that it fails if the defence goes.
//
// - Held: a login's own defaults for *custom* settings (`plpgsql.extra_errors`, `plpgsql.variable_conflict`) are
//   not reset by service-kit's RESET_OWN_DEFAULTS_SQL (it skips custom settings by design, and plpgsql's are
//   placeholders until the library loads), so they reach every later connection of the login and change how the
//   owner's plpgsql functions compile and run in those sessions. None of the gateway's functions behaves
//   differently under them (the same answers for every function the login may call), and a replica started after
//   `ALTER ROLE device_gateway_login SET plpgsql.extra_errors = 'all'` becomes ready; the start warns.
// - Held: no function outside pg_catalog is executable by a login with CONNECT only except the non-definer
//   append-only trigger function; every SECURITY DEFINER function pins search_path; the definer functions new since
//   the eleventh review (0037/0038's audit trigger and audit_site_companies_of, 0041's rollouts_stamp_site_companies
//   and rollout_sites_of) are executable by their owner only.
// - Held: the definer triggers read enterprise.sites; none of the attacking logins may take a lock on it that
//   would block their reads (LOCK TABLE ... IN SHARE ROW EXCLUSIVE / ACCESS EXCLUSIVE is refused: SELECT only).
// - Held: the gateway's login cannot skip the triggers (session_replication_role is superuser-only) nor write
//   rollouts.site_companies or enterprise.sites itself.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import { sql } from 'kysely';
import { gatewayLoginUrl } from '../src/db/migrations.js';
import { startPlatformDatabase, type PlatformDatabase } from './support/platform-database.js';
import { startReplica, type Replica } from './support/replicas.js';
import { attackersOf, connectGatewayLogin, connectStranger, until } from './support/attack.js';

jest.setTimeout(300_000);

let platform: PlatformDatabase;
beforeAll(async () => {
  platform = await startPlatformDatabase({ stranger: true, nobody: true });
});
afterAll(async () => {
  await (platform as PlatformDatabase | undefined)?.close();
});

const outcome = (p: Promise<unknown>): Promise<string> =>
  p.then(
    () => 'ok',
    (err: Error) => `refused: ${err.message}`,
  );

// What the gateway's login may call, with arguments that exercise each function's main path.
const LOGIN_CALLS = [
  `SELECT device_gateway.bus_join()`,
  `SELECT device_gateway.rollout_lease('g8', 1000)`,
  `SELECT device_gateway.rollout_step('g8', 10, false, 10)`,
  `SELECT device_gateway.rollout_release('g8')`,
  `SELECT device_gateway.delivery_reap('g8', 'g8', 10)`,
  `SELECT device_gateway.bus_publish_overrides(ARRAY[]::text[])`,
  `SELECT device_gateway.bus_clear_override('x', 'y', 'z')`,
  `SELECT device_gateway.delivery_lag_ms()`,
  `SELECT count(*) FROM device_gateway.platform_sites()`,
  `SELECT device_gateway.inspect_ask(gen_random_uuid(), 'g8', 'x')`,
];

async function answersWith(setting: string | undefined): Promise<string[]> {
  const g = await connectGatewayLogin(platform);
  try {
    if (setting !== undefined) await g.query(setting);
    const out: string[] = [];
    for (const c of LOGIN_CALLS) out.push(await outcome(g.query(c)));
    return out;
  } finally {
    await g.end();
  }
}

describe("held: the login's own plpgsql settings (custom settings survive the connect reset)", () => {
  it('the owner’s functions answer the same under extra_errors=all and either variable_conflict', async () => {
    const base = await answersWith(undefined);
    for (const s of [
      `SET plpgsql.extra_errors = 'all'`,
      `SET plpgsql.variable_conflict = 'use_variable'`,
      `SET plpgsql.variable_conflict = 'use_column'`,
    ]) {
      expect({ s, answers: await answersWith(s) }).toEqual({ s, answers: base });
    }
  });

  it('a replica started after `ALTER ROLE ... SET plpgsql.extra_errors = all` is ready and warns', async () => {
    const g = await connectGatewayLogin(platform);
    await g.query(`DO $$BEGIN END$$`);
    const altered = await outcome(g.query(`ALTER ROLE CURRENT_USER SET plpgsql.extra_errors = 'all'`));
    await g.end();
    let c: Replica | undefined;
    try {
      // The reset leaves custom settings, and this one reached the services' connections until they pinned
      // PL/pgSQL's settings (service-kit PINNED_SESSION_OPTIONS; the review's hardening suggestion).
      const gateway = createDb<unknown>(gatewayLoginUrl(platform.database.url), {
        max: 1,
        logger: { warn: () => undefined },
      });
      const seen = await sql<{ v: string }>`SELECT current_setting('plpgsql.extra_errors', true) AS v`
        .execute(gateway)
        .then((r) => r.rows[0]!.v)
        .finally(() => gateway.destroy());
      c = await startReplica('C', platform.database.url, { LOG_LEVEL: 'warn' });
      const ready = await c.waitReady(30_000).then(
        () => 'ready',
        (err: Error) => `not ready: ${err.message}`,
      );
      console.log(
        `plpgsql default: ${altered}; a pool connection sees ${seen}; a replica started then: ${ready}`,
      );
      expect(altered).toBe('ok');
      expect(seen).toBe('none');
      expect(ready).toBe('ready');
      const r = c;
      await until(
        () => Promise.resolve(/plpgsql\.extra_errors=all/.test(r.logs())),
        'the start warning',
        5_000,
      );
    } finally {
      await sql.raw(`ALTER ROLE device_gateway_login RESET ALL`).execute(platform.owner);
      await c?.stop();
    }
  });
});

describe('held: definer functions and what they read', () => {
  it('a login with CONNECT only may execute no definer function; each definer pins search_path', async () => {
    const s = await connectStranger(platform);
    try {
      const { rows: callable } = await s.query<{ f: string }>(`
        SELECT p.oid::regprocedure::text AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND p.prosecdef
          AND has_function_privilege(p.oid, 'EXECUTE')`);
      const { rows: unpinned } = await s.query<{ f: string }>(`
        SELECT p.oid::regprocedure::text AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND p.prosecdef
          AND NOT EXISTS (SELECT 1 FROM unnest(coalesce(p.proconfig, '{}')) c WHERE c LIKE 'search_path=%')`);
      expect(callable).toEqual([]);
      expect(unpinned).toEqual([]);
    } finally {
      await s.end();
    }
  });

  it('the definer functions of 0037, 0038 and 0041 are their owner’s alone', async () => {
    const g = await connectGatewayLogin(platform);
    try {
      const { rows } = await g.query<{ f: string; x: boolean }>(`
        SELECT f, has_function_privilege(f::regprocedure, 'EXECUTE') AS x FROM unnest(ARRAY[
          'device_gateway.audit_events_site_companies()', 'device_gateway.audit_site_companies_of(uuid[])',
          'device_gateway.rollouts_stamp_site_companies()', 'device_gateway.rollout_sites_of(uuid)']) f`);
      expect(rows.filter((r) => r.x)).toEqual([]);
      // Nor can the login skip the triggers, or write the stamped column or the sites it reads.
      expect(await outcome(g.query(`SET session_replication_role = replica`))).toMatch(/^refused/);
      expect(
        await outcome(g.query(`UPDATE device_gateway.rollouts SET site_companies = '{}' WHERE false`)),
      ).toMatch(/^refused: permission denied/);
      expect(await outcome(g.query(`SELECT 1 FROM enterprise.sites LIMIT 1`))).toMatch(/^refused/);
    } finally {
      await g.end();
    }
  });

  for (const attacker of attackersOf(() => platform)) {
    it(`${attacker.name} cannot take a lock on enterprise.sites that blocks the triggers' reads`, async () => {
      const c = await attacker.connect();
      try {
        const roles = attacker.name.startsWith('PostgREST')
          ? ['enterprise_portal_anon', 'enterprise_portal_role']
          : [undefined];
        for (const role of roles) {
          if (role !== undefined) await c.query(`SET ROLE ${role}`);
          for (const mode of ['SHARE ROW EXCLUSIVE', 'EXCLUSIVE', 'ACCESS EXCLUSIVE']) {
            await c.query('BEGIN');
            const got = await outcome(c.query(`LOCK TABLE enterprise.sites IN ${mode} MODE NOWAIT`));
            await c.query('ROLLBACK');
            expect({ role, mode, got }).toEqual({ role, mode, got: expect.stringMatching(/^refused/) });
          }
        }
      } finally {
        await c.end();
      }
    });
  }
});
