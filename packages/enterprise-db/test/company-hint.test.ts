// Migration 0004: the caller's company is looked up once per request and stored in a setting that
// any session may change, so these tests prove what the migration's header argues: the stored value
// only ever takes rows away, for reads through PostgREST and for the workflow's writes; without it
// the answers are the same; and a caller with no company makes no access lookup per statement.
import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import type { Kysely } from 'kysely';
import {
  demoRowId,
  demoSites,
  demoUserSubs,
  enterpriseMigrations,
  withRequestClaims,
} from '@platform/enterprise-db';
import type { DemoUser, EnterpriseDatabase } from '@platform/enterprise-db';
import { withPostgrestRequest } from '@platform/testkit';
import type { PostgrestRequestOptions } from '@platform/testkit';
import { claimsOf, setUp, sqlState } from './helpers.js';
import type { Fixture } from './helpers.js';

const NO_COMPANY = '00000000-0000-0000-0000-000000000000';
const views = [
  'sites',
  'assets',
  'maintenance_schedules',
  'walkthrough_logs',
  'work_items',
  'service_records',
  'media_items',
] as const;

let f: Fixture;
let api: Kysely<EnterpriseDatabase>;
const companyOf = {} as Record<DemoUser, string | null>;
beforeAll(async () => {
  f = await setUp();
  api = f.api as unknown as Kysely<EnterpriseDatabase>;
  for (const user of Object.keys(demoUserSubs) as DemoUser[]) {
    const { rows } = await f.adminPool.query<{ company_id: string }>(
      'SELECT company_id FROM enterprise.principals WHERE sub = $1 AND active',
      [demoUserSubs[user]],
    );
    companyOf[user] = rows[0]?.company_id ?? null;
  }
});
afterAll(async () => {
  await f.close();
});

/** Sorted ids of `view` for `user` under PostgREST's protocol; `forge` runs first inside the request. */
async function idsOf(
  user: DemoUser,
  view: string,
  forge: string | null = null,
  options: Partial<PostgrestRequestOptions> = {},
): Promise<string[]> {
  return withPostgrestRequest(f.authenticator, { claims: claimsOf(user), ...options }, async (c) => {
    if (forge !== null) await c.query(`SELECT set_config('enterprise.company_hint', $1, true)`, [forge]);
    const { rows } = await c.query<{ id: string }>(`SELECT id FROM enterprise_api.${view} ORDER BY id`);
    return rows.map((r) => r.id);
  });
}

/** As idsOf without a pre-request, on a new connection where the setting was never defined. */
async function idsOnFreshConnection(
  user: DemoUser,
  view: string,
): Promise<{ setting: string | null; ids: string[] }> {
  const pool = new pg.Pool({ connectionString: f.authenticator.options.connectionString, max: 1 });
  try {
    return await withPostgrestRequest(pool, { claims: claimsOf(user), preRequest: null }, async (c) => {
      const { rows: setting } = await c.query<{ v: string | null }>(
        `SELECT current_setting('enterprise.company_hint', true) AS v`,
      );
      const { rows } = await c.query<{ id: string }>(`SELECT id FROM enterprise_api.${view} ORDER BY id`);
      return { setting: setting[0]?.v ?? null, ids: rows.map((r) => r.id) };
    });
  } finally {
    await pool.end();
  }
}

