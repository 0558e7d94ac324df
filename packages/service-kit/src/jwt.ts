// Verification of the platform realm's access tokens against its JWKS (design §4.1), shared by the workflow
// (portal users) and the device gateway (operations users, design §3.1): the JWS spelling, the signature, the
// registered claims and the claims every service of the platform requires are checked here once; what a
// service grants (a database role, a fleet role and scope) is its own `authorize` step.
import { createRemoteJWKSet, errors, jwtVerify } from 'jose';
import type { JWTPayload, RemoteJWKSet } from 'jose';
import { unstorableTextPaths } from './text.js';

export interface JwtVerifierSettings {
  /** e.g. `http://localhost:8180/realms/platform`; must equal the token's `iss` exactly. */
  issuerUrl: string;
  /** The realm's JWKS, e.g. Keycloak's `{issuer}/protocol/openid-connect/certs`. */
  jwksUrl: string;
  /** Required as `azp`, the client the token was issued to. */
  clientId: string;
  /** Allowed clock skew for `exp`/`nbf`/`iat`, in seconds. */
  clockToleranceS: number;
  /**
   * Longest lifetime a token may claim, in seconds: an `exp` further ahead than this (plus the skew) is
   * refused. Keycloak's access tokens live minutes; a token that claims to live for ages was not issued by a
   * realm configured as ours. Default 3600.
   */
  maxTokenLifetimeS?: number;
  /**
   * Minimum time between two JWKS fetches caused by an unknown `kid`, in milliseconds; bounds how
   * often forged tokens can make the service call the issuer.
   */
  jwksCooldownMs: number;
  /** Keys are refetched after this age even without an unknown `kid`, in milliseconds. */
  jwksCacheMaxAgeMs: number;
  /** Timeout of one JWKS request, in milliseconds. */
  jwksTimeoutMs: number;
  /**
   * How long a token that passed every check is remembered, in milliseconds (0: never); see
   * `VerifiedTokenCache`. Bounds how long a token signed with a key the issuer has since removed keeps
   * being accepted.
   */
  tokenCacheTtlMs: number;
  /** Most tokens remembered at once (the oldest is forgotten first). */
  tokenCacheMaxEntries: number;
  /** The clock, in ms since the epoch; tests move it. Default `Date.now`. */
  now?: () => number;
}

/** A verified caller of type `U`, or why not. */
export type JwtVerification<U> =
  | { ok: true; user: U }
  /** 401: the token is not one of ours or not valid now. `detail` is safe to return. */
  | { ok: false; reason: 'invalid_token'; detail: string }
  /** 403: a genuine, valid token without the role the service requires. */
  | { ok: false; reason: 'insufficient_role'; detail: string }
  /** 503: the signing keys could not be fetched, so no token can be judged. */
  | { ok: false; reason: 'keys_unavailable'; detail: string; cause: unknown };

/** The claims of a token that passed every common check: `sub` is a non-empty string. */
export type VerifiedClaims = JWTPayload & { sub: string };

/**
 * A service's own decision on a genuine token: its user, a refusal for want of a role (403), or a refusal of
 * the token's content (401, e.g. a malformed scope claim). `detail` is safe to return.
 */
export type JwtAuthorization<U> = { user: U } | { forbidden: string } | { invalid: string };

export interface JwtVerifier<U> {
  verify(token: string): Promise<JwtVerification<U>>;
  /** Verifications answered from the cache and by a full check, since start. */
  cacheStats(): { hits: number; misses: number; entries: number };
  /** True once signing keys are held; tries one fetch when none are held yet. */
  keysLoaded(): Promise<boolean>;
  readonly jwksUrl: string;
}

/** The base64url alphabet (RFC 4648 §5), without padding: what each part of a compact JWS may hold. */
const BASE64URL_PART = /^[A-Za-z0-9_-]+$/;

/**
 * Whether `part` is the one canonical base64url spelling of its bytes: RFC 7515 §2 defines BASE64URL without
 * padding, and RFC 4648 §3.5 canonical encoding has the unused bits of the last character zero (a length of
 * 1 mod 4 spells no bytes at all). jose decodes leniently (padding, non-zero unused bits), so without this a
 * token could be respelled (`==` appended to the signature, the last character's unused bits changed) and still
 * verify: a second string for one token, which no issuer produced.
 */
function isCanonicalBase64url(part: string): boolean {
  if (!BASE64URL_PART.test(part) || part.length % 4 === 1) return false;
  return Buffer.from(part, 'base64url').toString('base64url') === part;
}

