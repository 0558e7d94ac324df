// Who is calling /api (design §3.1, issue 42 §2): a person signed in with the platform realm, a named API key, the
// specification's anonymous API key, or the gateway itself (the rollout driver, the device-key command). Each has a
// role and, optionally, a scope of sites or companies; routes ask `may(action)` and `seesSite(siteId)`, lists
// filter with `siteIds()`.
import { sql, type RawBuilder } from 'kysely';
import { DomainError } from '@platform/service-kit';
import type { SiteCatalogue } from '../sites/catalogue.js';

/** Roles in increasing power; each may do what the ones before it may. */
export const ROLES = ['viewer', 'operator', 'admin'] as const;
export type Role = (typeof ROLES)[number];

export function isRole(value: unknown): value is Role {
  return typeof value === 'string' && (ROLES as readonly string[]).includes(value);
}

/**
 * What a principal may do, and the least role that may. `fleetWide` actions touch every site at once (a reload
 * re-reads the whole registry; the configuration names every key and its sites), so a principal limited to
 * sites or companies may not do them whatever its role.
 */
export const ACTIONS = {
  /** Lists, the device view, rollout reads. */
  'fleet.read': { role: 'viewer', fleetWide: false },
  /** notify-settings / update-settings (an override). */
  'settings.notify': { role: 'operator', fleetWide: false },
  /** Create, pause, resume, cancel, roll back, promote a rollout. */
  'rollout.change': { role: 'operator', fleetWide: false },
  /** GET /api/audit (rows of the principal's sites only when scoped). */
  'audit.read': { role: 'operator', fleetWide: false },
  /** Issue, rotate, revoke device keys. */
  'keys.manage': { role: 'admin', fleetWide: false },
  /** reload-registry / register-device. */
  'registry.reload': { role: 'admin', fleetWide: true },
  /** GET /api/config: names every API key and the sites it is limited to. */
  'config.read': { role: 'admin', fleetWide: true },
  /** A route the policy (auth/route-policy.ts) does not name: the unscoped admin only, until it is named. */
  'route.unlisted': { role: 'admin', fleetWide: true },
} as const satisfies Record<string, { role: Role; fleetWide: boolean }>;
export type Action = keyof typeof ACTIONS;

/** How the principal proved itself; the audit's `principal_kind`. */
export type PrincipalKind = 'user' | 'api_key' | 'anonymous_key' | 'driver' | 'command';

export interface PrincipalInit {
  kind: PrincipalKind;
  /**
   * The stable identity the audit filters by: `user:<sub>`, `key:<name>`, `api-key` (the anonymous key),
   * `driver`, `command:<os user>`.
   */
  id: string;
  /** What people read: the user's `preferred_username` (else sub), the key's name. */
  name: string;
  role: Role;
  /** Limited to these sites (null: not limited by site). */
  sites?: readonly string[] | null;
  /** Limited to these companies' sites (null: not limited by company). */
  companies?: readonly string[] | null;
}

export class Principal {
  readonly kind: PrincipalKind;
  readonly id: string;
  readonly name: string;
  readonly role: Role;
  readonly sites: ReadonlySet<string> | null;
  readonly companies: ReadonlySet<string> | null;

  constructor(init: PrincipalInit) {
    this.kind = init.kind;
    this.id = init.id;
    this.name = init.name;
    this.role = init.role;
    this.sites = init.sites == null ? null : new Set(init.sites);
    this.companies = init.companies == null ? null : new Set(init.companies);
  }

  /** Not limited to sites or companies: sees the whole fleet. */
  get unscoped(): boolean {
    return this.sites === null && this.companies === null;
  }

  /** Whether the role allows `action` (and, for a fleet-wide one, the principal is unscoped). */
  may(action: Action): boolean {
    const rule = ACTIONS[action];
    if (ROLES.indexOf(this.role) < ROLES.indexOf(rule.role)) return false;
    return !rule.fleetWide || this.unscoped;
  }

  /**
   * Whether the principal sees `siteId`: unscoped, one of its sites, or a site of one of its companies (by the
   * platform's catalogue; a company scope on a gateway without the platform's sites sees nothing).
   */
  seesSite(siteId: string, catalogue: SiteCatalogue): boolean {
    if (this.unscoped) return true;
    if (this.sites?.has(siteId) === true) return true;
    if (this.companies === null) return false;
    const company = catalogue.companyOf(siteId);
    return company !== undefined && this.companies.has(company);
  }

  /** The sites a scoped principal sees, sorted; null when unscoped (every site). */
  siteIds(catalogue: SiteCatalogue): string[] | null {
    if (this.unscoped) return null;
    const ids = new Set(this.sites ?? []);
    if (this.companies !== null) for (const s of catalogue.sitesOfCompanies(this.companies)) ids.add(s);
    return [...ids].sort();
  }

  /**
   * A WHERE condition on a site id column for site-scoped lists: `TRUE` for an unscoped principal, else
   * `<column> = ANY(<its site ids>::uuid[])` (an index condition; an empty list matches nothing). `column` is
   * the caller's SQL (e.g. sql.ref('r.site_id')), never text from a request.
   */
  siteCondition(column: RawBuilder<unknown>, catalogue: SiteCatalogue) {
    const ids = this.siteIds(catalogue);
    return ids === null ? sql<boolean>`TRUE` : sql<boolean>`${column} = ANY(${ids}::uuid[])`;
  }

  /** Throws 403 `forbidden` unless `may(action)`. */
  require(action: Action): void {
    if (!this.may(action)) throw forbidden(this, action);
  }

  /** What logs carry (never a secret): `principal` and `principal_kind`. */
  logFields(): { principal: string; principal_kind: PrincipalKind } {
    return { principal: this.id, principal_kind: this.kind };
  }
}

/** 403: valid credentials without the role (or a scoped principal asking for a fleet-wide action). */
export function forbidden(principal: Principal, action: Action): DomainError {
  const rule = ACTIONS[action];
  const why =
    ROLES.indexOf(principal.role) < ROLES.indexOf(rule.role)
      ? `needs the ${rule.role} role`
      : 'touches every site, and the caller is limited to some';
  return new DomainError('forbidden', `This action (${action}) ${why}.`);
}

/**
 * The specification's `Authorization: Bearer <API key>` (design §3.1): it could do everything before principals
 * existed, so it stays an unscoped admin, and the audit names it `api-key`.
 */
export const ANONYMOUS_KEY = new Principal({
  kind: 'anonymous_key',
  id: 'api-key',
  name: 'API key',
  role: 'admin',
});

/** The rollout driver's own decisions (waves advanced, rollouts halted by their rules). */
export const DRIVER = new Principal({ kind: 'driver', id: 'driver', name: 'rollout driver', role: 'admin' });

/** What an operator command's principal may be called: audit ids stay filterable (GET /api/audit's `principal`). */
export const COMMAND_OPERATOR_PATTERN = /^[A-Za-z0-9._@-]{1,100}$/;

/**
 * An operator command run on a host with the owner login (`npm run device-key`): `command:<operator>`, the
 * operator being its `--by` or the OS user (cli/device-key-command.ts). An unscoped admin: the owner login can
 * change anything, so the command's principal claims nothing beyond what the login already may.
 */
export function commandPrincipal(operator: string): Principal {
  if (!COMMAND_OPERATOR_PATTERN.test(operator))
    throw new Error('an operator name must match COMMAND_OPERATOR_PATTERN');
  return new Principal({ kind: 'command', id: `command:${operator}`, name: operator, role: 'admin' });
}
