// Catalog checks (RLS on every table, security_invoker on every view, who owns and may do what) and
// the runtime logins' inability to weaken any of it.
import pg from 'pg';
import {
  API_ROLE,
  AUTHENTICATOR,
  API_LOGIN,
  demoUserSubs,
  PORTAL_ANON,
  PORTAL_ROLE,
} from '@platform/enterprise-db';
import { setUp, sqlState } from './helpers.js';
import type { Fixture } from './helpers.js';

let f: Fixture;
beforeAll(async () => {
  f = await setUp();
});
afterAll(async () => {
  await f.close();
});

const runtimeRoles = [AUTHENTICATOR, PORTAL_ROLE, PORTAL_ANON, API_ROLE, API_LOGIN];

describe('catalog', () => {
  it('every table in enterprise and enterprise_api has RLS enabled and forced', async () => {
    const { rows } = await f.adminPool.query<{ name: string; rls: boolean; forced: boolean }>(`
      SELECT c.oid::regclass::text AS name, c.relrowsecurity AS rls, c.relforcerowsecurity AS forced
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname IN ('enterprise', 'enterprise_api') AND c.relkind IN ('r', 'p')`);
    expect(rows.length).toBeGreaterThanOrEqual(13);
    expect(rows.filter((r) => !r.rls || !r.forced).map((r) => r.name)).toEqual([]);
  });

  it('every view in enterprise and enterprise_api is security_invoker (no materialized views)', async () => {
    const { rows } = await f.adminPool.query<{ name: string; kind: string; options: string[] | null }>(`
      SELECT c.oid::regclass::text AS name, c.relkind::text AS kind, c.reloptions AS options
      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname IN ('enterprise', 'enterprise_api') AND c.relkind IN ('v', 'm')`);
    expect(rows.map((r) => r.name).sort()).toEqual(
      [
        'enterprise_api.assets',
        'enterprise_api.maintenance_schedules',
        'enterprise_api.media_items',
        'enterprise_api.service_records',
        'enterprise_api.sites',
        'enterprise_api.walkthrough_logs',
        'enterprise_api.work_item_decisions',
        'enterprise_api.work_items',
      ].sort(),
    );
    const unsafe = rows.filter((r) => r.kind !== 'v' || !(r.options ?? []).includes('security_invoker=true'));
    expect(unsafe.map((r) => r.name)).toEqual([]);
  });

  it('runtime roles own nothing and are not superuser, BYPASSRLS or CREATEROLE', async () => {
    const { rows } = await f.adminPool.query<{ rolname: string; owns: string }>(
      `SELECT r.rolname,
              (SELECT count(*) FROM pg_class c WHERE c.relowner = r.oid)
            + (SELECT count(*) FROM pg_proc p WHERE p.proowner = r.oid)
            + (SELECT count(*) FROM pg_namespace s WHERE s.nspowner = r.oid) AS owns
       FROM pg_roles r WHERE r.rolname = ANY ($1)`,
      [runtimeRoles],
    );
    expect(rows.map((r) => [r.rolname, Number(r.owns)]).sort()).toEqual(
      runtimeRoles.map((r) => [r, 0]).sort(),
    );
    const { rows: attrs } = await f.adminPool.query<{ rolname: string }>(
      `SELECT rolname FROM pg_roles WHERE rolname = ANY ($1) AND (rolsuper OR rolbypassrls OR rolcreaterole OR rolcreatedb)`,
      [runtimeRoles],
    );
    expect(attrs).toEqual([]);
    const { rows: auth } = await f.adminPool.query<{ rolinherit: boolean; rolcanlogin: boolean }>(
      `SELECT rolinherit, rolcanlogin FROM pg_roles WHERE rolname = $1`,
      [AUTHENTICATOR],
    );
    expect(auth).toEqual([{ rolinherit: false, rolcanlogin: true }]);
  });

  it('the anonymous role has no privilege on any schema, table, view or function of ours', async () => {
    const { rows } = await f.adminPool.query<{ object: string }>(
      `SELECT n.nspname AS object FROM pg_namespace n
       WHERE n.nspname IN ('enterprise', 'enterprise_api', 'postgrest')
         AND (has_schema_privilege($1, n.oid, 'USAGE') OR has_schema_privilege($1, n.oid, 'CREATE'))
       UNION ALL
       SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname IN ('enterprise', 'enterprise_api') AND c.relkind IN ('r', 'v', 'p')
         AND has_table_privilege($1, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
       UNION ALL
       SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
       WHERE n.nspname IN ('enterprise', 'enterprise_api', 'postgrest') AND has_function_privilege($1, p.oid, 'EXECUTE')`,
      [PORTAL_ANON],
    );
    expect(rows).toEqual([]);
  });

  it('the portal role may only SELECT; no role of ours may TRUNCATE', async () => {
    const { rows } = await f.adminPool.query<{ object: string; role: string }>(
      `SELECT c.oid::regclass::text AS object, r.role
       FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       CROSS JOIN unnest($1::text[]) AS r(role)
       WHERE n.nspname IN ('enterprise', 'enterprise_api') AND c.relkind IN ('r', 'v')
         AND (has_table_privilege(r.role, c.oid, 'TRUNCATE, REFERENCES, TRIGGER')
              OR (r.role = $2 AND has_table_privilege(r.role, c.oid, 'INSERT, UPDATE, DELETE')))`,
      [runtimeRoles, PORTAL_ROLE],
    );
    expect(rows).toEqual([]);
  });

  it('every policy of a runtime role on a site table checks the site list in each expression', async () => {
    // The stored company (migration 0004) only narrows; the site list is what grants. A policy of
    // the portal or workflow role without it would let the company alone decide.
    const { rows } = await f.adminPool.query<{ policy: string; qual: string | null; check: string | null }>(
      `SELECT p.tablename || '.' || p.policyname AS policy, p.qual, p.with_check AS check
       FROM pg_policies p
       WHERE p.schemaname = 'enterprise' AND (p.roles && $1::name[] OR 'public' = ANY (p.roles))
         AND p.tablename NOT IN ('companies', 'principals')`,
      [runtimeRoles],
    );
    // 0010 added the workflow's two on its own planned uploads (start, abandon); 0016 its gates.
    expect(rows).toHaveLength(23);
    const missing = rows.flatMap((r) =>
      [r.qual, r.check]
        .filter((e): e is string => e !== null && !e.includes('enterprise_api.authorized_site_ids()'))
        .map((e) => `${r.policy}: ${e}`),
    );
    expect(missing).toEqual([]);
  });

  it('the tables without sites (companies, principals) are decided by the access function, never the stored company', async () => {
    // No site list backs the company up there, so a forged enterprise.company_hint would name another
    // company's rows (design §4.2).
    const { rows } = await f.adminPool.query<{ policy: string; qual: string | null; check: string | null }>(
      `SELECT p.tablename || '.' || p.policyname AS policy, p.qual, p.with_check AS check
       FROM pg_policies p
       WHERE p.schemaname = 'enterprise' AND (p.roles && $1::name[] OR 'public' = ANY (p.roles))
         AND p.tablename IN ('companies', 'principals')`,
      [runtimeRoles],
    );
    expect(rows.map((r) => r.policy).sort()).toEqual([
      'companies.portal_reads_own_company',
      'principals.portal_reads_own_company_names',
    ]);
    for (const r of rows) {
      expect(r.check).toBeNull();
      expect(r.qual).toMatch(
        /^\(\w+ = \( SELECT enterprise_api\.authorized_company_id\(\) AS authorized_company_id\)\)$/,
      );
    }
  });

  it('every SECURITY DEFINER function has a fixed search_path and a non-runtime owner', async () => {
    const { rows } = await f.adminPool.query<{ fn: string; config: string[] | null; owner: string }>(
      `SELECT p.oid::regprocedure::text AS fn, p.proconfig AS config, pg_get_userbyid(p.proowner) AS owner
       FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
       WHERE n.nspname IN ('enterprise', 'enterprise_api', 'postgrest') AND p.prosecdef`,
    );
    expect(rows.length).toBeGreaterThanOrEqual(5);
    for (const r of rows) {
      expect((r.config ?? []).some((c) => c.startsWith('search_path=pg_catalog'))).toBe(true);
      expect(runtimeRoles).not.toContain(r.owner);
    }
  });
});