/** A compact JWS (RFC 7515 §7.1): three parts, each canonical base64url. */
function isCanonicalCompactJws(token: string): boolean {
  const parts = token.split('.');
  return parts.length === 3 && parts.every(isCanonicalBase64url);
}

/** RSA and EC signatures only: `none` and every HMAC algorithm are refused before any key lookup. */
const allowedAlgorithms = ['RS256', 'ES256'];

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

/**
 * Tokens that passed every check, remembered so the next request with the same token skips the
 * signature check. A client sends one access token with every call for its lifetime (minutes), and
 * checking an RS256 signature through WebCrypto cost about 0.1–0.3 ms of CPU per request here, a tenth
 * of an upload intent's (bench:workflow profile). What a hit still checks is what can change after the
 * full check: `exp` (with the same tolerance jose applies). `nbf`, `iss`, `aud`/`azp`, the role and the
 * signature are facts of the token string, which is the key. Only successes are cached, so a forged or
 * expired token never is, and every entry is dropped after `ttlMs` even if the token lives longer.
 */
class VerifiedTokenCache<U> {
  private readonly entries = new Map<string, { user: U; expS: number; until: number }>();
  hits = 0;
  misses = 0;

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries: number,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  /** The cached entry for `token` if it is still within its TTL, else undefined (and forgotten). */
  get(token: string, nowMs: number): { user: U; expS: number } | undefined {
    const entry = this.entries.get(token);
    if (entry === undefined) {
      this.misses++;
      return undefined;
    }
    if (nowMs >= entry.until) {
      this.entries.delete(token);
      this.misses++;
      return undefined;
    }
    this.hits++;
    return entry;
  }

  set(token: string, user: U, expS: number, nowMs: number): void {
    if (this.ttlMs <= 0 || this.maxEntries <= 0) return;
    // Map keeps insertion order: the first key is the oldest entry.
    if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
    this.entries.set(token, { user, expS, until: nowMs + this.ttlMs });
  }

  delete(token: string): void {
    this.entries.delete(token);
  }
}

/** A refusal of a token that is not one of ours or not valid now (401). */
function invalid<U>(detail: string): JwtVerification<U> {
  return { ok: false, reason: 'invalid_token', detail };
}

/** The JWKS as jose fetches and caches it (design §4.1: refetched on an unknown `kid`, within a deadline). */
function remoteKeySet(settings: JwtVerifierSettings): RemoteJWKSet {
  return createRemoteJWKSet(new URL(settings.jwksUrl), {
    cooldownDuration: settings.jwksCooldownMs,
    cacheMaxAge: settings.jwksCacheMaxAgeMs,
    timeoutDuration: settings.jwksTimeoutMs,
  });
}

/** The signature, `iss`, `exp`/`nbf` and the algorithm, by jose: the payload, or why not. */
async function verifySignature<U>(
  token: string,
  keySet: RemoteJWKSet,
  settings: JwtVerifierSettings,
  checkedAt: number,
): Promise<{ payload: JWTPayload } | { refusal: JwtVerification<U> }> {
  try {
    const { payload } = await jwtVerify(token, keySet, {
      issuer: settings.issuerUrl,
      algorithms: allowedAlgorithms,
      clockTolerance: settings.clockToleranceS,
      requiredClaims: ['exp', 'sub'],
      currentDate: new Date(checkedAt),
    });
    return { payload };
  } catch (err) {
    if (keySetFailure(err)) {
      return {
        refusal: {
          ok: false,
          reason: 'keys_unavailable',
          detail: 'The signing keys could not be fetched.',
          cause: err,
        },
      };
    }
    return { refusal: invalid(describe(err)) };
  }
}

/**
 * The claims jose does not check (design §4.1), in its order: `azp`, `iat`, the lifetime, `sub`, `typ`, text
 * PostgreSQL can store; then the service's own `authorize` (a missing role is 403 rather than 401: the token
 * itself is genuine). The user, or why not.
 */
