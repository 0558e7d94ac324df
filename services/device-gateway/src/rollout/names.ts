// Which rollouts a caller may name (issue 42 §3, design §3.9). A caller limited to sites sees a rollout only when
// every target is at one of its sites; any other rollout is never named to it, wherever it would otherwise appear:
// a layer of its own device (device view, overrides list), a conflict that refuses its creation or rollback, an
// audit row. Such a place keeps what concerns the caller (its device's settings come from a rollout; its creation
// overlaps an open one) and withholds the id, marked `rollout_outside_scope: true`.
import type { Kysely } from 'kysely';
import type { Principal } from '../auth/principal.js';
import type { GatewayDatabase } from '../db/tables.js';
import type { SiteCatalogue } from '../sites/catalogue.js';
import { rolloutsWithinScope, type SiteScope } from './sql.js';

/** The principal's scope (Principal.siteCondition, its sites' companies now); undefined: it sees every site. */
export function siteScopeOf(principal: Principal, sites: SiteCatalogue): SiteScope | undefined {
  if (principal.unscoped) return undefined;
  return {
    site: (column) => principal.siteCondition(column, sites),
    pairs: sites.companyPairs(principal.siteIds(sites) ?? []),
  };
}

type Json = unknown;

/** Every `rollout_id` string found in `value`'s objects and arrays. */
function rolloutIdsIn(value: Json, into: Set<string>): Set<string> {
  if (Array.isArray(value)) for (const v of value) rolloutIdsIn(v, into);
  else if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      if (k === 'rollout_id' && typeof v === 'string') into.add(v);
      else if (k !== 'settings') rolloutIdsIn(v, into);
    }
  }
  return into;
}

/** `value` with each object naming a rollout outside `named` rewritten: no `rollout_id`, `rollout_outside_scope`. */
function withhold(value: Json, named: ReadonlySet<string>): Json {
  if (Array.isArray(value)) return value.map((v) => withhold(v, named));
  if (value === null || typeof value !== 'object') return value;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    if (k === 'rollout_id' && typeof v === 'string' && !named.has(v)) out.rollout_outside_scope = true;
    // A layer's settings are the device's document: never rewritten.
    else out[k] = k === 'settings' ? v : withhold(v, named);
  }
  return out;
}

/**
 * `value` (an answer about the caller's own devices) with every rollout the caller may not see withheld: one read
 * for all the ids it names, none for an unscoped caller.
 */
export async function withholdUnseenRollouts<T>(
  db: Kysely<GatewayDatabase>,
  value: T,
  scope: SiteScope | undefined,
): Promise<T> {
  if (scope === undefined) return value;
  const ids = [...rolloutIdsIn(value, new Set())];
  if (ids.length === 0) return value;
  const named = await rolloutsWithinScope(db, ids, scope);
  return named.size === ids.length ? value : (withhold(value, named) as T);
}
