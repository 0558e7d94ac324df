import { sql, type Kysely, type Migration } from 'kysely';
import type { MigrationSet } from '@platform/service-kit';
import { clusterBusMigration, clusterLifetimeMigration } from './cluster-bus-migration.js';
import { deviceCredentialsMigration } from './credentials-migration.js';

/** The read-only login the running gateway uses (design §4.2): SELECT on its registry, nothing else. */
export const GATEWAY_LOGIN_ROLE = 'device_gateway_login';
/** The login's development password: what `gatewayMigrations` (tests, benchmarks) creates it with. */
export const DEV_GATEWAY_LOGIN_PASSWORD = 'device-gateway-dev';

/**
 * The login's password from the environment the migration entry point passes in
 * (`DEVICE_GATEWAY_DB_PASSWORD`), with the development default outside production. Not in config.ts:
 * migrations run from `npm run migrate` and the migration Job, not from the gateway process.
 */
export function gatewayLoginPassword(env: Readonly<Record<string, string | undefined>>): string {
  const value = env.DEVICE_GATEWAY_DB_PASSWORD;
  if (value !== undefined && value !== '') return value;
  if (env.NODE_ENV === 'production') {
    throw new Error('DEVICE_GATEWAY_DB_PASSWORD must be set in production');
  }
  return DEV_GATEWAY_LOGIN_PASSWORD;
}

const literal = (value: string): string => `'${value.replaceAll("'", "''")}'`;

const registry = (loginPassword: string): Migration => ({
  async up(db: Kysely<unknown>): Promise<void> {
    await sql`CREATE SCHEMA IF NOT EXISTS device_gateway`.execute(db);
    await sql`
      CREATE TABLE device_gateway.device_registry (
        device_id text PRIMARY KEY CHECK (device_id ~ '^[A-Za-z0-9._:-]{1,128}$'),
        site_id uuid NOT NULL,
        name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
        model text NOT NULL CHECK (char_length(model) BETWEEN 1 AND 100),
        enabled boolean NOT NULL DEFAULT true,
        -- Device Settings v1 (checked fully by the gateway at load) or {}; one CoAP datagram at most.
        desired_settings jsonb NOT NULL DEFAULT '{}'::jsonb
          CHECK (jsonb_typeof(desired_settings) = 'object' AND octet_length(desired_settings::text) <= 1024),
        updated_at timestamptz NOT NULL DEFAULT now()
      )`.execute(db);
    await sql`CREATE INDEX device_registry_site_id_idx ON device_gateway.device_registry (site_id)`.execute(
      db,
    );
    await sql`
      CREATE FUNCTION device_gateway.touch_updated_at() RETURNS trigger
      LANGUAGE plpgsql SET search_path = pg_catalog AS $$
      BEGIN
        NEW.updated_at := now();
        RETURN NEW;
      END $$`.execute(db);
    await sql`
      CREATE TRIGGER device_registry_touch BEFORE UPDATE ON device_gateway.device_registry
      FOR EACH ROW EXECUTE FUNCTION device_gateway.touch_updated_at()`.execute(db);

    // Roles are cluster-wide: another database's migration (or a parallel test worker) may create the same
    // role at the same moment, which fails with duplicate_object or unique_violation; both mean "exists".
    await sql
      .raw(
        `DO $$
        BEGIN
          IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '${GATEWAY_LOGIN_ROLE}') THEN
            BEGIN
              CREATE ROLE ${GATEWAY_LOGIN_ROLE} LOGIN NOINHERIT PASSWORD ${literal(loginPassword)};
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
            END;
          END IF;
        END $$`,
      )
      .execute(db);
    await sql.raw(`GRANT USAGE ON SCHEMA device_gateway TO ${GATEWAY_LOGIN_ROLE}`).execute(db);
    await sql.raw(`GRANT SELECT ON device_gateway.device_registry TO ${GATEWAY_LOGIN_ROLE}`).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql`DROP SCHEMA device_gateway CASCADE`.execute(db);
  },
});

/**
 * The gateway's own migrations, versioned in their own table (`device_gateway_migrations`); the read-only
 * login is created with `loginPassword` (the entry point reads it with `gatewayLoginPassword(env)`).
 */
export function gatewayMigrationsWith(loginPassword: string): MigrationSet {
  return {
    name: 'device-gateway',
    table: 'device_gateway_migrations',
    migrations: {
      '0001_device_registry': registry(loginPassword),
      '0002_cluster_bus': clusterBusMigration,
      '0003_cluster_lifetime': clusterLifetimeMigration,
      '0004_device_credentials': deviceCredentialsMigration,
    },
  };
}

/** With the development password: tests and benchmarks on a private database. */
export const gatewayMigrations: MigrationSet = gatewayMigrationsWith(DEV_GATEWAY_LOGIN_PASSWORD);