describe('the stored company', () => {
  it.each(['alice', 'bob', 'carol'] as const)(
    'postgrest.pre_request() stores the company of %s for the request',
    async (user) => {
      const stored = await withPostgrestRequest(f.authenticator, { claims: claimsOf(user) }, async (c) => {
        const { rows } = await c.query<{ v: string }>(
          `SELECT current_setting('enterprise.company_hint', true) AS v`,
        );
        return rows[0]?.v;
      });
      expect(companyOf[user]).not.toBeNull();
      expect(stored).toBe(companyOf[user]);
    },
  );

  it('a caller without a company gets the nil uuid, and it ends with the transaction', async () => {
    const client = await f.authenticator.connect();
    try {
      await client.query('BEGIN');
      await client.query(`SET LOCAL ROLE enterprise_portal_role`);
      await client.query(`SELECT set_config('request.jwt.claims', $1, true)`, [
        JSON.stringify(claimsOf('dave')),
      ]);
      await client.query('SELECT postgrest.pre_request()');
      const inside = await client.query<{ v: string }>(
        `SELECT current_setting('enterprise.company_hint', true) AS v`,
      );
      await client.query('COMMIT');
      const after = await client.query<{ v: string | null }>(
        `SELECT current_setting('enterprise.company_hint', true) AS v`,
      );
      expect(inside.rows[0]?.v).toBe(NO_COMPANY);
      expect(after.rows[0]?.v ?? '').toBe('');
    } finally {
      client.release();
    }
  });

  it('withRequestClaims stores it for the workflow transaction', async () => {
    for (const user of ['bob', 'dave'] as const) {
      const stored = await withRequestClaims(api, claimsOf(user) as { sub: string }, async (trx) => {
        const { rows } = await sql<{
          v: string;
        }>`SELECT current_setting('enterprise.company_hint', true) AS v`.execute(trx);
        return rows[0]?.v;
      });
      expect(stored).toBe(companyOf[user] ?? NO_COMPANY);
    }
  });
});