describe('runtime logins cannot weaken security', () => {
  const attacks = [
    'ALTER TABLE enterprise.work_items DISABLE ROW LEVEL SECURITY',
    'ALTER TABLE enterprise.work_items NO FORCE ROW LEVEL SECURITY',
    'DROP POLICY portal_reads_work_items ON enterprise.work_items',
    'CREATE POLICY open_all ON enterprise.work_items USING (true)',
    'DROP TABLE enterprise.work_items',
    'DROP VIEW enterprise_api.work_items',
    'TRUNCATE enterprise.work_items',
    'ALTER VIEW enterprise_api.work_items SET (security_invoker = false)',
    "CREATE OR REPLACE FUNCTION enterprise_api.authorized_site_ids() RETURNS uuid[] LANGUAGE sql AS 'SELECT array_agg(id) FROM enterprise.sites'",
    "CREATE OR REPLACE FUNCTION enterprise.remember_caller_company() RETURNS void LANGUAGE sql AS 'SELECT'",
    'CREATE TABLE enterprise.evil (id int)',
    'CREATE VIEW enterprise_api.evil AS SELECT 1',
    'GRANT SELECT ON enterprise.principals TO enterprise_portal_role',
    'ALTER ROLE enterprise_portal_role BYPASSRLS',
  ];

  async function asLogin(url: string, role: string | undefined, statement: string): Promise<string> {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      if (role !== undefined) await client.query(`SET ROLE ${role}`);
      return await sqlState(client.query(statement));
    } finally {
      await client.end();
    }
  }

  it.each(attacks)('enterprise_api_login: %s is refused', async (statement) => {
    expect(await asLogin(f.apiUrl, undefined, statement)).toBe('42501');
  });

  it.each(attacks)('authenticator as enterprise_portal_role: %s is refused', async (statement) => {
    const url = f.authenticator.options.connectionString!;
    expect(await asLogin(url, PORTAL_ROLE, statement)).toBe('42501');
  });

  it('row_security = off makes a runtime login fail instead of reading around the policies', async () => {
    const client = new pg.Client({ connectionString: f.apiUrl });
    await client.connect();
    try {
      await client.query('SET row_security = off');
      expect(await sqlState(client.query('SELECT count(*) FROM enterprise.work_items'))).toBe('42501');
    } finally {
      await client.end();
    }
  });
});

