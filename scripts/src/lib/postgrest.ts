// PostgREST for the local stack (it cannot be installed on the development machines; compose and
// Kubernetes run it for real): installs the issuer's JWKS into the database for db-pre-config and returns
// PostgREST's environment (PGRST_* names of its configuration), which `npm start` passes to a `postgrest`
// binary on PATH or, without one, writes to .data/postgrest.env for the command its banner prints.
import { fetchJwks, installPostgrestAuth, PORTAL_ANON } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';

export interface PostgrestListen {
  /** Address PostgREST listens on (the stack's LOCAL_BIND_HOST). */
  host: string;
  port: number;
  issuerUrl: string;
  /** Default `platform-enterprise-web`. */
  clientId?: string;
}

export async function postgrestEnvironment(
  ownerUrl: string,
  authenticatorUrl: string,
  { host, port, issuerUrl, clientId = 'platform-enterprise-web' }: PostgrestListen,
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
    PGRST_SERVER_HOST: host,
    PGRST_SERVER_PORT: String(port),
  };
}

/**
 * `NAME=value` lines that both `docker run --env-file` (which takes each value literally) and a POSIX shell
 * (`set -a; . file`) read as the same values: a value is written bare when the shell would keep it as is,
 * and refused otherwise rather than written in a form one of the two would misread.
 */
export function envFileText(vars: Record<string, string>): string {
  return Object.entries(vars)
    .map(([name, value]) => {
      if (!/^[A-Za-z0-9_%+,./:=?@-]*$/.test(value)) {
        throw new Error(`${name}: the value has characters an env file cannot give both docker and sh`);
      }
      return `${name}=${value}\n`;
    })
    .join('');
}
