// Verification of Keycloak access tokens against the realm's JWKS (DESIGN 4.1).
import { createRemoteJWKSet, errors, jwtVerify } from 'jose';
import type { JWTPayload, RemoteJWKSet } from 'jose';
import { jwksUrlOf } from '@platform/enterprise-db';

export interface TokenVerifierSettings {
  /** e.g. `http://localhost:8180/realms/platform`; must equal the token's `iss` exactly. */
  issuerUrl: string;
  /** Defaults to Keycloak's `{issuer}/protocol/openid-connect/certs`. */
  jwksUrl?: string | undefined;
  /** Accepted as `azp`, or as one of `aud`. */
  clientId: string;
  /** The `role` claim a portal user carries (PostgREST switches to this role too). */
  requiredRole: string;
  /** Allowed clock skew for `exp`/`nbf`/`iat`, in seconds. */
  clockToleranceS: number;
  /**
   * Minimum time between two JWKS fetches caused by an unknown `kid`, in milliseconds; bounds how
   * often forged tokens can make the service call the issuer.
   */
  jwksCooldownMs: number;
  /** Keys are refetched after this age even without an unknown `kid`, in milliseconds. */
  jwksCacheMaxAgeMs: number;
  /** Timeout of one JWKS request, in milliseconds. */
  jwksTimeoutMs: number;
}

/** A verified portal user; `claims` is the whole payload, handed to the database as PostgREST does. */
export interface PortalUser {
  sub: string;
  claims: JWTPayload & { sub: string; role: string };
}

export type Verification =
  | { ok: true; user: PortalUser }
  /** 401: the token is not one of ours or not valid now. `detail` is safe to return. */
  | { ok: false; reason: 'invalid_token'; detail: string }
  /** 403: a genuine, valid token without the portal role. */
  | { ok: false; reason: 'insufficient_role'; detail: string }
  /** 503: the signing keys could not be fetched, so no token can be judged. */
  | { ok: false; reason: 'keys_unavailable'; detail: string; cause: unknown };

/** RSA and EC signatures only: `none` and every HMAC algorithm are refused before any key lookup. */
const allowedAlgorithms = ['RS256', 'ES256'];

export interface TokenVerifier {
  verify(token: string): Promise<Verification>;
  /** True once signing keys are held; tries one fetch when none are held yet. */
  keysLoaded(): Promise<boolean>;
  readonly jwksUrl: string;
}

function keySetFailure(err: unknown): boolean {
  if (!(err instanceof errors.JOSEError)) return true; // fetch() rejected: DNS, refused, reset
  return (
    err instanceof errors.JWKSTimeout ||
    err instanceof errors.JWKSInvalid ||
    // jose reports a non-200 or non-JSON JWKS response as a generic JOSEError.
    (err.code === 'ERR_JOSE_GENERIC' && /JSON Web Key Set/.test(err.message))
  );
}

function describe(err: unknown): string {
  if (err instanceof errors.JWTExpired) return 'The access token has expired.';
  if (err instanceof errors.JWTClaimValidationFailed) {
    if (err.claim === 'nbf') return 'The access token is not valid yet.';
    if (err.claim === 'iss') return 'The access token was issued by an untrusted issuer.';
    return `The access token has an invalid "${err.claim}" claim.`;
  }
  if (err instanceof errors.JOSEAlgNotAllowed)
    return 'The access token is signed with an algorithm that is not accepted.';
  if (err instanceof errors.JWKSNoMatchingKey) return 'The access token is signed with an unknown key.';
  return 'The access token is invalid.';
}

export function createTokenVerifier(settings: TokenVerifierSettings): TokenVerifier {
  const jwksUrl = settings.jwksUrl ?? jwksUrlOf(settings.issuerUrl);
  const keySet: RemoteJWKSet = createRemoteJWKSet(new URL(jwksUrl), {
    cooldownDuration: settings.jwksCooldownMs,
    cacheMaxAge: settings.jwksCacheMaxAgeMs,
    timeoutDuration: settings.jwksTimeoutMs,
  });

  return {
    jwksUrl,

    async verify(token) {
      let payload: JWTPayload;
      try {
        ({ payload } = await jwtVerify(token, keySet, {
          issuer: settings.issuerUrl,
          algorithms: allowedAlgorithms,
          clockTolerance: settings.clockToleranceS,
          requiredClaims: ['exp', 'sub'],
        }));
      } catch (err) {
        if (keySetFailure(err)) {
          return {
            ok: false,
            reason: 'keys_unavailable',
            detail: 'The signing keys could not be fetched.',
            cause: err,
          };
        }
        return { ok: false, reason: 'invalid_token', detail: describe(err) };
      }

      const audiences =
        payload.aud === undefined ? [] : Array.isArray(payload.aud) ? payload.aud : [payload.aud];
      const azp = (payload as { azp?: unknown }).azp;
      if (azp !== settings.clientId && !audiences.includes(settings.clientId)) {
        return {
          ok: false,
          reason: 'invalid_token',
          detail: 'The access token was not issued for this client.',
        };
      }
      if (typeof payload.sub !== 'string' || payload.sub.length === 0) {
        return { ok: false, reason: 'invalid_token', detail: 'The access token has no subject.' };
      }
      // The claims travel into PostgreSQL as jsonb (request.jwt.claims), which refuses U+0000: such a
      // token, however well signed, is refused here rather than failing inside the transaction.
      if (JSON.stringify(payload).includes('\\u0000')) {
        return { ok: false, reason: 'invalid_token', detail: 'The access token contains a NUL character.' };
      }
      const role = (payload as { role?: unknown }).role;
      if (role !== settings.requiredRole) {
        return {
          ok: false,
          reason: 'insufficient_role',
          detail: 'The access token does not grant the portal role.',
        };
      }
      return { ok: true, user: { sub: payload.sub, claims: { ...payload, sub: payload.sub, role } } };
    },

    async keysLoaded() {
      if (keySet.jwks() !== undefined) return true;
      try {
        await keySet.reload();
      } catch {
        return false;
      }
      return keySet.jwks() !== undefined;
    },
  };
}
