// The read surface as PostgREST serves it (design §4.3): every view x every demo user sees exactly
// the rows of their sites; anonymous and badly issued tokens are refused; writes are denied.
import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import {
  demoAccess,
  demoCompanies,
  demoRowId,
  demoSites,
  demoUserSubs,
  PORTAL_ANON,
  PORTAL_ROLE,
  withRequestClaims,
} from '@platform/enterprise-db';
import { withPostgrestRequest } from '@platform/testkit';
import type { DemoSiteName, DemoUser } from '@platform/enterprise-db';
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
  { view: 'work_item_decisions', table: 'work_item_decisions', siteColumn: 'site_id' },
] as const;
/** Views over a join, which PostgreSQL refuses to write to before it checks privileges. */
// work_items and media_items join the person they name (migration 0008, design §4.2).
const joinViews: ReadonlySet<string> = new Set(['sites', 'work_item_decisions', 'work_items', 'media_items']);
const users: DemoUser[] = ['alice', 'bob', 'carol', 'dave'];

let f: Fixture;
beforeAll(async () => {
  f = await setUp();
  // Decision history beyond the seed's (one decision per decided demo item, by the company's admin),
  // made through the workflow's write path: several deciders per company, an item decided twice.
  await decide('bob', 'acmeHq', 1, 'defer');
  await decide('alice', 'acmeHq', 1, 'accept');
  await decide('alice', 'acmeLab', 2, 'decline');
  await decide('carol', 'borealisTower', 1, 'decline');
});
afterAll(async () => {
  await f.close();
});

const newState = { accept: 'accepted', defer: 'deferred', decline: 'declined' } as const;

/**
 * A decision as the workflow records it (design §4.4): the item's change and its audit row in one
 * statement, in a transaction of the workflow's login with the caller's claims.
 */
