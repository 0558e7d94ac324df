// Migrations and seed of the whole platform, in one place for `npm run migrate`, `npm run seed` and `npm start`.
import { gatewayLoginPassword, gatewayMigrationsWith, seedDevices } from '@platform/device-gateway';
import type { GatewayDatabase } from '@platform/device-gateway';
import { enterpriseMigrationsWith, rolePasswordsFromEnv, seedEnterprise } from '@platform/enterprise-db';
import type { SeedOptions } from '@platform/enterprise-db';
import { createDb, migrateToLatest } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import pg from 'pg';
import { databaseUrl } from '@platform/testkit';

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

/** Creates `database` on the cluster of `adminUrl` unless it exists (the local stack's first start). */
export async function ensureDatabase(adminUrl: string, database: string): Promise<string> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    const found = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [database]);
    if (found.rowCount === 0) await client.query(`CREATE DATABASE "${database.replaceAll('"', '""')}"`);
  } finally {
    await client.end();
  }
  return databaseUrl(adminUrl, database);
}
