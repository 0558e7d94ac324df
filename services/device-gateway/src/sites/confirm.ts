// A change by a caller whose scope names companies, checked against the portal's sites as they are now (fourth cold
// review of issue 42). The routes' scope checks read the catalogue, refreshed every GATEWAY_SITES_REFRESH_MS: in that
// window a site the portal had handed to another company still passed for the old company's keys and people, and
// their change was audited with the old company (the queue's stamp), so no scoped reader of either company saw it.
// Site scopes name sites by id and do not depend on companies; unscoped callers see every site.
import { mapDbError } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { AuditRow } from '../audit/writer.js';
import type { Principal } from '../auth/principal.js';
import type { GatewayDatabase } from '../db/tables.js';
import { companyPairsNow } from './repository.js';

export type Confirmation =
  /** The caller's scope does not depend on companies: the catalogue's answer stands. */
  | { kind: 'not_needed' }
  /** Every site is still the caller's; its audit row keeps these pairs (the companies at the change). */
  | { kind: 'confirmed'; pairs: string[] }
  /** A site is no longer the caller's (its index in `siteIds`): answered as a site or device outside the scope. */
  | { kind: 'outside'; index: number };

/**
 * Whether `siteIds` (which the catalogue let `principal` see) are still its sites now. A database error is the API's
 * problem (503): a change is not made on a scope that cannot be confirmed. `onStale` runs when the catalogue was
 * found out of date (a refresh of it, so the next caller is answered from the sites of now).
 */
export async function confirmCompanies(
  db: Kysely<GatewayDatabase>,
  principal: Principal,
  siteIds: readonly string[],
  onStale: () => void,
): Promise<Confirmation> {
  const companies = principal.companies;
  if (companies === null || siteIds.length === 0) return { kind: 'not_needed' };
  const pairs = await companyPairsNow(db, siteIds).catch((err: unknown) => {
    throw mapDbError(err);
  });
  const companyNow = new Map(pairs.map((p) => [p.slice(0, p.indexOf('/')), p.slice(p.indexOf('/') + 1)]));
  const index = siteIds.findIndex((site) => {
    if (principal.sites?.has(site) === true) return false;
    const company = companyNow.get(site);
    return company === undefined || !companies.has(company);
  });
  if (index >= 0) {
    onStale();
    return { kind: 'outside', index };
  }
  return { kind: 'confirmed', pairs };
}

/** `row` with the companies a confirmation read (the change's own), else as it is (the queue stamps it). */
export function withConfirmedCompanies(row: AuditRow, confirmation: Confirmation): AuditRow {
  return confirmation.kind === 'confirmed' ? { ...row, site_companies: confirmation.pairs } : row;
}
