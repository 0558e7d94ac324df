// People on /api (design §3.1, issue 42 §2): the platform realm's access tokens issued to the operations client,
// verified by service-kit's verifier (the workflow's checks: JWS spelling, signature by the realm's JWKS with
// rotation, iss, exp/nbf/iat, lifetime, azp, typ), then read for the fleet role and scope:
// - the role: the operations client's roles (Keycloak's `resource_access.<client>.roles`), the highest of viewer,
//   operator, admin; none of them is 403;
// - the scope: `fleet_sites` and `fleet_companies` (user attributes the realm's mappers put in the token, arrays of
//   uuids); neither present is the whole fleet. A malformed scope is 401: the token is refused, never widened.
import {
  createJwtVerifier,
  keycloakJwksUrl,
  type JwtVerifier,
  type VerifiedClaims,
} from '@platform/service-kit';
import { isUuid } from '@platform/contracts';
import { Principal, ROLES, type Role } from './principal.js';

export interface OperationsTokenSettings {
  issuerUrl: string;
  /** Default: Keycloak's `{issuer}/protocol/openid-connect/certs`. */
  jwksUrl?: string | undefined;
  /** The operations client (`azp`); default `platform-operations`. */
  clientId: string;
  clockToleranceS: number;
  maxTokenLifetimeS: number;
  jwksTimeoutMs: number;
  /** Unknown-kid refetches at most this often (ms). */
  jwksCooldownMs?: number;
  now?: () => number;
}

/** A subject the audit can hold: 1-255 visible ASCII characters (RFC 7519 §4.1.2 allows any string). */
const SUBJECT = /^[\x21-\x7e]{1,255}$/;

/** Most sites or companies one token may name; more is refused rather than trusted. */
const MAX_SCOPE_ENTRIES = 1000;

function scopeClaim(value: unknown): string[] | null | 'invalid' {
  // Only an absent claim is no scope. JSON null is malformed: a mapper that emptied an attribute must not widen
  // its user to the whole fleet (second cold review of issue 42).
  if (value === undefined) return null;
  const list = typeof value === 'string' ? [value] : value;
  if (!Array.isArray(list) || list.length > MAX_SCOPE_ENTRIES || !list.every(isUuid)) return 'invalid';
  return list.map((id) => id.toLowerCase());
}

/** The highest fleet role among the operations client's roles, or undefined. */
function fleetRole(claims: VerifiedClaims, clientId: string): Role | undefined {
  const access = (claims as { resource_access?: Record<string, { roles?: unknown }> }).resource_access;
  const roles = access?.[clientId]?.roles;
  if (!Array.isArray(roles)) return undefined;
  let best: Role | undefined;
  for (const role of ROLES) if (roles.includes(role)) best = role;
  return best;
}

export function authorizeOperations(clientId: string) {
  return (claims: VerifiedClaims) => {
    const role = fleetRole(claims, clientId);
    if (role === undefined)
      return { forbidden: 'The access token grants no fleet role (viewer, operator or admin).' };
    const sites = scopeClaim((claims as Record<string, unknown>).fleet_sites);
    const companies = scopeClaim((claims as Record<string, unknown>).fleet_companies);
    if (sites === 'invalid' || companies === 'invalid')
      return { invalid: 'The access token has a malformed fleet scope.' };
    // The subject names the person in every audit row (`user:<sub>`, at most 300 characters): a subject the audit
    // could not hold would let a change through with its row refused (third cold review). Keycloak's are UUIDs.
    if (!SUBJECT.test(claims.sub)) return { invalid: 'The access token has a malformed subject.' };
    const username = (claims as { preferred_username?: unknown }).preferred_username;
    return {
      user: new Principal({
        kind: 'user',
        id: `user:${claims.sub}`,
        name: typeof username === 'string' && username !== '' ? username.slice(0, 200) : claims.sub,
        role,
        sites,
        companies,
      }),
    };
  };
}

export type OperationsTokenVerifier = JwtVerifier<Principal>;

export function createOperationsTokenVerifier(settings: OperationsTokenSettings): OperationsTokenVerifier {
  return createJwtVerifier<Principal>(
    {
      issuerUrl: settings.issuerUrl,
      jwksUrl: settings.jwksUrl ?? keycloakJwksUrl(settings.issuerUrl),
      clientId: settings.clientId,
      clockToleranceS: settings.clockToleranceS,
      maxTokenLifetimeS: settings.maxTokenLifetimeS,
      jwksCooldownMs: settings.jwksCooldownMs ?? 30_000,
      // Keys are refetched every 10 minutes, and at once (within the cooldown) for an unknown kid: rotation.
      jwksCacheMaxAgeMs: 600_000,
      jwksTimeoutMs: settings.jwksTimeoutMs,
      // A token is checked in full at most once a minute; a key the realm withdrew stops working within that.
      tokenCacheTtlMs: 60_000,
      tokenCacheMaxEntries: 10_000,
      ...(settings.now === undefined ? {} : { now: settings.now }),
    },
    authorizeOperations(settings.clientId),
  );
}
