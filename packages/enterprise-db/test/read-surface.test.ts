// The read surface as PostgREST serves it (design §4.3): every view x every demo user sees exactly
// the rows of their sites; anonymous and badly issued tokens are refused; writes are denied.
import { demoAccess, demoSites, demoUserSubs, PORTAL_ANON, PORTAL_ROLE } from '@platform/enterprise-db';
import { withPostgrestRequest } from '@platform/testkit';
import type { DemoUser } from '@platform/enterprise-db';
import { claimsOf, setUp, sqlState } from './helpers.js';
import type { Fixture } from './helpers.js';

const views = [
  { view: 'sites', table: 'sites', siteColumn: 'id' },
  { view: 'assets', table: 'assets', siteColumn: 'site_id' },
  { view: 'maintenance_schedules', table: 'maintenance_schedules', siteColumn: 'site_id' },
  { view: 'walkthrough_logs', table: 'walkthrough_logs', siteColumn: 'site_id' },
  { view: 'work_items', table: 'work_items', siteColumn: 'site_id' },
  { view: 'service_records', table: 'service_records', siteColumn: 'site_id' },
  { view: 'media_items', table: 'media_items', siteColumn: 'site_id' },
] as const;
const users: DemoUser[] = ['alice', 'bob', 'carol', 'dave'];

let f: Fixture;
beforeAll(async () => {
  f = await setUp();
});
afterAll(async () => {
  await f.close();
});

async function viewIds(user: DemoUser, view: string): Promise<string[]> {
  return withPostgrestRequest(f.authenticator, { claims: claimsOf(user), path: `/${view}` }, async (c) => {
    const { rows } = await c.query<{ id: string }>(`SELECT id FROM enterprise_api.${view}`);
    return rows.map((r) => r.id).sort();
  });
}

describe.each(views)('view enterprise_api.$view', ({ view, table, siteColumn }) => {
  it.each(users)('shows %s exactly the rows of their sites', async (user) => {
    const siteIds = demoAccess[user].map((s) => demoSites[s].id);
    const { rows } = await f.adminPool.query<{ id: string }>(
      `SELECT id FROM enterprise.${table} WHERE ${siteColumn} = ANY ($1::uuid[]) ORDER BY id`,
      [siteIds],
    );
    const expected = rows.map((r) => r.id).sort();
    // The seed gives every demo site rows in every table, so only dave's expectation is empty.
    expect(expected.length === 0).toBe(user === 'dave');
    expect(await viewIds(user, view)).toEqual(expected);
  });

  it('refuses the anonymous role with SQLSTATE 42501 (PostgREST: 401)', async () => {
    // Without a token PostgREST becomes the anonymous role; the pre-request call already fails ...
    expect(
      await sqlState(withPostgrestRequest(f.authenticator, { claims: null }, () => Promise.resolve())),
    ).toBe('42501');
    // ... and so does the view itself.
    const code = await sqlState(
      withPostgrestRequest(f.authenticator, { claims: null, preRequest: null }, (c) =>
        c.query(`SELECT * FROM enterprise_api.${view} LIMIT 1`),
      ),
    );
    expect(code).toBe('42501');
  });

  it.each(['INSERT', 'UPDATE', 'DELETE'])(
    'denies %s through the view, even for a user of the site',
    async (verb) => {
      const statement = {
        INSERT: `INSERT INTO enterprise_api.${view} (id) VALUES (gen_random_uuid())`,
        UPDATE: `UPDATE enterprise_api.${view} SET id = id`,
        DELETE: `DELETE FROM enterprise_api.${view}`,
      }[verb]!;
      const code = await sqlState(
        withPostgrestRequest(f.authenticator, { claims: claimsOf('alice'), method: 'POST' }, (c) =>
          c.query(statement),
        ),
      );
      // The sites view joins companies, so PostgreSQL refuses it as not updatable (55000) before it
      // checks privileges; the single-table views are updatable in principle and refused for lack of
      // privileges (42501).
      expect(code).toBe(view === 'sites' ? '55000' : '42501');
    },
  );
});

describe('db-pre-request (postgrest.pre_request)', () => {
  async function refusal(
    claims: Record<string, unknown>,
  ): Promise<{ code: string; status: number; message: string }> {
    try {
      await withPostgrestRequest(f.authenticator, { claims }, () => Promise.resolve());
    } catch (err) {
      const e = err as { code: string; detail: string; message: string };
      const detail = JSON.parse(e.detail) as { status: number; headers: Record<string, string> };
      expect(detail.headers['WWW-Authenticate']).toMatch(/^Bearer error="invalid_token"/);
      const message = JSON.parse(e.message) as { code: string; message: string };
      return { code: e.code, status: detail.status, message: message.message };
    }
    throw new Error('expected the request to be refused');
  }

  it('lets a token of the configured realm and client through', async () => {
    expect(await viewIds('alice', 'sites')).toHaveLength(3);
  });

  it('refuses a token of another issuer with 401', async () => {
    expect(await refusal(claimsOf('alice', { iss: 'http://localhost:8180/realms/other' }))).toEqual({
      code: 'PGRST',
      status: 401,
      message: 'token issuer is not accepted',
    });
  });

  it('refuses a token without iss', async () => {
    const claims = claimsOf('alice');
    delete claims.iss;
    expect((await refusal(claims)).status).toBe(401);
  });

  it('refuses a token issued to another client (azp) with 401', async () => {
    expect(await refusal(claimsOf('alice', { azp: 'some-other-client' }))).toEqual({
      code: 'PGRST',
      status: 401,
      message: 'token was not issued to this client',
    });
  });

  it('refuses a token without sub', async () => {
    const claims = claimsOf('alice');
    delete claims.sub;
    expect((await refusal(claims)).message).toBe('token has no subject');
    expect((await refusal({ ...claimsOf('alice'), sub: '' })).message).toBe('token has no subject');
  });
});

