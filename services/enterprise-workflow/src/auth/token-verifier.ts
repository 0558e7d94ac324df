// Verification of Keycloak access tokens against the realm's JWKS (design §4.1): service-kit's verifier (shared
// with the device gateway), with the portal's own decision: the `role` claim PostgREST switches to.
import { jwksUrlOf } from '@platform/enterprise-db';
import {
  createJwtVerifier,
  type JwtVerification,
  type JwtVerifier,
  type JwtVerifierSettings,
} from '@platform/service-kit';
import type { PortalUser } from '../domain/ports.js';

export interface TokenVerifierSettings extends Omit<JwtVerifierSettings, 'jwksUrl'> {
  /** Defaults to Keycloak's `{issuer}/protocol/openid-connect/certs`. */
  jwksUrl?: string | undefined;
  /** The `role` claim a portal user carries (PostgREST switches to this role too). */
  requiredRole: string;
}

/** A verified portal user; `claims` is the whole payload, handed to the database as PostgREST does. */
export type Verification = JwtVerification<PortalUser>;

export type TokenVerifier = JwtVerifier<PortalUser>;

/**
 * Verifies as service-kit's `createJwtVerifier` does (the JWS spelling, signature, `iss`, `exp`/`nbf`, `azp`,
 * `iat`, the lifetime, `sub`, `typ`, storable text), then requires `role = requiredRole` (403 without it).
 */
export function createTokenVerifier(settings: TokenVerifierSettings): TokenVerifier {
  const { requiredRole, jwksUrl, ...common } = settings;
  return createJwtVerifier<PortalUser>(
    { ...common, jwksUrl: jwksUrl ?? jwksUrlOf(settings.issuerUrl) },
    (claims) => {
      const role = (claims as { role?: unknown }).role;
      if (role !== requiredRole) return { forbidden: 'The access token does not grant the portal role.' };
      return { user: { sub: claims.sub, claims: { ...claims, sub: claims.sub, role } } };
    },
  );
}
