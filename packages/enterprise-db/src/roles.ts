// Database role names of the enterprise side (design §4.2) and where their passwords come from.

/** PostgREST's login: NOINHERIT, may only switch to the two portal roles. */
export const AUTHENTICATOR = 'authenticator';
/** What a signed-in portal user becomes (the JWT's `role` claim). */
export const PORTAL_ROLE = 'enterprise_portal_role';
/** What a request without a token becomes; granted nothing at all. */
export const PORTAL_ANON = 'enterprise_portal_anon';
/** Exactly what the workflow service needs (NOLOGIN). */
export const API_ROLE = 'enterprise_api_role';
/** The workflow service's login, a member of `enterprise_api_role`. */
export const API_LOGIN = 'enterprise_api_login';
/**
 * Owns the SECURITY DEFINER functions that read the access map (and the PostgREST settings).
 * NOLOGIN; may read exactly those tables, so a bug in a definer function cannot reach client data.
 */
export const AUTHZ_OWNER = 'enterprise_authz';
/**
 * Owns the one SECURITY DEFINER function the object-created webhook calls; may only move media
 * items out of `pending_upload` (its policies say so). NOLOGIN.
 */
export const MEDIA_INGEST_OWNER = 'enterprise_media_ingest';

export interface RolePasswords {
  authenticator: string;
  enterpriseApi: string;
  /**
   * True when the passwords were given explicitly (environment): then every migration run sets
   * them, so a rotation is a re-run. Development defaults are only set when the role is created,
   * because roles are cluster-wide and parallel test databases must not rewrite them concurrently.
   */
  explicit: boolean;
}

const DEV_AUTHENTICATOR_PASSWORD = 'authenticator-dev-password';
const DEV_ENTERPRISE_API_PASSWORD = 'enterprise-api-dev-password';

/** The development passwords: what `enterpriseMigrations` (tests, local stack defaults) creates the logins with. */
export const devRolePasswords: Readonly<RolePasswords> = Object.freeze({
  authenticator: DEV_AUTHENTICATOR_PASSWORD,
  enterpriseApi: DEV_ENTERPRISE_API_PASSWORD,
  explicit: false,
});

export class RolePasswordError extends Error {
  override readonly name = 'RolePasswordError';
}

/**
 * Reads `AUTHENTICATOR_PASSWORD` and `ENTERPRISE_API_PASSWORD` from the environment the entry point
 * (`npm run migrate`, the migration Job) passes in. Outside production missing values fall back to the
 * development passwords; with `NODE_ENV=production` both are required.
 */
export function rolePasswordsFromEnv(env: Readonly<Record<string, string | undefined>>): RolePasswords {
  const authenticator = env.AUTHENTICATOR_PASSWORD;
  const enterpriseApi = env.ENTERPRISE_API_PASSWORD;
  const given = (v: string | undefined): v is string => v !== undefined && v !== '';
  if (given(authenticator) && given(enterpriseApi)) {
    return { authenticator, enterpriseApi, explicit: true };
  }
  if (env.NODE_ENV === 'production') {
    throw new RolePasswordError(
      'AUTHENTICATOR_PASSWORD and ENTERPRISE_API_PASSWORD must both be set when NODE_ENV=production',
    );
  }
  return {
    authenticator: given(authenticator) ? authenticator : DEV_AUTHENTICATOR_PASSWORD,
    enterpriseApi: given(enterpriseApi) ? enterpriseApi : DEV_ENTERPRISE_API_PASSWORD,
    explicit: given(authenticator) || given(enterpriseApi),
  };
}

/** `url` with another user and password (same host, port, database and options). */
export function urlForLogin(url: string, user: string, password: string): string {
  const u = new URL(url);
  u.username = encodeURIComponent(user);
  u.password = encodeURIComponent(password);
  return u.toString();
}