describe('access functions', () => {
  /** Both functions' answers for the given raw `request.jwt.claims` text, as the superuser sees them. */
  async function accessFor(claims: string | null): Promise<{ company: string | null; sites: string[] }> {
    const client = await f.adminPool.connect();
    try {
      await client.query('BEGIN');
      if (claims !== null) await client.query(`SELECT set_config('request.jwt.claims', $1, true)`, [claims]);
      const { rows } = await client.query<{ company: string | null; sites: string[] }>(
        'SELECT enterprise_api.authorized_company_id() AS company, enterprise_api.authorized_site_ids()::text[] AS sites',
      );
      return rows[0]!;
    } finally {
      await client.query('ROLLBACK');
      client.release();
    }
  }

  /** What the access map says, computed without the functions: the truth they must match. */
  async function mapSays(sub: string): Promise<{ company: string | null; sites: string[] }> {
    const { rows } = await f.adminPool.query<{ company: string | null; sites: string[] }>(
      `SELECT (SELECT company_id FROM enterprise.principals WHERE sub = $1 AND active) AS company,
              coalesce((SELECT array_agg(s.id ORDER BY s.id)::text[]
                        FROM enterprise.principals p JOIN enterprise.sites s ON s.company_id = p.company_id
                        WHERE p.sub = $1 AND p.active AND (p.all_sites OR EXISTS (
                          SELECT 1 FROM enterprise.principal_sites ps WHERE ps.sub = p.sub AND ps.site_id = s.id))),
                       '{}') AS sites`,
      [sub],
    );
    return rows[0]!;
  }

  beforeAll(async () => {
    // Two shapes the demo users lack: a principal switched off, and one limited to no site at all.
    await f.adminPool.query(
      `
      INSERT INTO enterprise.principals (sub, company_id, all_sites, active)
      SELECT 'switched-off', company_id, true, false FROM enterprise.principals WHERE sub = $1
      UNION ALL
      SELECT 'no-sites-yet', company_id, false, true FROM enterprise.principals WHERE sub = $1`,
      [demoUserSubs.alice],
    );
  });

  /** What each principal's map must look like, so a test against a wrong truth cannot pass either. */
  const shapes: Array<[string, string, (truth: { company: string | null; sites: string[] }) => boolean]> = [
    ['alice (whole company)', demoUserSubs.alice, (t) => t.company !== null && t.sites.length > 1],
    ['bob (one site)', demoUserSubs.bob, (t) => t.company !== null && t.sites.length === 1],
    ['carol (other company)', demoUserSubs.carol, (t) => t.company !== null && t.sites.length > 1],
    ['dave (no principal)', demoUserSubs.dave, (t) => t.company === null && t.sites.length === 0],
    ['switched off', 'switched-off', (t) => t.company === null && t.sites.length === 0],
    ['limited to no site', 'no-sites-yet', (t) => t.company !== null && t.sites.length === 0],
  ];

  it.each(shapes)('%s: the company and the sorted site ids of the access map', async (_name, sub, shape) => {
    const truth = await mapSays(sub);
    expect(shape(truth)).toBe(true);
    expect(await accessFor(JSON.stringify({ sub, role: PORTAL_ROLE }))).toEqual(truth);
  });

  it('no access without claims, with an empty or missing sub, or a sub nobody has', async () => {
    for (const claims of [null, '', '{}', '{"sub":""}', '{"sub":null}', '{"sub":"nobody"}']) {
      expect(await accessFor(claims)).toEqual({ company: null, sites: [] });
    }
  });

  it('reads the last of duplicate "sub" keys, as jsonb would, and refuses malformed claims', async () => {
    const bob = await mapSays(demoUserSubs.bob);
    expect(await accessFor(`{"sub":"${demoUserSubs.alice}","sub":"${demoUserSubs.bob}"}`)).toEqual(bob);
    await expect(accessFor('{"sub":')).rejects.toThrow(/invalid input syntax for type json/);
  });
});
