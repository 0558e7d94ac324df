// Demo data (design §5) and a scalable generator for benchmarks. Idempotent: every row has a
// deterministic id (md5 of a name, as uuid) and is inserted ON CONFLICT DO NOTHING; a generated
// company that already exists is skipped as a whole. Runs as the migration user (table owner,
// superuser or BYPASSRLS in practice: RLS is forced on every table).
import { createHash } from 'node:crypto';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import { demoAccess, demoCompanies, demoSites, demoUserSubs } from './demo.js';
import type { DemoSiteName } from './demo.js';

/** The uuid PostgreSQL's `md5(name)::uuid` gives: how the seed derives every row id. */
export function seedId(name: string): string {
  const h = createHash('md5').update(name, 'utf8').digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** Rows the seed creates for each demo site (ids: `demoRowId(kind, site, n)`, n from 1). */
export const demoRowsPerSite = {
  asset: 4,
  maintenance_schedule: 4,
  walkthrough: 2,
  work_item: 6,
  service_record: 2,
  media_item: 2,
} as const;

export type DemoRowKind = keyof typeof demoRowsPerSite;

/** Id of the n-th (1-based) demo row of a kind at a demo site. */
export function demoRowId(kind: DemoRowKind, site: DemoSiteName, n: number): string {
  return seedId(`demo:${kind}:${demoSites[site].id}:${n}`);
}

/**
 * Demo work items by n: 1-3 proposed, 4 accepted (by the site's company admin), 5 deferred, 6 declined.
 * Tests that decide items should use 1-3.
 */
export const demoWorkItemStates = [
  'proposed',
  'proposed',
  'proposed',
  'accepted',
  'deferred',
  'declined',
] as const;

export interface SeedOptions {
  /**
   * Generated data on top of the demo set: this many companies (`Generated company k`), each with
   * `sitesPerCompany` sites and `workItemsPerSite` work items per site (plus a few assets,
   * walkthroughs and records per site). Default 0: demo data only.
   */
  scale?: number;
  /** Default 100. */
  sitesPerCompany?: number;
  /** Default 1000. */
  workItemsPerSite?: number;
}

export interface SeedSummary {
  companies: number;
  sites: number;
  workItems: number;
}

/** Which demo user decided the already-decided demo items of a company. */
function deciderOf(companyId: string): string {
  return companyId === demoCompanies.acme.id ? demoUserSubs.alice : demoUserSubs.carol;
}

// The generator, shared by the demo set and the scaled set: fills one batch of sites (site ids in
// temp table seed_sites) with assets, schedules, walkthroughs, work items, decisions, service
// records and media. Row ids derive from the site id and a row number.
const fillSitesSql = (workItemsPerSite: number, prefix: string): string => `
INSERT INTO enterprise.assets (id, site_id, company_id, name, category, manufacturer, model, serial_number,
                               location, installed_on, expected_life_years, condition, status)
SELECT md5('${prefix}:asset:' || s.id || ':' || n)::uuid, s.id, s.company_id,
       (ARRAY['Rooftop unit RTU-', 'Main switchboard MSB-', 'Fire alarm panel FACP-', 'Passenger elevator P'])[n] || n,
       (ARRAY['hvac', 'electrical', 'fire_safety', 'elevator'])[n],
       (ARRAY['Carrier', 'Schneider Electric', 'Notifier', 'Otis'])[n],
       (ARRAY['48TC', 'Square D QED-2', 'NFS2-3030', 'Gen2'])[n],
       upper(substr(md5(s.id || 'sn' || n), 1, 10)),
       (ARRAY['Roof, north side', 'Basement electrical room', 'Lobby security desk', 'Core A'])[n],
       date '2009-01-01' + (abs(hashtext(s.id || 'inst' || n)) % 4000),
       (ARRAY[15, 30, 15, 25])[n],
       (ARRAY['good', 'fair', 'poor', 'good'])[1 + abs(hashtext(s.id || 'cond' || n)) % 4],
       'in_service'
FROM seed_sites s CROSS JOIN generate_series(1, 4) n
ON CONFLICT DO NOTHING;

INSERT INTO enterprise.maintenance_schedules (id, site_id, company_id, asset_id, title, description, frequency,
                                              next_due_on, last_completed_on, vendor)
SELECT md5('${prefix}:maintenance_schedule:' || s.id || ':' || n)::uuid, s.id, s.company_id,
       md5('${prefix}:asset:' || s.id || ':' || n)::uuid,
       (ARRAY['Replace filters and check belts', 'Thermographic scan of switchboard', 'Fire alarm functional test', 'Elevator safety inspection'])[n],
       (ARRAY['Replace MERV-13 filters, inspect belts and bearings, clean coils.', 'Infrared scan of busbars and breakers under load.', 'Test initiating devices and notification appliances per NFPA 72.', 'Annual inspection of brakes, governor and door operators.'])[n],
       (ARRAY['quarterly', 'annual', 'semiannual', 'monthly'])[n],
       current_date + (abs(hashtext(s.id || 'due' || n)) % 90),
       current_date - (abs(hashtext(s.id || 'done' || n)) % 180),
       (ARRAY['Polar Mechanical', 'Brightline Electric', 'Sentinel Fire Protection', 'Vertical Transit Co.'])[n]
FROM seed_sites s CROSS JOIN generate_series(1, 4) n
ON CONFLICT DO NOTHING;

INSERT INTO enterprise.walkthrough_logs (id, site_id, company_id, performed_at, inspector_name, kind,
                                         condition_rating, summary, report)
SELECT md5('${prefix}:walkthrough:' || s.id || ':' || n)::uuid, s.id, s.company_id,
       now() - make_interval(days => 30 * n),
       (ARRAY['Jordan Reyes', 'Priya Natarajan'])[n],
       (ARRAY['routine', 'annual'])[n],
       3 + n % 2,
       (ARRAY['Quarterly walkthrough: roof drains clear, RTU-1 belt worn.', 'Annual condition survey: envelope sound, two fire doors need adjustment.'])[n],
       (ARRAY['Walked roof, mechanical rooms and common areas. RTU-1 belt shows cracking; recommend replacement. Roof drains clear. No active leaks.', 'Full building survey. Envelope and structure in good condition. Fire doors on levels 3 and 7 do not self-close. Emergency lighting batteries at end of life.'])[n]
FROM seed_sites s CROSS JOIN generate_series(1, 2) n
ON CONFLICT DO NOTHING;

-- Work items: spread over the last year; states roughly 25% proposed, 40% accepted, 15% deferred,
-- 20% declined (decided ones carry decider and time). Small sites (demo) use the fixed pattern.
INSERT INTO enterprise.work_items (id, site_id, company_id, asset_id, walkthrough_id, title, description, category,
                                   severity, state, estimate_amount, defer_until, decided_at, decided_by,
                                   decision_note, created_at, updated_at)
SELECT md5('${prefix}:work_item:' || s.id || ':' || n)::uuid, s.id, s.company_id,
       CASE WHEN n % 3 = 0 THEN NULL ELSE md5('${prefix}:asset:' || s.id || ':' || (1 + n % 4))::uuid END,
       md5('${prefix}:walkthrough:' || s.id || ':' || (1 + n % 2))::uuid,
       (ARRAY['Replace worn drive belt on RTU', 'Tighten lugs on main breaker', 'Replace failed smoke detector', 'Adjust elevator door operator', 'Re-seal roof penetration', 'Replace emergency lighting batteries', 'Repair leaking PRV', 'Adjust fire door closer'])[1 + n % 8] || ' #' || n,
       (ARRAY['Belt cracked and glazed; risk of unit shutdown in peak season.', 'Thermal scan found 18 K rise on phase B lug.', 'Detector failed sensitivity test.', 'Doors reopen intermittently; nuisance calls.', 'Flashing lifted at conduit penetration; water staining below.', 'Batteries fail 90-minute duration test.', 'Pressure reducing valve weeps at bonnet.', 'Closer does not latch door; fire separation compromised.'])[1 + n % 8],
       (ARRAY['hvac', 'electrical', 'fire_safety', 'elevator', 'roofing', 'lighting', 'plumbing', 'fire_safety'])[1 + n % 8],
       (ARRAY['low', 'medium', 'high', 'critical'])[1 + (n * 7) % 4],
       st.state,
       round((150 + (abs(hashtext(s.id || 'est' || n)) % 2000000) / 100.0)::numeric, 2),
       CASE WHEN st.state = 'deferred' THEN now() + make_interval(days => 30 + n % 180) END,
       CASE WHEN st.state <> 'proposed' THEN created + interval '3 days' END,
       CASE WHEN st.state <> 'proposed' THEN s.decider END,
       CASE st.state WHEN 'deferred' THEN 'Budget next fiscal year.' WHEN 'declined' THEN 'Handled by tenant fit-out.' END,
       created,
       CASE WHEN st.state <> 'proposed' THEN created + interval '3 days' ELSE created END
FROM seed_sites s
CROSS JOIN generate_series(1, ${workItemsPerSite}) n
CROSS JOIN LATERAL (SELECT now() - make_interval(secs => (abs(hashtext(s.id || ':' || n)) % 31536000)) AS created) c
CROSS JOIN LATERAL (
  SELECT CASE
    WHEN ${workItemsPerSite} <= 6 THEN (ARRAY['proposed', 'proposed', 'proposed', 'accepted', 'deferred', 'declined'])[n]
    ELSE (ARRAY['proposed', 'accepted', 'accepted', 'deferred', 'declined', 'proposed', 'accepted', 'accepted', 'declined', 'deferred', 'accepted', 'proposed', 'proposed', 'accepted', 'declined', 'proposed', 'accepted', 'deferred', 'accepted', 'declined'])[1 + abs(hashtext(s.id || 'st' || n)) % 20]
  END AS state
) st
ON CONFLICT DO NOTHING;

INSERT INTO enterprise.work_item_decisions (work_item_id, site_id, company_id, decision, previous_state, new_state,
                                            note, defer_until, decided_by, decided_at, request_id)
SELECT w.id, w.site_id, w.company_id,
       CASE w.state WHEN 'accepted' THEN 'accept' WHEN 'deferred' THEN 'defer' ELSE 'decline' END,
       'proposed', w.state, w.decision_note, w.defer_until, w.decided_by, w.decided_at, 'seed-' || w.id
FROM enterprise.work_items w
JOIN seed_sites s ON s.id = w.site_id
WHERE w.state <> 'proposed'
  AND NOT EXISTS (SELECT 1 FROM enterprise.work_item_decisions d WHERE d.work_item_id = w.id);

INSERT INTO enterprise.service_records (id, site_id, company_id, asset_id, schedule_id, performed_on, vendor,
                                        technician, summary, labor_hours, cost_amount)
SELECT md5('${prefix}:service_record:' || s.id || ':' || n)::uuid, s.id, s.company_id,
       md5('${prefix}:asset:' || s.id || ':' || n)::uuid,
       md5('${prefix}:maintenance_schedule:' || s.id || ':' || n)::uuid,
       current_date - 20 * n,
       (ARRAY['Polar Mechanical', 'Brightline Electric'])[n],
       (ARRAY['Sam Okafor', 'Lena Fischer'])[n],
       (ARRAY['Replaced filters (12x MERV-13), adjusted belt tension, cleaned condenser coil.', 'Infrared scan completed; re-torqued phase B lug, no further anomalies.'])[n],
       (ARRAY[3.5, 2.0])[n],
       (ARRAY[640.00, 410.00])[n]
FROM seed_sites s CROSS JOIN generate_series(1, 2) n
ON CONFLICT DO NOTHING;

INSERT INTO enterprise.media_items (id, site_id, company_id, object_key, status, filename, declared_content_type,
                                    declared_size_bytes, actual_content_type, actual_size_bytes, etag,
                                    walkthrough_id, work_item_id, uploaded_by, created_at, uploaded_at)
SELECT md5('${prefix}:media_item:' || s.id || ':' || n)::uuid, s.id, s.company_id,
       'sites/' || s.id || '/media/' || md5('${prefix}:media_item:' || s.id || ':' || n)::uuid,
       CASE n WHEN 1 THEN 'available' ELSE 'pending_upload' END,
       (ARRAY['rtu-1-belt.jpg', 'roof-walk.mp4'])[n],
       (ARRAY['image/jpeg', 'video/mp4'])[n],
       (ARRAY[2483911, 48123904])[n],
       CASE n WHEN 1 THEN 'image/jpeg' END,
       CASE n WHEN 1 THEN 2483911 END,
       CASE n WHEN 1 THEN md5('etag' || s.id) END,
       md5('${prefix}:walkthrough:' || s.id || ':1')::uuid,
       md5('${prefix}:work_item:' || s.id || ':1')::uuid,
       s.decider,
       now() - interval '20 days',
       CASE n WHEN 1 THEN now() - interval '20 days' END
FROM seed_sites s CROSS JOIN generate_series(1, 2) n
ON CONFLICT DO NOTHING;
`;

/**
 * Loads the demo data set (design §5) and, with `scale`, generated companies for benchmarks
 * (`scale: 10` = 1,000 sites and 1,000,000 work items with the defaults). Idempotent.
 */
export async function seedEnterprise<DB>(db: Kysely<DB>, options: SeedOptions = {}): Promise<SeedSummary> {
  const scale = options.scale ?? 0;
  const sitesPerCompany = options.sitesPerCompany ?? 100;
  const workItemsPerSite = options.workItemsPerSite ?? 1000;
  for (const n of [scale, sitesPerCompany, workItemsPerSite]) {
    if (!Number.isSafeInteger(n) || n < 0) throw new RangeError('seed sizes must be non-negative integers');
  }

  await db.transaction().execute(async (trx) => {
    for (const c of Object.values(demoCompanies)) {
      await sql`INSERT INTO enterprise.companies (id, name) VALUES (${c.id}, ${c.name}) ON CONFLICT DO NOTHING`.execute(
        trx,
      );
    }
    for (const s of Object.values(demoSites)) {
      await sql`INSERT INTO enterprise.sites (id, company_id, name, address_line, city, postal_code,
                  country_code, timezone, gross_floor_area_m2)
                VALUES (${s.id}, ${s.companyId}, ${s.name}, ${s.address}, ${s.city}, ${s.postalCode},
                  ${s.timezone === 'America/Toronto' ? 'CA' : 'US'}, ${s.timezone}, 12500)
                ON CONFLICT DO NOTHING`.execute(trx);
    }
    const principals = [
      { sub: demoUserSubs.alice, company: demoCompanies.acme.id, all: true, name: 'Alice Archer' },
      { sub: demoUserSubs.bob, company: demoCompanies.acme.id, all: false, name: 'Bob Baker' },
      { sub: demoUserSubs.carol, company: demoCompanies.borealis.id, all: true, name: 'Carol Chen' },
    ];
    for (const p of principals) {
      await sql`INSERT INTO enterprise.principals (sub, company_id, all_sites, display_name)
                VALUES (${p.sub}, ${p.company}, ${p.all}, ${p.name}) ON CONFLICT DO NOTHING`.execute(trx);
    }
    for (const site of demoAccess.bob) {
      await sql`INSERT INTO enterprise.principal_sites (sub, company_id, site_id)
                VALUES (${demoUserSubs.bob}, ${demoCompanies.acme.id}, ${demoSites[site].id})
                ON CONFLICT DO NOTHING`.execute(trx);
    }
    await sql`CREATE TEMP TABLE seed_sites (id uuid PRIMARY KEY, company_id uuid NOT NULL, decider text NOT NULL) ON COMMIT DROP`.execute(
      trx,
    );
    for (const s of Object.values(demoSites)) {
      await sql`INSERT INTO seed_sites VALUES (${s.id}, ${s.companyId}, ${deciderOf(s.companyId)})`.execute(
        trx,
      );
    }
    await sql.raw(fillSitesSql(demoRowsPerSite.work_item, 'demo')).execute(trx);
  });

  for (let k = 1; k <= scale; k++) {
    // One transaction per generated company: progress survives an interruption, and a re-run
    // skips the companies already complete.
    await db.transaction().execute(async (trx) => {
      const companyId = seedId(`generated:company:${k}`);
      const inserted =
        await sql`INSERT INTO enterprise.companies (id, name) VALUES (${companyId}, ${`Generated company ${k}`})
                                 ON CONFLICT DO NOTHING RETURNING id`.execute(trx);
      if (inserted.rows.length === 0) return;
      // Generated rows are consistent by construction (company from the site, same-site links), so
      // a superuser skips the per-row trigger and foreign-key checks: about 3x faster for 1M rows.
      await sql`DO $$ BEGIN
                  IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
                    SET LOCAL session_replication_role = replica;
                  END IF;
                END $$`.execute(trx);
      await sql`INSERT INTO enterprise.sites (id, company_id, name, city, timezone)
                SELECT md5('generated:site:' || ${k}::int || ':' || n)::uuid, ${companyId}::uuid,
                       'Generated site ' || ${k}::int || '-' || n, 'Springfield', 'UTC'
                FROM generate_series(1, ${sitesPerCompany}::int) n`.execute(trx);
      await sql`CREATE TEMP TABLE seed_sites ON COMMIT DROP AS
                SELECT id, company_id, 'generated-admin-' || ${k}::int AS decider
                FROM enterprise.sites WHERE company_id = ${companyId}::uuid`.execute(trx);
      await sql.raw(fillSitesSql(workItemsPerSite, 'generated')).execute(trx);
    });
  }

  const { rows } = await sql<{ companies: string; sites: string; work_items: string }>`
    SELECT (SELECT count(*) FROM enterprise.companies) AS companies,
           (SELECT count(*) FROM enterprise.sites) AS sites,
           (SELECT count(*) FROM enterprise.work_items) AS work_items`.execute(db);
  const r = rows[0];
  return {
    companies: Number(r?.companies ?? 0),
    sites: Number(r?.sites ?? 0),
    workItems: Number(r?.work_items ?? 0),
  };
}
