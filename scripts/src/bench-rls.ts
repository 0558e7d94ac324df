// `npm run bench:rls`: the portal's typical read (design §4.2) on 1,000,000 work items over 1,000
// sites, issued as PostgREST issues it, under PostgREST's per-request protocol, for four caller
// shapes; compared with the same query as table owner with a hand-written filter and under a naive
// policy that calls a function per row. The decision history's list (about 750,000 audit rows, the
// decider's name joined) runs for the same callers against its hand-written filter. Prints p50/p95,
// ratios and the plans' key lines.
//
// Both sides run on ONE connection, of the table owner: an RLS request is PostgREST's protocol with
// `SET LOCAL ROLE enterprise_portal_role` (what PostgREST's authenticator does; the policies see the same
// current_user), the owner's query follows it on the same server process. Sent over two connections,
// the same owner query took 0.07-0.10 ms on its own connection and 0.12-0.15 ms on the one that had
// just run a request, on this 2-core machine: which process the kernel put next to the client moved
// a no-access count's ratio between 1.2x and 2.3x. With client and server pinned to separate cores
// the two-connection and one-connection ratios agreed (1.10-1.12x at the time). Each caller's rows are
// also read once through the authenticator login and must match.
// BENCH_PLAN_CACHE_MODE=force_generic_plan|force_custom_plan sets plan_cache_mode on both sides (PostgREST
// prepares its statements; with the default `auto` PostgreSQL may re-plan the count, ~0.3-0.5 ms with RLS).
// DATABASE_URL (a superuser URL) benchmarks that server; without it a private embedded PostgreSQL is
// started under .data/bench-rls (kept, so a second run skips the 1M-row load).
import { mkdir } from 'node:fs/promises';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import pg from 'pg';
import { sql } from 'kysely';
import {
  AUTHENTICATOR,
  enterpriseMigrationsWith,
  installPostgrestAuth,
  PORTAL_ROLE,
  rolePasswordsFromEnv,
  seedEnterprise,
  seedId,
  urlForLogin,
} from '@platform/enterprise-db';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { startPostgres, withPostgrestRequest } from '@platform/testkit';

// A given DATABASE_URL may already have logins created from the environment's passwords.
const rolePasswords = rolePasswordsFromEnv(process.env);
const { values: args } = parseArgs({
  options: {
    iterations: { type: 'string', default: '300' },
    'naive-iterations': { type: 'string', default: '1' },
  },
});
const ITERATIONS = Number(args.iterations);
const NAIVE_ITERATIONS = Number(args['naive-iterations']);
const ISSUER = 'http://localhost:8180/realms/platform';
const CLIENT_ID = 'platform-enterprise-web';
const BENCH_DB = 'bench_rls';