function checkClaims<U>(
  payload: JWTPayload,
  settings: JwtVerifierSettings,
  checkedAt: number,
  authorize: (claims: VerifiedClaims) => JwtAuthorization<U>,
): { user: U } | { refusal: JwtVerification<U> } {
  const claims = payload as JWTPayload & { azp?: unknown; typ?: unknown };
  const nowS = Math.floor(checkedAt / 1000);
  const refused = (detail: string) => ({ refusal: invalid<U>(detail) });
  // Keycloak names the client a token was issued to in `azp`; the read surface's pre-request function
  // requires it to be ours, and so does every service: one rule on every path (an `aud` that merely lists
  // us is a token issued to another client).
  if (claims.azp !== settings.clientId) return refused('The access token was not issued for this client.');
  if (typeof claims.iat === 'number' && claims.iat > nowS + settings.clockToleranceS)
    return refused('The access token was issued in the future.');
  // requiredClaims made jose check that exp is present and a number.
  if ((claims.exp as number) > nowS + (settings.maxTokenLifetimeS ?? 3600) + settings.clockToleranceS)
    return refused('The access token claims a longer lifetime than this service accepts.');
  if (typeof claims.sub !== 'string' || claims.sub.length === 0)
    return refused('The access token has no subject.');
  // Keycloak marks its tokens with `typ`: `Bearer` for access tokens, `ID` and `Refresh` for the
  // others, which carry the same iss, azp and aud. Only an access token may call the API, so a token
  // that says it is something else is refused even if a mapper put the role into it.
  if (claims.typ !== undefined && claims.typ !== 'Bearer')
    return refused('The token is not an access token.');
  // The claims travel into PostgreSQL (the workflow's request.jwt.claims as jsonb, the gateway's audit rows),
  // which refuses U+0000 and cannot hold an unpaired surrogate: such a token, however well signed, is refused
  // here rather than failing inside a transaction.
  if (unstorableTextPaths(payload).length > 0)
    return refused('The access token contains text PostgreSQL cannot store (NUL or an unpaired surrogate).');
  const decision = authorize({ ...payload, sub: claims.sub });
  if ('invalid' in decision) return refused(decision.invalid);
  if ('forbidden' in decision)
    return { refusal: { ok: false, reason: 'insufficient_role', detail: decision.forbidden } };
  return decision;
}

/**
 * Verifies in steps: a remembered token (only `exp` re-checked), the compact JWS's canonical spelling, the
 * signature and registered claims (jose), the platform's common claims, then the service's `authorize`; a
 * token that passed is remembered.
 */
export function createJwtVerifier<U>(
  settings: JwtVerifierSettings,
  authorize: (claims: VerifiedClaims) => JwtAuthorization<U>,
): JwtVerifier<U> {
  const now = settings.now ?? Date.now;
  const cache = new VerifiedTokenCache<U>(settings.tokenCacheTtlMs, settings.tokenCacheMaxEntries);
  const keySet = remoteKeySet(settings);
  let lastKeyFetchAt = -Infinity;

  return {
    jwksUrl: settings.jwksUrl,

    cacheStats() {
      return { hits: cache.hits, misses: cache.misses, entries: cache.size };
    },

    async verify(token) {
      const checkedAt = now();
      const cached = cache.get(token, checkedAt);
      if (cached !== undefined) {
        // jose's rule: expired once exp <= now - tolerance (seconds).
        if (cached.expS > Math.floor(checkedAt / 1000) - settings.clockToleranceS) {
          return { ok: true, user: cached.user };
        }
        cache.delete(token);
        return invalid('The access token has expired.');
      }
      // Before jose, which would accept another spelling of a genuine token. (A cached token passed this.)
      if (!isCanonicalCompactJws(token)) return invalid('The access token is not a compact JWS.');
      const verified = await verifySignature<U>(token, keySet, settings, checkedAt);
      if ('refusal' in verified) return verified.refusal;
      const checked = checkClaims(verified.payload, settings, checkedAt, authorize);
      if ('refusal' in checked) return checked.refusal;
      // requiredClaims made jose check that exp is present and a number.
      cache.set(token, checked.user, verified.payload.exp as number, checkedAt);
      return { ok: true, user: checked.user };
    },

    async keysLoaded() {
      if (keySet.jwks() !== undefined) return true;
      // /ready is unauthenticated and probed often: while the issuer is down, fetch at most once per
      // cooldown (the same bound as unknown-kid refreshes) instead of once per probe.
      // The monotonic clock, not `now` (the tokens' clock, injectable and steppable): a clock moved back
      // must not keep /ready failing after the issuer has come back.
      const at = performance.now();
      if (at - lastKeyFetchAt < settings.jwksCooldownMs) return false;
      lastKeyFetchAt = at;
      try {
        await keySet.reload();
      } catch {
        return false;
      }
      return keySet.jwks() !== undefined;
    },
  };
}

/** Keycloak's JWKS address for a realm's issuer URL (`{issuer}/protocol/openid-connect/certs`). */
export function keycloakJwksUrl(issuerUrl: string): string {
  return `${issuerUrl.replace(/\/+$/, '')}/protocol/openid-connect/certs`;
}
