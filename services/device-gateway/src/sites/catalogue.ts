// The platform's sites as the gateway knows them (design §3.2, issue 42 §1): the portal's site ids, each with its
// company and IANA time zone, read with every registry reload through device_gateway.platform_sites() (migration
// 0028). A gateway deployed without the enterprise schema (the specification's standalone gateway, and the
// gateway's own test databases) has no catalogue: `platform` is false and sites are not checked.
import { isIanaTimeZone } from '@platform/contracts';
import { DomainError } from '@platform/service-kit';

export interface PlatformSite {
  siteId: string;
  companyId: string;
  name: string;
  /** An IANA zone name; null when the portal's value is not one this runtime knows (logged at load). */
  timezone: string | null;
}

export class SiteCatalogue {
  private readonly byId: ReadonlyMap<string, PlatformSite>;
  private readonly byCompany: ReadonlyMap<string, readonly string[]>;

  /**
   * `platform`: whether the database holds the platform's sites (enterprise.sites exists). Without them the
   * gateway cannot tell a site from a typo, so it checks none (`knows` is true for every id).
   */
  constructor(
    readonly platform: boolean,
    sites: readonly PlatformSite[],
  ) {
    this.byId = new Map(sites.map((s) => [s.siteId, s]));
    const byCompany = new Map<string, string[]>();
    for (const s of sites) {
      const list = byCompany.get(s.companyId) ?? [];
      list.push(s.siteId);
      byCompany.set(s.companyId, list);
    }
    this.byCompany = byCompany;
  }

  /** Before the first reload: no platform, nothing known. */
  static readonly empty = new SiteCatalogue(false, []);

  /** Rows as read from device_gateway.platform_sites(); a zone this runtime does not know becomes null. */
  static fromRows(
    platform: boolean,
    rows: readonly { site_id: string; company_id: string; name: string; timezone: string }[],
  ): { catalogue: SiteCatalogue; badZones: number } {
    let badZones = 0;
    const sites = rows.map((r) => {
      const ok = isIanaTimeZone(r.timezone);
      if (!ok) badZones++;
      return { siteId: r.site_id, companyId: r.company_id, name: r.name, timezone: ok ? r.timezone : null };
    });
    return { catalogue: new SiteCatalogue(platform, sites), badZones };
  }

  get size(): number {
    return this.byId.size;
  }

  /** Whether a device may be placed at `siteId`: a platform site, or any id on a standalone gateway. */
  knows(siteId: string): boolean {
    return !this.platform || this.byId.has(siteId);
  }

  site(siteId: string): PlatformSite | undefined {
    return this.byId.get(siteId);
  }

  companyOf(siteId: string): string | undefined {
    return this.byId.get(siteId)?.companyId;
  }

  /**
   * `<site>/<company>` for each of `siteIds` the platform knows, with the company it belongs to now: how audit rows
   * (0038) and rollouts (0041) keep their sites' companies, and how a scoped reader's sites are matched against them.
   */
  companyPairs(siteIds: readonly string[]): string[] {
    return siteIds.flatMap((id) => {
      const company = this.companyOf(id);
      return company === undefined ? [] : [`${id}/${company}`];
    });
  }

  /** Every site of these companies (unknown companies: none). */
  sitesOfCompanies(companyIds: Iterable<string>): string[] {
    const out: string[] = [];
    for (const c of companyIds) out.push(...(this.byCompany.get(c) ?? []));
    return out;
  }
}

/**
 * The one answer for a site the caller may not name (issue 42 §1, design §2): 404 `unknown_site`. Unknown to the
 * platform and outside the caller's scope read the same (code, detail, and no site id echoed), so an answer never
 * tells a caller that another tenant's site exists.
 */
export function unknownSite(): DomainError {
  return new DomainError('unknown_site', 'The site is unknown.');
}