describe('a forged company only takes rows away', () => {
  it.each(views)(
    '%s: bob sees his rows without the stored value, and no others with any forged one',
    async (view) => {
      const own = await idsOf('bob', view);
      expect(own.length).toBeGreaterThan(0);
      // Nothing stored: the definer lookups answer, with the same rows. An empty value ('' once the
      // setting has existed in the session) and an undefined one (NULL) are both "nothing".
      expect(await idsOf('bob', view, '', { preRequest: null })).toEqual(own);
      expect(await idsOnFreshConnection('bob', view)).toEqual({ setting: null, ids: own });
      // Alice's company is bob's: still only bob's site, not all of Acme.
      expect(await idsOf('bob', view, companyOf.alice)).toEqual(own);
      expect(await idsOf('bob', view, companyOf.carol)).toEqual([]);
      expect(await idsOf('bob', view, NO_COMPANY)).toEqual([]);
      // dave has no sites: no company he names gives him any.
      expect(await idsOf('dave', view, companyOf.alice)).toEqual([]);
      expect(await idsOf('dave', view, companyOf.carol)).toEqual([]);
    },
  );

  it('a value that is not a uuid fails the request (22P02) instead of widening it', async () => {
    expect(await sqlState(idsOf('bob', 'work_items', 'not-a-uuid'))).toBe('22P02');
  });

  it('the company alone never decides through it: the companies table shows the caller only its own', async () => {
    const names = await withPostgrestRequest(f.authenticator, { claims: claimsOf('bob') }, async (c) => {
      await c.query(`SELECT set_config('enterprise.company_hint', $1, true)`, [companyOf.carol]);
      const { rows } = await c.query<{ name: string }>('SELECT name FROM enterprise.companies');
      return rows.map((r) => r.name);
    });
    expect(names).toHaveLength(1);
    const { rows } = await f.adminPool.query<{ name: string }>(
      'SELECT name FROM enterprise.companies WHERE id = $1',
      [companyOf.bob],
    );
    expect(names).toEqual([rows[0]?.name]);
  });

  it("the workflow's writes: a forged company updates nothing, not even the caller's own rows", async () => {
    const updated = async (user: DemoUser, forge: string | null = null) =>
      withRequestClaims(api, claimsOf(user) as { sub: string }, async (trx) => {
        if (forge !== null)
          await sql`SELECT set_config('enterprise.company_hint', ${forge}, true)`.execute(trx);
        // Every proposed item of every company is tried; the policies decide which change.
        const r = await sql`UPDATE enterprise.work_items SET decision_note = decision_note
                            WHERE state = 'proposed'`.execute(trx);
        return Number(r.numAffectedRows);
      });
    const bobs = await updated('bob');
    expect(bobs).toBeGreaterThan(0);
    expect(await updated('alice')).toBeGreaterThan(bobs);
    expect(await updated('bob', companyOf.alice)).toBe(bobs);
    expect(await updated('bob', companyOf.carol)).toBe(0);
    expect(await updated('bob', NO_COMPANY)).toBe(0);
    expect(await updated('dave', companyOf.alice)).toBe(0);
  });
  /** bob's rows of each kind at `site`, as the workflow inserts them. */
  const bobRows = (site: { id: string }, siteName: 'acmeHq' | 'borealisTower') => ({
    'enterprise.media_items': {
      site_id: site.id,
      object_key: `sites/${site.id}/media/${randomUUID()}`,
      filename: 'x.jpg',
      declared_content_type: 'image/jpeg',
      declared_size_bytes: 10,
      uploaded_by: demoUserSubs.bob,
    },
    'enterprise.work_item_decisions': {
      work_item_id: demoRowId('work_item', siteName, 1),
      site_id: site.id,
      decision: 'defer',
      previous_state: 'proposed',
      new_state: 'deferred',
      decided_by: demoUserSubs.bob,
      request_id: `req-${randomUUID()}`,
    },
    'enterprise.decision_idempotency_keys': {
      caller_sub: demoUserSubs.bob,
      idempotency_key: `key-${randomUUID()}`,
      work_item_id: demoRowId('work_item', siteName, 1),
      site_id: site.id,
      request_fingerprint: 'f',
      response_status: 200,
      response_body: '{}',
    },
  });
  type Insertable = keyof ReturnType<typeof bobRows>;

  /** SQLSTATE of bob's insert into `table` at `site` with `forge` stored ('ok' and rolled back if it passes). */
  async function bobInserts(
    site: { id: string },
    forge: string | null,
    table: Insertable = 'enterprise.media_items',
  ): Promise<string> {
    const rolledBack = new Error('rolled back');
    const siteName = site.id === demoSites.acmeHq.id ? 'acmeHq' : 'borealisTower';
    const outcome = withRequestClaims(api, claimsOf('bob') as { sub: string }, async (trx) => {
      if (forge !== null)
        await sql`SELECT set_config('enterprise.company_hint', ${forge}, true)`.execute(trx);
      // Each row matches its own table; the union of the three is more than Kysely can check.
      await trx
        .insertInto(table)
        .values(bobRows(site, siteName)[table] as never)
        .execute();
      throw rolledBack;
    });
    try {
      await outcome;
      return 'committed';
    } catch (err) {
      return err === rolledBack ? 'ok' : String((err as { code?: unknown }).code);
    }
  }

  it.each([
    'enterprise.media_items',
    'enterprise.work_item_decisions',
    'enterprise.decision_idempotency_keys',
  ] as const)(
    "the workflow's inserts into %s: a forged company is refused (42501) at the caller's site and at another's",
    async (table) => {
      expect(await bobInserts(demoSites.acmeHq, null, table)).toBe('ok');
      expect(await bobInserts(demoSites.acmeHq, companyOf.alice, table)).toBe('ok');
      expect(await bobInserts(demoSites.acmeHq, companyOf.carol, table)).toBe('42501');
      expect(await bobInserts(demoSites.acmeHq, NO_COMPANY, table)).toBe('42501');
      expect(await bobInserts(demoSites.borealisTower, companyOf.carol, table)).toBe('42501');
      expect(await bobInserts(demoSites.borealisTower, null, table)).toBe('42501');
    },
  );

  it("the workflow's deletes of idempotency keys: a forged company deletes nothing", async () => {
    const row = bobRows(demoSites.acmeHq, 'acmeHq')['enterprise.decision_idempotency_keys'];
    await withRequestClaims(api, claimsOf('bob') as { sub: string }, (trx) =>
      trx.insertInto('enterprise.decision_idempotency_keys').values(row).execute(),
    );
    const deleted = async (forge: string | null) =>
      withRequestClaims(api, claimsOf('bob') as { sub: string }, async (trx) => {
        if (forge !== null)
          await sql`SELECT set_config('enterprise.company_hint', ${forge}, true)`.execute(trx);
        const r = await trx
          .deleteFrom('enterprise.decision_idempotency_keys')
          .where('idempotency_key', '=', row.idempotency_key)
          .executeTakeFirst();
        return Number(r.numDeletedRows);
      });
    expect(await deleted(companyOf.carol)).toBe(0);
    expect(await deleted(NO_COMPANY)).toBe(0);
    expect(await deleted(null)).toBe(1);
  });

  it("the workflow's reads (decision audit, idempotency keys): no other company's rows under any forged value", async () => {
    const visible = async (user: DemoUser, table: string, forge: string | null) =>
      withRequestClaims(api, claimsOf(user) as { sub: string }, async (trx) => {
        if (forge !== null)
          await sql`SELECT set_config('enterprise.company_hint', ${forge}, true)`.execute(trx);
        const { rows } = await sql<{
          company_id: string;
        }>`SELECT DISTINCT company_id FROM ${sql.table(table)}`.execute(trx);
        return rows.map((r) => r.company_id);
      });
    for (const table of [
      'enterprise.work_item_decisions',
      'enterprise.decision_idempotency_keys',
      'enterprise.assets',
    ]) {
      for (const forge of [null, companyOf.alice, companyOf.carol, NO_COMPANY]) {
        for (const company of await visible('bob', table, forge)) expect(company).toBe(companyOf.bob);
      }
    }
  });

  it('the nil uuid can never name a company', async () => {
    expect(
      await sqlState(
        f.adminPool.query(`UPDATE enterprise.companies SET id = $1 WHERE id = $2`, [
          NO_COMPANY,
          companyOf.carol,
        ]),
      ),
    ).toBe('23514');
  });
});

