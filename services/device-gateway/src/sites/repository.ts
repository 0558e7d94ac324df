import { sql, type Kysely } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';
import { SiteCatalogue } from './catalogue.js';

/**
 * The platform's sites (migration 0028), read in the registry reload's transaction so the registry is checked
 * against the sites of the same snapshot. `platform` is whether enterprise.sites exists in this database, read from
 * the catalog (to_regclass would need USAGE on the enterprise schema, which the login does not have).
 */
export async function loadSites(
  db: Kysely<GatewayDatabase>,
): Promise<{ catalogue: SiteCatalogue; badZones: number }> {
  const { rows } = await sql<{
    platform: boolean;
    site_id: string | null;
    company_id: string | null;
    name: string | null;
    timezone: string | null;
  }>`
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                   WHERE n.nspname = 'enterprise' AND c.relname = 'sites') AS platform,
           s.site_id, s.company_id, s.name, s.timezone
    FROM (SELECT 1) AS one LEFT JOIN device_gateway.platform_sites() s ON true`.execute(db);
  const platform = rows[0]?.platform ?? false;
  const sites = rows.flatMap((r) =>
    r.site_id === null || r.company_id === null
      ? []
      : [{ site_id: r.site_id, company_id: r.company_id, name: r.name ?? '', timezone: r.timezone ?? '' }],
  );
  return SiteCatalogue.fromRows(platform, sites);
}

/**
 * `<site>/<company>` for each of `siteIds` the platform knows, read from the portal's sites now (not from a
 * catalogue, which is up to GATEWAY_SITES_REFRESH_MS old). One call of platform_sites() (0028, the one function the
 * login may call on the portal's sites): it reads every site, a few milliseconds at 20,000, so it is asked only for
 * changes by callers scoped by companies (confirm.ts).
 */
export async function companyPairsNow(
  db: Kysely<GatewayDatabase>,
  siteIds: readonly string[],
): Promise<string[]> {
  if (siteIds.length === 0) return [];
  const { rows } = await sql<{ pair: string }>`
    SELECT s.site_id::text || '/' || s.company_id::text AS pair FROM device_gateway.platform_sites() s
    WHERE s.site_id = ANY (${[...siteIds]}::uuid[]) ORDER BY 1`.execute(db);
  return rows.map((r) => r.pair);
}