// The statements PostgREST 12/13 builds for
//   GET /work_items?order=created_at.desc&limit=50
//   GET /work_items?state=eq.proposed&limit=0   with Prefer: count=exact
// (its read CTE, json_agg body and response GUCs; filters as parameters).
const LIST_SQL = `WITH pgrst_source AS (SELECT "enterprise_api"."work_items".* FROM "enterprise_api"."work_items" ORDER BY "work_items"."created_at" DESC LIMIT 50 OFFSET 0) SELECT null::bigint AS total_result_set, pg_catalog.count(_postgrest_t) AS page_total, coalesce(json_agg(_postgrest_t), '[]') AS body, nullif(current_setting('response.headers', true), '') AS response_headers, nullif(current_setting('response.status', true), '') AS response_status, '' AS response_inserted FROM (SELECT * FROM pgrst_source) _postgrest_t`;
const COUNT_SQL = `WITH pgrst_source AS (SELECT "enterprise_api"."work_items".* FROM "enterprise_api"."work_items" WHERE "enterprise_api"."work_items"."state" = $1 LIMIT 0 OFFSET 0), pgrst_source_count AS (SELECT 1 FROM "enterprise_api"."work_items" WHERE "enterprise_api"."work_items"."state" = $1) SELECT (SELECT pg_catalog.count(*) FROM pgrst_source_count) AS total_result_set, pg_catalog.count(_postgrest_t) AS page_total, coalesce(json_agg(_postgrest_t), '[]') AS body, nullif(current_setting('response.headers', true), '') AS response_headers, nullif(current_setting('response.status', true), '') AS response_status, '' AS response_inserted FROM (SELECT * FROM pgrst_source) _postgrest_t`;
// The decision history (design §4.2): GET /work_item_decisions?order=decided_at.desc&limit=50, the
// view joining each decision's decider for the name.
const DECISIONS_LIST_SQL = `WITH pgrst_source AS (SELECT "enterprise_api"."work_item_decisions".* FROM "enterprise_api"."work_item_decisions" ORDER BY "work_item_decisions"."decided_at" DESC LIMIT 50 OFFSET 0) SELECT null::bigint AS total_result_set, pg_catalog.count(_postgrest_t) AS page_total, coalesce(json_agg(_postgrest_t), '[]') AS body, nullif(current_setting('response.headers', true), '') AS response_headers, nullif(current_setting('response.status', true), '') AS response_status, '' AS response_inserted FROM (SELECT * FROM pgrst_source) _postgrest_t`;
// The same statements as the table owner, the view replaced by the base table with the policy's
// predicate written out by hand.
const OWNER_SOURCE = (first: number): string =>
  `(SELECT * FROM enterprise.work_items WHERE company_id = $${first} AND site_id = ANY ($${first + 1}::uuid[])) AS "work_items"`;
const OWNER_LIST_SQL = `WITH pgrst_source AS (SELECT "work_items".* FROM ${OWNER_SOURCE(1)} ORDER BY "work_items"."created_at" DESC LIMIT 50 OFFSET 0) SELECT null::bigint AS total_result_set, pg_catalog.count(_postgrest_t) AS page_total, coalesce(json_agg(_postgrest_t), '[]') AS body, nullif(current_setting('response.headers', true), '') AS response_headers, nullif(current_setting('response.status', true), '') AS response_status, '' AS response_inserted FROM (SELECT * FROM pgrst_source) _postgrest_t`;
const OWNER_COUNT_SQL = `WITH pgrst_source AS (SELECT "work_items".* FROM ${OWNER_SOURCE(2)} WHERE "work_items"."state" = $1 LIMIT 0 OFFSET 0), pgrst_source_count AS (SELECT 1 FROM ${OWNER_SOURCE(2)} WHERE "work_items"."state" = $1) SELECT (SELECT pg_catalog.count(*) FROM pgrst_source_count) AS total_result_set, pg_catalog.count(_postgrest_t) AS page_total, coalesce(json_agg(_postgrest_t), '[]') AS body, nullif(current_setting('response.headers', true), '') AS response_headers, nullif(current_setting('response.status', true), '') AS response_status, '' AS response_inserted FROM (SELECT * FROM pgrst_source) _postgrest_t`;

const OWNER_DECISIONS_SOURCE = `(SELECT d.id, d.work_item_id, d.site_id, d.company_id, d.decision, d.previous_state, d.new_state, d.note, d.defer_until, d.decided_at, p.sub AS decided_by, NULLIF(p.display_name, '') AS decided_by_name FROM enterprise.work_item_decisions d LEFT JOIN enterprise.principals p ON p.sub = d.decided_by AND p.company_id = d.company_id AND p.company_id = $1 WHERE d.company_id = $1 AND d.site_id = ANY ($2::uuid[])) AS "work_item_decisions"`;
const OWNER_DECISIONS_LIST_SQL = `WITH pgrst_source AS (SELECT "work_item_decisions".* FROM ${OWNER_DECISIONS_SOURCE} ORDER BY "work_item_decisions"."decided_at" DESC LIMIT 50 OFFSET 0) SELECT null::bigint AS total_result_set, pg_catalog.count(_postgrest_t) AS page_total, coalesce(json_agg(_postgrest_t), '[]') AS body, nullif(current_setting('response.headers', true), '') AS response_headers, nullif(current_setting('response.status', true), '') AS response_status, '' AS response_inserted FROM (SELECT * FROM pgrst_source) _postgrest_t`;