describe('claims that are not an access grant', () => {
  it.each(views)('forged tenant claims give no rows of another company ($view)', async ({ view }) => {
    // dave is signed in and mapped to nothing; claims naming Borealis' company or sites change nothing,
    // because access is data keyed by sub, never token content.
    const forged = claimsOf('dave', {
      company_id: demoSites.borealisTower.companyId,
      site_ids: [demoSites.borealisTower.id],
      site_id: demoSites.borealisTower.id,
      realm_access: { roles: ['admin'] },
    });
    const rows = await withPostgrestRequest(f.authenticator, { claims: forged }, async (c) => {
      const r = await c.query<{ id: string }>(`SELECT id FROM enterprise_api.${view}`);
      return r.rows;
    });
    expect(rows).toEqual([]);
  });

  it('an unknown sub sees nothing', async () => {
    const rows = await withPostgrestRequest(
      f.authenticator,
      { claims: claimsOf('alice', { sub: '11111111-2222-4333-8444-555555555555' }) },
      async (c) => (await c.query<{ id: string }>('SELECT id FROM enterprise_api.work_items')).rows,
    );
    expect(rows).toEqual([]);
  });

  it("bob's claims with alice's role claim still see only bob's site", async () => {
    const sites = await withPostgrestRequest(
      f.authenticator,
      { claims: claimsOf('bob', { preferred_username: 'alice', email: 'alice@example.com' }) },
      async (c) =>
        (await c.query<{ id: string }>('SELECT id FROM enterprise_api.sites')).rows.map((r) => r.id),
    );
    expect(sites).toEqual([demoSites.acmeHq.id]);
  });

  it('the authenticator cannot become any other role', async () => {
    for (const role of ['enterprise_api_role', 'enterprise_authz', 'enterprise_media_ingest', 'postgres']) {
      expect(
        await sqlState(
          withPostgrestRequest(f.authenticator, { role, claims: claimsOf('alice'), preRequest: null }, () =>
            Promise.resolve(),
          ),
        ),
      ).toBe('42501');
    }
  });

  it('the authenticator itself (no SET ROLE) reads nothing: NOINHERIT', async () => {
    const client = await f.authenticator.connect();
    try {
      expect(await sqlState(client.query('SELECT * FROM enterprise_api.work_items LIMIT 1'))).toBe('42501');
      expect(await sqlState(client.query('SELECT * FROM enterprise.work_items LIMIT 1'))).toBe('42501');
    } finally {
      client.release();
    }
  });

  it('portal users cannot read the access map, settings or object keys', async () => {
    for (const statement of [
      'SELECT * FROM enterprise.principals',
      'SELECT * FROM enterprise.principal_sites',
      'SELECT * FROM enterprise.postgrest_settings',
      'SELECT object_key FROM enterprise.media_items',
      'SELECT * FROM enterprise.work_item_decisions',
    ]) {
      expect(
        await sqlState(
          withPostgrestRequest(f.authenticator, { claims: claimsOf('alice') }, (c) => c.query(statement)),
        ),
      ).toBe('42501');
    }
  });

  it('media_items view hides storage keys and checksums', async () => {
    const columns = await withPostgrestRequest(f.authenticator, { claims: claimsOf('alice') }, async (c) => {
      const r = await c.query('SELECT * FROM enterprise_api.media_items LIMIT 1');
      return r.fields.map((x) => x.name);
    });
    expect(columns).not.toContain('object_key');
    expect(columns).not.toContain('etag');
    expect(columns).not.toContain('declared_checksum_sha256');
  });

  it('the role PostgREST uses is the role claim', async () => {
    const who = await withPostgrestRequest(f.authenticator, { claims: claimsOf('carol') }, async (c) => {
      const r = await c.query<{ current_user: string }>('SELECT current_user');
      return r.rows[0]!.current_user;
    });
    expect(who).toBe(PORTAL_ROLE);
    expect(demoUserSubs.carol).toMatch(/^[0-9a-f-]{36}$/);
    expect(PORTAL_ANON).toBe('enterprise_portal_anon');
  });
});
