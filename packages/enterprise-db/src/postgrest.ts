// PostgREST authentication settings kept in the database (enterprise.postgrest_settings), served to
// PostgREST by postgrest.pre_config() and checked by postgrest.pre_request(). PostgREST cannot fetch
// a JWKS URL itself (PostgREST issue #4137), so the key set is fetched here and installed; a
// `NOTIFY pgrst, 'reload config'` makes a running PostgREST re-read it.
import { sql } from 'kysely';
import type { Kysely } from 'kysely';

export interface PostgrestAuthSettings {
  /** Expected `iss`, e.g. http://localhost:8180/realms/platform. */
  issuer: string;
  /** Expected `azp` and PostgREST's jwt-aud, e.g. platform-enterprise-web. */
  clientId: string;
  /** The issuer's JSON Web Key Set (public keys). */
  jwks: { keys: JsonWebKeyLike[] };
}

export interface JsonWebKeyLike {
  kty: string;
  kid?: string;
  [member: string]: unknown;
}

// Members that only private or symmetric keys have (RFC 7518 section 6).
const PRIVATE_MEMBERS = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth', 'k'];

export class JwksError extends Error {
  override readonly name = 'JwksError';
}

/** Keeps the RSA and EC signing keys of a JWKS, refusing any key that carries private material. */
export function publicSigningKeys(jwks: unknown): { keys: JsonWebKeyLike[] } {
  const keys = (jwks as { keys?: unknown } | null)?.keys;
  if (!Array.isArray(keys)) throw new JwksError('the JWKS has no "keys" array');
  const kept: JsonWebKeyLike[] = [];
  for (const key of keys as unknown[]) {
    if (typeof key !== 'object' || key === null) throw new JwksError('a JWKS entry is not an object');
    const k = key as JsonWebKeyLike;
    if (PRIVATE_MEMBERS.some((m) => m in k))
      throw new JwksError(`key ${k.kid ?? '(no kid)'} carries private or symmetric material`);
    // Keycloak also publishes encryption keys (use "enc"); PostgREST only verifies signatures.
    if ((k.kty === 'RSA' || k.kty === 'EC') && k.use !== 'enc') kept.push(k);
  }
  if (kept.length === 0) throw new JwksError('the JWKS has no RSA or EC signing key');
  return { keys: kept };
}

/** Keycloak's JWKS location for a realm issuer URL. */
export function jwksUrlOf(issuer: string): string {
  return `${issuer.replace(/\/+$/, '')}/protocol/openid-connect/certs`;
}

/** Fetches the issuer's JWKS (Keycloak layout) and keeps its public signing keys. */
export async function fetchJwks(issuer: string, timeoutMs = 5000): Promise<{ keys: JsonWebKeyLike[] }> {
  const res = await fetch(jwksUrlOf(issuer), {
    signal: AbortSignal.timeout(timeoutMs),
    headers: { accept: 'application/json' },
  });
  if (!res.ok) throw new JwksError(`GET ${jwksUrlOf(issuer)} answered ${res.status}`);
  return publicSigningKeys(await res.json());
}

/**
 * Installs issuer, client and JWKS for PostgREST and tells running PostgREST instances to reload.
 * Returns true when something changed. Needs the migration user (table owner).
 */
export async function installPostgrestAuth<DB>(
  db: Kysely<DB>,
  settings: PostgrestAuthSettings,
): Promise<boolean> {
  const jwks = publicSigningKeys(settings.jwks);
  return db.transaction().execute(async (trx) => {
    const { rows } = await sql<{ changed: boolean }>`
      INSERT INTO enterprise.postgrest_settings AS s (singleton, jwt_issuer, jwt_client_id, jwks)
      VALUES (true, ${settings.issuer}, ${settings.clientId}, ${JSON.stringify(jwks)}::jsonb)
      ON CONFLICT (singleton) DO UPDATE
        SET jwt_issuer = excluded.jwt_issuer, jwt_client_id = excluded.jwt_client_id,
            jwks = excluded.jwks, updated_at = now()
        WHERE (s.jwt_issuer, s.jwt_client_id, s.jwks) IS DISTINCT FROM
              (excluded.jwt_issuer, excluded.jwt_client_id, excluded.jwks)
      RETURNING true AS changed`.execute(trx);
    const changed = rows.length > 0;
    // Delivered at commit; PostgREST (db-channel "pgrst") re-runs db-pre-config.
    if (changed) await sql`NOTIFY pgrst, 'reload config'`.execute(trx);
    return changed;
  });
}