interface Shape {
  name: string;
  sub: string;
  companyId: string | null;
  siteIds: string[];
}

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? NaN;
}

function summary(samples: number[]): { p50: number; p95: number } {
  const s = [...samples].sort((a, b) => a - b);
  return { p50: pct(s, 50), p95: pct(s, 95) };
}

const ms = (n: number): string => n.toFixed(3).padStart(9);

async function ownerUrl(): Promise<{ url: string; stop: () => Promise<void> }> {
  const base = process.env.DATABASE_URL;
  if (base !== undefined && base !== '') return { url: base, stop: () => Promise.resolve() };
  const dataDir = resolve('.data/bench-rls');
  await mkdir(dataDir, { recursive: true });
  const server = await startPostgres({ dataDir });
  return { url: server.url, stop: () => server.stop() };
}

async function prepare(adminUrl: string): Promise<string> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  const exists = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [BENCH_DB]);
  if (exists.rowCount === 0) await admin.query(`CREATE DATABASE ${BENCH_DB}`);
  await admin.end();
  const u = new URL(adminUrl);
  u.pathname = `/${BENCH_DB}`;
  const url = u.toString();
  const db = createDb<unknown>(url, { max: 1 });
  try {
    await migrateToLatest(db, [enterpriseMigrationsWith(rolePasswords)]);
    const started = Date.now();
    const seeded = await seedEnterprise(db, { scale: 10 });
    console.log(
      `data: ${seeded.companies} companies, ${seeded.sites} sites, ${seeded.workItems} work items (load/check ${((Date.now() - started) / 1000).toFixed(1)} s)`,
    );
    await installPostgrestAuth(db, {
      issuer: ISSUER,
      clientId: CLIENT_ID,
      jwks: { keys: [{ kty: 'RSA', kid: 'bench', n: 'AQAB', e: 'AQAB' }] },
    });
    // Benchmark callers, all in generated company 1 (100 sites): one site, ten sites, all of it;
    // and a signed-in user mapped to nothing.
    const company = seedId('generated:company:1');
    await sql`INSERT INTO enterprise.principals (sub, company_id, all_sites) VALUES
                ('bench-one-site', ${company}, false), ('bench-ten-sites', ${company}, false),
                ('bench-company', ${company}, true) ON CONFLICT DO NOTHING`.execute(db);
    await sql`INSERT INTO enterprise.principal_sites (sub, company_id, site_id)
              SELECT p.sub, ${company}::uuid, md5('generated:site:1:' || n)::uuid
              FROM (VALUES ('bench-one-site', 1), ('bench-ten-sites', 10)) AS p(sub, k)
              CROSS JOIN LATERAL generate_series(1, p.k) n
              ON CONFLICT DO NOTHING`.execute(db);
    // The generated decisions' decider in company 1, so the history's name lookup finds someone.
    await sql`INSERT INTO enterprise.principals (sub, company_id, all_sites, display_name)
              VALUES ('generated-admin-1', ${company}, true, 'Generated Admin 1') ON CONFLICT DO NOTHING`.execute(
      db,
    );
    // The naive policy for comparison: the access function not wrapped in (SELECT ...), so it is
    // called for every row, and no tenant predicate.
    await sql
      .raw(
        `
      DO $$ BEGIN CREATE ROLE bench_naive_role NOLOGIN; EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
      DO $$ BEGIN GRANT bench_naive_role TO ${AUTHENTICATOR}; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
      DROP POLICY IF EXISTS bench_naive ON enterprise.work_items;
      DROP FUNCTION IF EXISTS enterprise.bench_naive_can_see(uuid);
      GRANT USAGE ON SCHEMA enterprise, enterprise_api, postgrest TO bench_naive_role;
      GRANT EXECUTE ON FUNCTION enterprise_api.authorized_site_ids(),
        enterprise_api.authorized_company_id(), enterprise_api.request_sub(), postgrest.pre_request() TO bench_naive_role;
      GRANT SELECT ON enterprise.work_items, enterprise_api.work_items TO bench_naive_role;
      DROP POLICY IF EXISTS bench_naive ON enterprise.work_items;
      CREATE POLICY bench_naive ON enterprise.work_items FOR SELECT TO bench_naive_role
        USING (site_id = ANY (enterprise_api.authorized_site_ids()));
    `,
      )
      .execute(db);
    await sql`VACUUM (ANALYZE) enterprise.work_items, enterprise.work_item_decisions, enterprise.principals`.execute(
      db,
    );
  } finally {
    await db.destroy();
  }
  return url;
}

