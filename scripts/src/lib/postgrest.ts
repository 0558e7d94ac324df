// PostgREST for the local stack, only when its binary is installed (it cannot be installed on the
// development machines; compose and Kubernetes run it for real). Installs the issuer's JWKS into the
// database for db-pre-config and returns PostgREST's environment (PGRST_* names of its configuration).
import { fetchJwks, installPostgrestAuth, PORTAL_ANON } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';

export async function postgrestEnvironment(
  ownerUrl: string,
  authenticatorUrl: string,
  port: number,
  issuerUrl: string,
  clientId = 'platform-enterprise-web',
): Promise<Record<string, string>> {
  const db = createDb(ownerUrl, { max: 1, applicationName: 'platform-postgrest-setup' });
  try {
    await installPostgrestAuth(db, { issuer: issuerUrl, clientId, jwks: await fetchJwks(issuerUrl) });
  } finally {
    await db.destroy();
  }
  return {
    PGRST_DB_URI: authenticatorUrl,
    PGRST_DB_SCHEMAS: 'enterprise_api',
    PGRST_DB_ANON_ROLE: PORTAL_ANON,
    PGRST_DB_CONFIG: 'true',
    PGRST_DB_PRE_CONFIG: 'postgrest.pre_config',
    PGRST_DB_PRE_REQUEST: 'postgrest.pre_request',
    PGRST_JWT_AUD: clientId,
    PGRST_JWT_ROLE_CLAIM_KEY: '.role',
    PGRST_DB_MAX_ROWS: '1000',
    PGRST_SERVER_HOST: '127.0.0.1',
    PGRST_SERVER_PORT: String(port),
  };
}