async function decide(
  user: DemoUser | { sub: string },
  site: DemoSiteName,
  n: number,
  decision: keyof typeof newState,
): Promise<void> {
  const claims = typeof user === 'string' ? { sub: demoUserSubs[user] } : user;
  const decided = await withRequestClaims(f.api, claims, async (trx) => {
    const r = await sql`
      WITH decided AS (
        UPDATE enterprise.work_items
        SET state = ${newState[decision]}, decided_at = now(), decided_by = ${claims.sub},
            defer_until = CASE WHEN ${decision} = 'defer' THEN now() + interval '90 days' END,
            decision_note = ${`${decision}: ${site} #${n}`}, updated_at = now()
        WHERE id = ${demoRowId('work_item', site, n)}::uuid AND state IN ('proposed', 'deferred')
        RETURNING new.id, new.site_id, new.state, new.defer_until, new.decided_at, new.decided_by,
          new.decision_note, old.state AS previous_state
      )
      INSERT INTO enterprise.work_item_decisions (work_item_id, site_id, decision, previous_state, new_state,
        note, defer_until, decided_by, decided_at, request_id)
      SELECT id, site_id, ${decision}, previous_state, state, decision_note, defer_until, decided_by,
        decided_at, ${`test-${randomUUID()}`}
      FROM decided`.execute(trx);
    return Number(r.numAffectedRows);
  });
  expect(decided).toBe(1);
}

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
        INSERT: `INSERT INTO enterprise_api.${view} DEFAULT VALUES`,
        UPDATE: `UPDATE enterprise_api.${view} SET id = id`,
        DELETE: `DELETE FROM enterprise_api.${view}`,
      }[verb]!;
      const code = await sqlState(
        withPostgrestRequest(f.authenticator, { claims: claimsOf('alice'), method: 'POST' }, (c) =>
          c.query(statement),
        ),
      );
      // The views over a join (sites and companies, rows and the people they name) PostgreSQL refuses as not
      // updatable (55000) before it checks privileges; the single-table views are updatable in
      // principle and refused for lack of privileges (42501).
      expect(code).toBe(joinViews.has(view) ? '55000' : '42501');
    },
  );

  it('grants the portal role SELECT and nothing else, the anonymous role nothing', async () => {
    const { rows } = await f.adminPool.query<{ role: string; privilege: string }>(
      `SELECT r.role, p.privilege FROM unnest($1::text[]) AS r(role)
       CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p(privilege)
       WHERE has_table_privilege(r.role, $2::regclass, p.privilege)`,
      [[PORTAL_ROLE, PORTAL_ANON], `enterprise_api.${view}`],
    );
    expect(rows).toEqual([{ role: PORTAL_ROLE, privilege: 'SELECT' }]);
  });
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

describe('decision history (enterprise_api.work_item_decisions)', () => {
  interface HistoryRow {
    id: string;
    work_item_id: string;
    site_id: string;
    company_id: string;
    decision: string;
    previous_state: string;
    new_state: string;
    note: string | null;
    decided_at: Date;
    decided_by: string | null;
    decided_by_name: string | null;
  }

  async function history(user: DemoUser, workItemId?: string): Promise<HistoryRow[]> {
    return withPostgrestRequest(
      f.authenticator,
      { claims: claimsOf(user), path: '/work_item_decisions' },
      async (c) => {
        const { rows } = await c.query<HistoryRow>(
          `SELECT * FROM enterprise_api.work_item_decisions
           WHERE $1::uuid IS NULL OR work_item_id = $1::uuid ORDER BY decided_at, id`,
          [workItemId ?? null],
        );
        return rows;
      },
    );
  }

  const who = (rows: HistoryRow[]) =>
    rows.map((r) => [r.decision, r.previous_state, r.new_state, r.decided_by, r.decided_by_name]);

  it('shows every user of the site who decided what and when, by display name', async () => {
    const item = demoRowId('work_item', 'acmeHq', 1);
    const expected = [
      ['defer', 'proposed', 'deferred', demoUserSubs.bob, 'Bob Baker'],
      ['accept', 'deferred', 'accepted', demoUserSubs.alice, 'Alice Archer'],
    ];
    for (const user of ['alice', 'bob'] as const) {
      const rows = await history(user, item);
      expect(who(rows)).toEqual(expected);
      expect(rows.map((r) => [r.work_item_id, r.site_id, r.note])).toEqual([
        [item, demoSites.acmeHq.id, 'defer: acmeHq #1'],
        [item, demoSites.acmeHq.id, 'accept: acmeHq #1'],
      ]);
      expect(rows[0]!.decided_at).toBeInstanceOf(Date);
      expect(rows[0]!.decided_at.getTime()).toBeLessThanOrEqual(rows[1]!.decided_at.getTime());
    }
    expect(await history('carol', item)).toEqual([]);
    expect(await history('dave', item)).toEqual([]);
    expect(who(await history('carol', demoRowId('work_item', 'borealisTower', 1)))).toEqual([
      ['decline', 'proposed', 'declined', demoUserSubs.carol, 'Carol Chen'],
    ]);
    // The seed's decisions carry their deciders' names too.
    const seeded = await history('alice', demoRowId('work_item', 'acmeWarehouse', 4));
    expect(who(seeded)).toEqual([['accept', 'proposed', 'accepted', demoUserSubs.alice, 'Alice Archer']]);
  });

  it('does not show request ids (server log correlation)', async () => {
    const columns = await withPostgrestRequest(f.authenticator, { claims: claimsOf('alice') }, async (c) => {
      const r = await c.query('SELECT * FROM enterprise_api.work_item_decisions LIMIT 1');
      return r.fields.map((x) => x.name);
    });
    expect(columns).not.toContain('request_id');
    expect(columns).toEqual(expect.arrayContaining(['decided_by', 'decided_by_name', 'decided_at']));
  });

  it('never reveals a decider of another company to a caller, by name or by id', async () => {
    // Erin decides at an Acme site, then moves to Borealis; an imported audit row names carol at Acme HQ.
    const erin = { sub: '0b0a11ce-0000-4000-8000-0000000e0100', name: 'Erin Moved' };
    await f.adminPool.query(
      `INSERT INTO enterprise.principals (sub, company_id, all_sites, display_name) VALUES ($1, $2, true, $3)`,
      [erin.sub, demoCompanies.acme.id, erin.name],
    );
    const item = demoRowId('work_item', 'acmeWarehouse', 1);
    await decide({ sub: erin.sub }, 'acmeWarehouse', 1, 'accept');
    // While she is Acme's, Acme sees her name: the view does join the names.
    expect(who(await history('alice', item))).toEqual([
      ['accept', 'proposed', 'accepted', erin.sub, erin.name],
    ]);
    await f.adminPool.query(`UPDATE enterprise.principals SET company_id = $2 WHERE sub = $1`, [
      erin.sub,
      demoCompanies.borealis.id,
    ]);
    await f.adminPool.query(
      `INSERT INTO enterprise.work_item_decisions (work_item_id, site_id, decision, previous_state, new_state,
         decided_by, request_id)
       VALUES ($1, $2, 'defer', 'proposed', 'deferred', $3, 'imported-1')`,
      [demoRowId('work_item', 'acmeHq', 2), demoSites.acmeHq.id, demoUserSubs.carol],
    );

    // Acme's history keeps the rows, without the decider.
    expect(who(await history('alice', item))).toEqual([['accept', 'proposed', 'accepted', null, null]]);
    const imported = await history('bob', demoRowId('work_item', 'acmeHq', 2));
    expect(who(imported)).toEqual([['defer', 'proposed', 'deferred', null, null]]);
    const foreign = [erin.sub, erin.name, demoUserSubs.carol, 'Carol Chen'];
    for (const user of ['alice', 'bob'] as const) {
      const everything = JSON.stringify(await history(user));
      for (const text of foreign) expect(everything).not.toContain(text);
    }
    // Borealis, where both deciders now are, sees none of Acme's rows.
    for (const row of await history('carol')) expect(row.company_id).toBe(demoCompanies.borealis.id);

    // A forged stored company narrows the view to nothing and names nobody of that company.
    const forged = await withPostgrestRequest(f.authenticator, { claims: claimsOf('alice') }, async (c) => {
      await c.query(`SELECT set_config('enterprise.company_hint', $1, true)`, [demoCompanies.borealis.id]);
      const names = await c.query<{ sub: string }>('SELECT sub FROM enterprise.principals');
      const rows = await c.query('SELECT * FROM enterprise_api.work_item_decisions');
      return { subs: names.rows.map((r) => r.sub).sort(), rows: rows.rows };
    });
    expect(forged.subs).toEqual([demoUserSubs.alice, demoUserSubs.bob].sort());
    expect(forged.rows).toEqual([]);
  });

  it('one rule for every view that names a person: work_items.decided_by and media_items.uploaded_by as the history', async () => {
    // Frank decides and uploads at Acme HQ, then leaves Acme (moved to Borealis; then removed altogether).
    const frank = { sub: '0b0a11ce-0000-4000-8000-0000000f0200', name: 'Frank Left' };
    await f.adminPool.query(
      `INSERT INTO enterprise.principals (sub, company_id, all_sites, display_name) VALUES ($1, $2, true, $3)`,
      [frank.sub, demoCompanies.acme.id, frank.name],
    );
    const item = demoRowId('work_item', 'acmeHq', 3);
    await decide({ sub: frank.sub }, 'acmeHq', 3, 'decline');
    const media = await withRequestClaims(f.api, { sub: frank.sub }, async (trx) => {
      const r = await sql<{ id: string }>`
        INSERT INTO enterprise.media_items (site_id, object_key, filename, declared_content_type,
          declared_size_bytes, uploaded_by, upload_expires_at)
        VALUES (${demoSites.acmeHq.id}::uuid, ${`sites/${demoSites.acmeHq.id}/media/${randomUUID()}.jpg`},
          'frank.jpg', 'image/jpeg', 10, ${frank.sub}, now() + interval '15 minutes')
        RETURNING id`.execute(trx);
      return r.rows[0]!.id;
    });
    const named = async (user: DemoUser) =>
      withPostgrestRequest(f.authenticator, { claims: claimsOf(user) }, async (c) => {
        const w = await c.query<{ decided_by: string | null }>(
          'SELECT decided_by FROM enterprise_api.work_items WHERE id = $1',
          [item],
        );
        const m = await c.query<{ uploaded_by: string | null }>(
          'SELECT uploaded_by FROM enterprise_api.media_items WHERE id = $1',
          [media],
        );
        const h = await c.query<{ decided_by: string | null }>(
          'SELECT decided_by FROM enterprise_api.work_item_decisions WHERE work_item_id = $1',
          [item],
        );
        return {
          work_item: w.rows[0]?.decided_by,
          media_item: m.rows[0]?.uploaded_by,
          history: h.rows[0]?.decided_by,
        };
      });
    // While he is Acme's, every view names him.
    expect(await named('bob')).toEqual({ work_item: frank.sub, media_item: frank.sub, history: frank.sub });

    await f.adminPool.query(`UPDATE enterprise.principals SET company_id = $2 WHERE sub = $1`, [
      frank.sub,
      demoCompanies.borealis.id,
    ]);
    expect(await named('bob')).toEqual({ work_item: null, media_item: null, history: null });
    await f.adminPool.query(`DELETE FROM enterprise.principals WHERE sub = $1`, [frank.sub]);
    expect(await named('alice')).toEqual({ work_item: null, media_item: null, history: null });
    // The rows themselves stay, and the base tables keep who it was (for the audit and the workflow).
    const { rows } = await f.adminPool.query<{ decided_by: string }>(
      'SELECT decided_by FROM enterprise.work_items WHERE id = $1',
      [item],
    );
    expect(rows[0]?.decided_by).toBe(frank.sub);
  });

  it("portal users read only their own company's names, and nothing else of the access map", async () => {
    const subs = await withPostgrestRequest(f.authenticator, { claims: claimsOf('carol') }, async (c) => {
      const r = await c.query<{ sub: string }>(
        'SELECT sub, company_id, display_name FROM enterprise.principals',
      );
      return r.rows.map((x) => x.sub);
    });
    expect(subs).not.toContain(demoUserSubs.alice);
    expect(subs).toContain(demoUserSubs.carol);
    for (const column of ['all_sites', 'active', 'created_at']) {
      expect(
        await sqlState(
          withPostgrestRequest(f.authenticator, { claims: claimsOf('carol') }, (c) =>
            c.query(`SELECT ${column} FROM enterprise.principals`),
          ),
        ),
      ).toBe('42501');
    }
    expect(
      await sqlState(
        withPostgrestRequest(f.authenticator, { claims: claimsOf('alice') }, (c) =>
          c.query('SELECT request_id FROM enterprise.work_item_decisions'),
        ),
      ),
    ).toBe('42501');
  });
});