async function shapes(url: string): Promise<Shape[]> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  const out: Shape[] = [];
  for (const [name, sub] of [
    ['1 site', 'bench-one-site'],
    ['10 sites', 'bench-ten-sites'],
    ['company (100 sites)', 'bench-company'],
    ['no access', 'bench-nobody'],
  ] as const) {
    await c.query('BEGIN');
    await c.query(`SELECT set_config('request.jwt.claims', $1, true)`, [JSON.stringify({ sub })]);
    const { rows } = await c.query<{ company: string | null; sites: string[] }>(
      'SELECT enterprise_api.authorized_company_id() AS company, enterprise_api.authorized_site_ids()::text[] AS sites',
    );
    await c.query('COMMIT');
    out.push({ name, sub, companyId: rows[0]?.company ?? null, siteIds: rows[0]?.sites ?? [] });
  }
  await c.end();
  return out;
}

function claims(sub: string, role = PORTAL_ROLE): Record<string, unknown> {
  return {
    iss: ISSUER,
    azp: CLIENT_ID,
    aud: CLIENT_ID,
    sub,
    role,
    exp: Math.floor(Date.now() / 1000) + 3600,
  };
}

interface Sample {
  query: number;
  request: number;
  rows: number;
}

/**
 * The prepared statement's name: one per text and role. PostgreSQL re-plans a cached statement when
 * the role changes (RLS) but keeps the last generic plan's cost and compares custom plans against it
 * (plancache.c, GetCachedPlan/choose_custom_plan): after one run under the naive policy, whose generic
 * plan costs thousands of times more, a shared statement never went back to its generic plan and
 * re-planned every request (+0.5–0.7 ms per count). PostgREST's portal connections run one role.
 */
const statementName = (role: string, text: string, values: readonly unknown[]): string =>
  `${role === PORTAL_ROLE ? 'q' : 'n'}${text.length}_${values.length}`;

/** One request under PostgREST's protocol: the query's time inside it and the whole request's. */
async function viaPostgrestOnce(
  pool: pg.Pool,
  sub: string,
  role: string,
  text: string,
  values: unknown[],
): Promise<Sample> {
  const r0 = performance.now();
  let query = 0;
  let rows = 0;
  await withPostgrestRequest(pool, { claims: claims(sub, role), path: '/work_items' }, async (c) => {
    const q0 = performance.now();
    const res = await c.query<{ page_total: string; total_result_set: string | null }>({
      name: statementName(role, text, values),
      text,
      values,
    });
    query = performance.now() - q0;
    rows = Number(res.rows[0]?.total_result_set ?? res.rows[0]?.page_total ?? 0);
  });
  return { query, request: performance.now() - r0, rows };
}

/** The same statement as the table owner with the predicate written out. */
async function asOwnerOnce(client: pg.Pool, text: string, values: unknown[]): Promise<Sample> {
  const q0 = performance.now();
  const res = await client.query<{ page_total: string; total_result_set: string | null }>({
    name: `o${text.length}`,
    text,
    values,
  });
  const query = performance.now() - q0;
  return {
    query,
    request: query,
    rows: Number(res.rows[0]?.total_result_set ?? res.rows[0]?.page_total ?? 0),
  };
}