describe('the per-statement cost', () => {
  /** The executed plan's text for the count PostgREST issues, for `user`. */
  async function countPlan(user: DemoUser): Promise<string> {
    return withPostgrestRequest(f.authenticator, { claims: claimsOf(user) }, async (c) => {
      const { rows } = await c.query<{ 'QUERY PLAN': string }>(
        `EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF, SUMMARY OFF)
         SELECT count(*) FROM enterprise_api.work_items WHERE state = 'proposed'`,
      );
      return rows.map((r) => r['QUERY PLAN']).join('\n');
    });
  }

  it('the policy reads the stored company and calls authorized_site_ids() only behind it', async () => {
    const text = await countPlan('bob');
    expect(text).toMatch(/current_setting\('enterprise\.company_hint'::text, true\)/);
    expect(text).toMatch(/ELSE enterprise_api\.authorized_site_ids\(\) END/);
  });

  /**
   * Calls of each access function made by the count alone, for `user`: a superuser session with
   * track_functions = all runs PostgREST's protocol and reads pg_stat_xact_user_functions (this
   * transaction's calls) before and after the count.
   */
  async function accessCallsOfCount(user: DemoUser): Promise<Record<string, number>> {
    const client = await f.adminPool.connect();
    const calls = async (): Promise<Record<string, number>> => {
      const { rows } = await client.query<{ f: string; calls: string }>(
        `SELECT schemaname || '.' || funcname AS f, calls::text FROM pg_stat_xact_user_functions
          WHERE funcname IN ('authorized_company_id', 'authorized_site_ids')`,
      );
      return Object.fromEntries(rows.map((r) => [r.f, Number(r.calls)]));
    };
    try {
      await client.query(`SET track_functions = 'all'`);
      await client.query('BEGIN');
      await client.query('SET LOCAL ROLE enterprise_portal_role');
      await client.query(`SELECT set_config('request.jwt.claims', $1, true)`, [
        JSON.stringify(claimsOf(user)),
      ]);
      await client.query('SELECT postgrest.pre_request()');
      const before = await calls();
      await client.query(`SELECT count(*) FROM enterprise_api.work_items WHERE state = 'proposed'`);
      const after = await calls();
      return Object.fromEntries(
        Object.entries(after)
          .map(([k, v]) => [k, v - (before[k] ?? 0)] as const)
          .filter(([, v]) => v !== 0),
      );
    } finally {
      await client.query('ROLLBACK').catch(() => undefined);
      await client.query('RESET track_functions');
      client.release();
    }
  }

  it('a caller with access: one site lookup per statement, no company lookup', async () => {
    expect(await accessCallsOfCount('bob')).toEqual({ 'enterprise_api.authorized_site_ids': 1 });
  });

  it('a caller with no company: no access lookup at all', async () => {
    expect(await accessCallsOfCount('dave')).toEqual({});
  });
});

