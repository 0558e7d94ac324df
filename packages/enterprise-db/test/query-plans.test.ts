// The policies stay index conditions (design §4.2): for each portal list, under
// PostgREST's protocol, the base table is read through its tenant index with both the company and
// the site check inside the index condition, never as a filter applied row by row, and a caller
// with no access reads no index page. `npm run bench:rls` measures the speed; this keeps the shape,
// which is what a policy rewrite (an OR, a per-row function) would silently lose.
import { withPostgrestRequest } from '@platform/testkit';
import type { DemoUser } from '@platform/enterprise-db';
import { claimsOf, setUp } from './helpers.js';
import type { Fixture } from './helpers.js';

/** Each portal view with the order its list uses and the index that serves it. */
const lists = [
  { view: 'work_items', orderBy: 'created_at DESC', index: 'work_items_tenant_created_idx' },
  { view: 'media_items', orderBy: 'created_at DESC', index: 'media_items_tenant_idx' },
  { view: 'walkthrough_logs', orderBy: 'performed_at DESC', index: 'walkthrough_logs_tenant_idx' },
  { view: 'service_records', orderBy: 'performed_on DESC', index: 'service_records_tenant_idx' },
  { view: 'maintenance_schedules', orderBy: 'next_due_on', index: 'maintenance_schedules_tenant_idx' },
  { view: 'assets', orderBy: 'name', index: 'assets_tenant_idx' },
  {
    view: 'work_item_decisions',
    orderBy: 'decided_at DESC',
    index: 'work_item_decisions_tenant_decided_idx',
  },
] as const;

interface PlanNode {
  'Node Type': string;
  'Index Name'?: string;
  'Relation Name'?: string;
  'Index Cond'?: string;
  Filter?: string;
  'Index Searches'?: number;
  Plans?: PlanNode[];
}

function nodes(plan: PlanNode): PlanNode[] {
  return [plan, ...(plan.Plans ?? []).flatMap(nodes)];
}

let f: Fixture;
beforeAll(async () => {
  f = await setUp();
});
afterAll(async () => {
  await f.close();
});

/** The executed plan of `query` for `user`, as PostgREST would run it. */
async function plan(user: DemoUser, query: string): Promise<PlanNode[]> {
  return withPostgrestRequest(f.authenticator, { claims: claimsOf(user) }, async (c) => {
    // The demo data is a few rows per table, where a sequential scan is cheapest; the benchmark's
    // million rows make the index the planner's own choice. Only the access path is forced here.
    await c.query('SET LOCAL enable_seqscan = off');
    const { rows } = await c.query<{ 'QUERY PLAN': [{ Plan: PlanNode }] }>(
      `EXPLAIN (ANALYZE, FORMAT JSON) ${query}`,
    );
    const top = rows[0]?.['QUERY PLAN'][0].Plan;
    if (top === undefined) throw new Error('EXPLAIN returned no plan');
    return nodes(top);
  });
}

describe.each(lists)('list of enterprise_api.$view', ({ view, orderBy, index }) => {
  const list = `SELECT * FROM enterprise_api.${view} ORDER BY ${orderBy} LIMIT 50`;

  it.each(['alice', 'bob'] as const)(
    'for %s: one scan of the tenant index, company and sites inside its condition',
    async (user) => {
      const scans = (await plan(user, list)).filter((n) => n['Relation Name'] === view);
      expect(scans).toHaveLength(1);
      const [scan] = scans;
      expect(scan?.['Index Name']).toBe(index);
      expect(scan?.['Index Cond']).toMatch(/company_id = \(InitPlan \d+\)\.col1/);
      expect(scan?.['Index Cond']).toMatch(/site_id = ANY \(\(InitPlan \d+\)\.col1\)/);
      expect(scan?.Filter).toBeUndefined();
    },
  );

  it('for a caller with no access: no index search at all', async () => {
    const scans = (await plan('dave', list)).filter((n) => n['Relation Name'] === view);
    expect(scans.map((s) => s['Index Searches'])).toEqual([0]);
  });
});