/**
 * RLS and owner runs alternate, one request each per round, so the machine's drift (other processes,
 * frequency, caches) lands on both sides of the ratio alike; measured one block after the other, the
 * ratio moved by ±30 % between runs on this 2-core machine.
 */
async function interleaved(
  iterations: number,
  rlsOnce: () => Promise<Sample>,
  ownerOnce: () => Promise<Sample>,
  warmup = 20,
): Promise<{ rls: Sample[]; owner: Sample[] }> {
  const rls: Sample[] = [];
  const owner: Sample[] = [];
  for (let i = 0; i < iterations + warmup; i++) {
    const a = await rlsOnce();
    const b = await ownerOnce();
    if (i >= warmup) {
      rls.push(a);
      owner.push(b);
    }
  }
  return { rls, owner };
}

async function planLines(
  pool: pg.Pool,
  sub: string,
  role: string,
  text: string,
  values: unknown[],
): Promise<string[]> {
  return withPostgrestRequest(pool, { claims: claims(sub, role) }, async (c) => {
    const { rows } = await c.query<{ 'QUERY PLAN': string }>(
      `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ${text}`,
      values,
    );
    // The executed scans (not the never-executed LIMIT 0 half of the count), their conditions, the
    // index pages and searches they needed, and the total.
    const lines = rows.map((r) => r['QUERY PLAN']);
    const keep: string[] = [];
    let inExecutedScan = false;
    for (const line of lines) {
      if (/Scan .*\(actual/.test(line)) inExecutedScan = !/never executed/.test(line);
      else if (/^\s*->/.test(line) || /^\s*InitPlan/.test(line)) inExecutedScan = false;
      const wanted = inExecutedScan
        ? /Scan|Index Cond|Filter|Rows Removed|Index Searches|Heap Fetches|Buffers: shared/.test(line)
        : /Sort Method|Execution Time|Planning Time/.test(line);
      if (wanted) keep.push(`      ${line.trim()}`);
    }
    return keep;
  });
}

const { url: adminUrl, stop } = await ownerUrl();
try {
  const url = await prepare(adminUrl);
  const planMode = process.env.BENCH_PLAN_CACHE_MODE;
  const options = planMode === undefined ? {} : { options: `-c plan_cache_mode=${planMode}` };
  // PostgREST's own login, for the row check and the plans; the timed runs use `timing` (header).
  const pool = new pg.Pool({
    connectionString: urlForLogin(url, AUTHENTICATOR, rolePasswords.authenticator),
    max: 1,
    ...options,
  });
  const timing = new pg.Pool({ connectionString: url, max: 1, ...options });
  const callers = await shapes(url);
  console.log(`\n${ITERATIONS} iterations per figure (naive policy: ${NAIVE_ITERATIONS}); times in ms\n`);
  const verdicts: string[] = [];
  // The naive policy exists for work_items only; the history is compared with the filter alone.
  for (const [label, text, values, ownerText, withNaive] of [
    ['GET /work_items?order=created_at.desc&limit=50', LIST_SQL, [], OWNER_LIST_SQL, true],
    [
      'GET /work_items?state=eq.proposed&limit=0 (Prefer: count=exact)',
      COUNT_SQL,
      ['proposed'],
      OWNER_COUNT_SQL,
      true,
    ],
    [
      'GET /work_item_decisions?order=decided_at.desc&limit=50',
      DECISIONS_LIST_SQL,
      [],
      OWNER_DECISIONS_LIST_SQL,
      false,
    ],
  ] as const) {
    console.log(`== ${label}`);
    const planCacheNotes: string[] = [];
    console.log(
      '   caller                 rows | RLS query p50      p95 | request p50 | owner+filter p50      p95 | RLS/filter | naive p50  naive/RLS',
    );
    for (const s of callers) {
      const ownerValues = [...values, s.companyId, s.siteIds];
      const runs = await interleaved(
        ITERATIONS,
        () => viaPostgrestOnce(timing, s.sub, PORTAL_ROLE, text, [...values]),
        () => asOwnerOnce(timing, ownerText, ownerValues),
      );
      const rls = {
        query: runs.rls.map((x) => x.query),
        request: runs.rls.map((x) => x.request),
        rows: runs.rls[0]?.rows ?? 0,
      };
      const explicit = { query: runs.owner.map((x) => x.query), rows: runs.owner[0]?.rows ?? 0 };
      // Generic plans served / plans built for this caller's requests (a custom plan is a re-plan).
      const planCache = await withPostgrestRequest(timing, { claims: claims(s.sub) }, async (c) => {
        const { rows: stats } = await c.query<{ generic_plans: string; custom_plans: string }>(
          'SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1',
          [statementName(PORTAL_ROLE, text, values)],
        );
        return stats[0];
      });
      const naiveRuns: Sample[] = [];
      for (let i = 0; withNaive && i < NAIVE_ITERATIONS; i++) {
        naiveRuns.push(await viaPostgrestOnce(timing, s.sub, 'bench_naive_role', text, [...values]));
      }
      const naive = { query: naiveRuns.map((x) => x.query), rows: naiveRuns[0]?.rows ?? 0 };
      const r = summary(rls.query);
      const req = summary(rls.request);
      const e = summary(explicit.query);
      const n = summary(naive.query);
      const viaAuthenticator = (await viaPostgrestOnce(pool, s.sub, PORTAL_ROLE, text, [...values])).rows;
      if (
        rls.rows !== explicit.rows ||
        (withNaive && rls.rows !== naive.rows) ||
        rls.rows !== viaAuthenticator
      ) {
        throw new Error(
          `row counts differ for ${s.name}: RLS ${rls.rows} (authenticator login: ${viaAuthenticator}), owner ${explicit.rows}, naive ${naive.rows}`,
        );
      }
      planCacheNotes.push(
        `${s.name}: ${planCache?.generic_plans ?? '?'} generic / ${planCache?.custom_plans ?? '?'} custom`,
      );
      console.log(
        `   ${s.name.padEnd(20)} ${String(rls.rows).padStart(6)} | ${ms(r.p50)} ${ms(r.p95)} | ${ms(req.p50)}   | ${ms(e.p50)} ${ms(e.p95)} | ${(r.p50 / e.p50).toFixed(2).padStart(9)}x | ${withNaive ? `${ms(n.p50)} ${(n.p50 / r.p50).toFixed(0).padStart(6)}x` : '        -       -'}`,
      );
      // Read-surface speed (design §4.2): the typical query (the list) within 2 ms for every caller; RLS within 1.1x the filter for both.
      const ratio = r.p50 / e.p50;
      const isList = text === LIST_SQL || text === DECISIONS_LIST_SQL;
      const timeVerdict = isList ? ` (target <= 2: ${r.p50 <= 2 ? 'met' : 'MISSED'})` : '';
      verdicts.push(
        `${label.split('&')[0] ?? label} / ${s.name}: p50 ${r.p50.toFixed(2)} ms${timeVerdict}, RLS/filter ${ratio.toFixed(2)}x (target <= 1.1: ${ratio <= 1.1 ? 'met' : 'MISSED'})`,
      );
    }
    // Cumulative per statement: the count after each caller's runs.
    console.log(`   plan cache of the RLS statement (cumulative): ${planCacheNotes.join('; ')}`);
    console.log('   plans under RLS (key lines):');
    for (const s of callers) {
      console.log(`    ${s.name}:`);
      for (const l of await planLines(pool, s.sub, PORTAL_ROLE, text, [...values])) console.log(l);
    }
    console.log('');
  }
  console.log('summary:');
  for (const v of verdicts) console.log(`  ${v}`);
  await timing.end();
  await pool.end();
} finally {
  await stop();
}