describe('migration 0004 down and up again', () => {
  /** What 0004 changes, as the catalog shows it. */
  async function state(db: Kysely<unknown>) {
    const { rows } = await sql<{
      policies_reading_it: string;
      remember: string;
      pre_request_stores: boolean;
      nil_check: string;
      policy_text: string;
    }>`
      SELECT (SELECT count(*) FROM pg_policies WHERE schemaname = 'enterprise'
                AND (qual LIKE '%enterprise.company_hint%' OR with_check LIKE '%enterprise.company_hint%'))::text
               AS policies_reading_it,
             (SELECT count(*) FROM pg_proc WHERE proname = 'remember_caller_company')::text AS remember,
             (SELECT prosrc LIKE '%remember_caller_company%' FROM pg_proc WHERE oid = 'postgrest.pre_request'::regproc)
               AS pre_request_stores,
             (SELECT count(*) FROM pg_constraint WHERE conname = 'companies_id_not_nil')::text AS nil_check,
             (SELECT string_agg(tablename || '.' || policyname || ': ' || coalesce(qual, '') || ' / ' ||
                                coalesce(with_check, ''), E'\n' ORDER BY tablename, policyname)
                FROM pg_policies WHERE schemaname = 'enterprise') AS policy_text`.execute(db);
    return rows[0];
  }

  it('down() restores 0003 (same policy count, no stored company) and up() applies again', async () => {
    const migration = enterpriseMigrations.migrations['0004_company_hint'];
    // 0005's, 0006's, 0007's, 0010's and 0011's policies are written with the hint too: they come off first and
    // go back last.
    const later = [
      enterpriseMigrations.migrations['0005_upload_intent_keys'],
      enterpriseMigrations.migrations['0006_decision_history'],
      enterpriseMigrations.migrations['0007_multipart_uploads'],
      enterpriseMigrations.migrations['0010_multipart_intent_first'],
      enterpriseMigrations.migrations['0011_multipart_ownership_in_the_database'],
      // 0013's functions read media_items.multipart_upload_id, which 0007's down drops.
      enterpriseMigrations.migrations['0013_sweep_progress'],
    ];
    const rollback = new Error('rollback');
    const seen: unknown[] = [];
    await expect(
      f.admin.transaction().execute(async (trx) => {
        seen.push(await state(trx));
        for (const m of [...later].reverse()) await m?.down?.(trx);
        await migration?.down?.(trx);
        seen.push(await state(trx));
        await migration?.up(trx);
        for (const m of later) await m?.up(trx);
        seen.push(await state(trx));
        throw rollback;
      }),
    ).rejects.toBe(rollback);
    const [before, down, after] = seen as Array<Record<string, unknown> | undefined>;
    const counts = (state: Record<string, unknown> | undefined) => {
      const { policy_text: _text, ...rest } = state ?? {};
      return rest;
    };
    const applied = { policies_reading_it: '22', remember: '1', pre_request_stores: true, nil_check: '1' };
    expect(counts(before)).toEqual(applied);
    expect(counts(down)).toEqual({
      policies_reading_it: '0',
      remember: '0',
      pre_request_stores: false,
      nil_check: '0',
    });
    expect(counts(after)).toEqual(applied);
    // up() after down() gives back exactly the policies it found.
    expect(after?.policy_text).toBe(before?.policy_text);
    // down() gives 0003's policies: the two definer sub-selects, nothing stored read.
    expect(down?.policy_text).toMatch(/company_id = \( SELECT enterprise_api\.authorized_company_id\(\)/);
    expect(down?.policy_text).not.toMatch(/company_hint/);
  });
});
