// Migrations and seed of the whole platform, in one place for the operations image (`migrate-main.js`,
// `seed-main.js`), `npm run migrate`, `npm run seed` and `npm start`. Runtime code of the platform-ops
// image: it imports only this workspace's production dependencies, never @platform/testkit.
import { gatewayLoginPassword, gatewayMigrationsWith, seedDevices } from '@platform/device-gateway';
import type { GatewayDatabase } from '@platform/device-gateway';
import { enterpriseMigrationsWith, rolePasswordsFromEnv, seedEnterprise } from '@platform/enterprise-db';
import type { SeedOptions } from '@platform/enterprise-db';
import { createDb, migrateToLatest } from '@platform/service-kit';
import type { Kysely } from 'kysely';

type Env = Readonly<Record<string, string | undefined>>;

/**
 * Every migration set, in the order they must run (each keeps its own migration table), with the
 * runtime logins' passwords read from `env` (AUTHENTICATOR_PASSWORD, ENTERPRISE_API_PASSWORD,
 * DEVICE_GATEWAY_DB_PASSWORD; development defaults outside production).
 */
export function platformMigrations(env: Env) {
  return [
    enterpriseMigrationsWith(rolePasswordsFromEnv(env)),
    gatewayMigrationsWith(gatewayLoginPassword(env)),
  ];
}

export async function migrateAll(ownerUrl: string, env: Env): Promise<void> {
  const db = createDb(ownerUrl, { applicationName: 'platform-migrate', max: 1 });
  try {
    await migrateToLatest(db, platformMigrations(env));
  } finally {
    await db.destroy();
  }
}

export async function seedAll(ownerUrl: string, options: SeedOptions = {}): Promise<void> {
  const db = createDb(ownerUrl, { applicationName: 'platform-seed', max: 1 });
  try {
    await seedEnterprise(db, options);
    await seedDevices(db as unknown as Kysely<GatewayDatabase>);
  } finally {
    await db.destroy();
  }
}

/** `DATABASE_URL` or a clear message: migrate and seed never guess which database to write to. */
export function requireDatabaseUrl(env: Env): string {
  const url = env.DATABASE_URL;
  if (url === undefined || url === '') {
    // 5433 is the local stack's PostgreSQL port (scripts/src/lib/local.ts, localPorts.postgres).
    throw new Error(
      'DATABASE_URL is not set. Point it at the database to change (an owner login), e.g. ' +
        'postgres://postgres:postgres@127.0.0.1:5433/platform for the local stack.',
    );
  }
  return url;
}
