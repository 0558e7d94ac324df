// Shared setup for the enterprise-db tests: a migrated, seeded database per test file, pools for
// the superuser (setup and truth), PostgREST's authenticator and the workflow's login.
import pg from 'pg';
import type { Kysely } from 'kysely';
import { createDb } from '@platform/service-kit';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';
import {
  API_LOGIN,
  AUTHENTICATOR,
  demoUserSubs,
  enterpriseMigrations,
  installPostgrestAuth,
  PORTAL_ROLE,
  devRolePasswords,
  seedEnterprise,
  urlForLogin,
} from '@platform/enterprise-db';
import type { DemoUser } from '@platform/enterprise-db';

export const ISSUER = 'http://localhost:8180/realms/platform';
export const CLIENT_ID = 'platform-enterprise-web';

/** A public RSA key shaped like Keycloak's JWKS entry (the tests never verify signatures here). */
export const TEST_JWKS = {
  keys: [{ kty: 'RSA', kid: 'test-key-1', use: 'sig', alg: 'RS256', n: 'sXch4nCkzw', e: 'AQAB' }],
};

export interface Fixture {
  database: TestDatabase;
  admin: Kysely<unknown>;
  adminPool: pg.Pool;
  authenticator: pg.Pool;
  apiUrl: string;
  api: Kysely<unknown>;
  close(): Promise<void>;
}

export async function setUp(): Promise<Fixture> {
  const database = await createTestDatabase({ migrations: [enterpriseMigrations] });
  const admin = createDb<unknown>(database.url);
  await seedEnterprise(admin);
  await installPostgrestAuth(admin, { issuer: ISSUER, clientId: CLIENT_ID, jwks: TEST_JWKS });
  const passwords = devRolePasswords;
  const adminPool = new pg.Pool({ connectionString: database.url, max: 2 });
  const authenticator = new pg.Pool({
    connectionString: urlForLogin(database.url, AUTHENTICATOR, passwords.authenticator),
    max: 4,
  });
  const apiUrl = urlForLogin(database.url, API_LOGIN, passwords.enterpriseApi);
  const api = createDb<unknown>(apiUrl, { max: 4 });
  return {
    database,
    admin,
    adminPool,
    authenticator,
    apiUrl,
    api,
    async close() {
      await api.destroy();
      await authenticator.end();
      await adminPool.end();
      await admin.destroy();
      await database.drop();
    },
  };
}

/** The claims a valid Keycloak access token of a demo user carries, as PostgREST exposes them. */
export function claimsOf(user: DemoUser, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const now = Math.floor(Date.now() / 1000);
  return {
    iss: ISSUER,
    azp: CLIENT_ID,
    aud: CLIENT_ID,
    sub: demoUserSubs[user],
    role: PORTAL_ROLE,
    iat: now,
    exp: now + 300,
    preferred_username: user,
    ...extra,
  };
}

/** SQLSTATE of a rejected promise (fails the test when it resolves). */
export async function sqlState(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
  } catch (err) {
    return String((err as { code?: unknown }).code);
  }
  throw new Error('expected the statement to fail');
}
