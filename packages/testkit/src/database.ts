import { createHash, randomBytes } from 'node:crypto';
import pg from 'pg';
import { createDb, databaseUrl, migrateToLatest } from '@platform/service-kit';
import type { MigrationSet } from '@platform/service-kit';
import { testDatabaseAdminUrl } from './config.js';

export interface CreateTestDatabaseOptions {
  /** Applied once per distinct set list into a template; every test database is cloned from it. */
  migrations?: readonly MigrationSet[];
  /** Superuser URL of the cluster. Default: `TEST_DATABASE_URL` (exported by the jest globalSetup). */
  adminUrl?: string;
}

export interface TestDatabase {
  /** Superuser URL of the new database. */
  url: string;
  /** Its name, unique across workers and runs. */
  name: string;
  /** No shared Kysely instance is handed out: each test opens (and closes) its own pools. */
  db?: never;
  /** Drops the database, terminating connections still open (close your pools first). */
  drop(): Promise<void>;
}

/** Quotes an identifier for SQL (names here are generated, but stay safe anyway). */
function ident(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/**
 * Identifies a migration-set list by everything that changes the resulting schema: set names,
 * tables, migration names and the source text of their functions. Edited migrations get a new
 * template instead of a stale one (matters with a long-lived `TEST_DATABASE_URL` cluster).
 */
export function migrationFingerprint(sets: readonly MigrationSet[]): string {
  const hash = createHash('sha256');
  for (const set of sets) {
    hash.update(JSON.stringify([set.name, set.table]));
    for (const name of Object.keys(set.migrations).sort()) {
      // Functions are hashed by their source text: an edited migration must not reuse an old template.
      hash.update(
        JSON.stringify([name, set.migrations[name]], (_key, value: unknown) =>
          typeof value === 'function' ? value.toString() : value,
        ),
      );
    }
  }
  return hash.digest('hex').slice(0, 12);
}

async function connectAdmin(adminUrl: string): Promise<pg.Client> {
  // Cluster-wide coordination happens in the `postgres` database: advisory locks are scoped to
  // the database a session is connected to, so every worker must take them in the same one.
  const client = new pg.Client({ connectionString: databaseUrl(adminUrl, 'postgres') });
  // A connection dropped while idle emits 'error'; without a listener the worker would crash.
  client.on('error', () => undefined);
  await client.connect();
  return client;
}

/**
 * Builds the template for `sets` unless it exists, under an advisory lock keyed by its name so
 * parallel workers wait for one build instead of racing. A template counts as built only once it
 * is marked `IS_TEMPLATE` (the last step), so a build cut off half-way is dropped and redone.
 */
async function ensureTemplate(
  admin: pg.Client,
  adminUrl: string,
  template: string,
  sets: readonly MigrationSet[],
): Promise<void> {
  const lockKey = `testkit:template:${template}`;
  await admin.query('SELECT pg_advisory_lock(hashtextextended($1, 0))', [lockKey]);
  try {
    const existing = await admin.query<{ datistemplate: boolean }>(
      'SELECT datistemplate FROM pg_database WHERE datname = $1',
      [template],
    );
    if (existing.rows[0]?.datistemplate === true) return;
    if (existing.rows.length > 0) await admin.query(`DROP DATABASE ${ident(template)} WITH (FORCE)`);
    await admin.query(`CREATE DATABASE ${ident(template)}`);
    const db = createDb<unknown>(databaseUrl(adminUrl, template), {
      max: 1,
      applicationName: 'testkit-template',
    });
    try {
      await migrateToLatest(db, sets);
    } finally {
      await db.destroy();
    }
    // No connections afterwards: CREATE DATABASE ... TEMPLATE fails while anyone is connected.
    await admin.query(`ALTER DATABASE ${ident(template)} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false`);
  } finally {
    await admin.query('SELECT pg_advisory_unlock(hashtextextended($1, 0))', [lockKey]);
  }
}

/**
 * A fresh database for one test file. With `migrations`, it is a copy of a template migrated once
 * per run (per distinct migration sets), which is much faster than migrating every database.
 */
export async function createTestDatabase(options: CreateTestDatabaseOptions = {}): Promise<TestDatabase> {
  const adminUrl = testDatabaseAdminUrl(options.adminUrl);
  const sets = options.migrations ?? [];
  const fingerprint = sets.length > 0 ? migrationFingerprint(sets) : 'empty';
  const template = sets.length > 0 ? `testkit_tpl_${fingerprint}` : 'template1';
  const name = `test_${fingerprint}_${process.pid}_${randomBytes(4).toString('hex')}`;

  const admin = await connectAdmin(adminUrl);
  try {
    if (sets.length > 0) await ensureTemplate(admin, adminUrl, template, sets);
    await admin.query(`CREATE DATABASE ${ident(name)} TEMPLATE ${ident(template)}`);
    await copyDatabaseGrants(admin, template, name);
  } finally {
    await admin.end();
  }

  return {
    url: databaseUrl(adminUrl, name),
    name,
    async drop() {
      const client = await connectAdmin(adminUrl);
      try {
        await client.query(`DROP DATABASE IF EXISTS ${ident(name)} WITH (FORCE)`);
      } finally {
        await client.end();
      }
    },
  };
}

/**
 * CREATE DATABASE copies a template's contents but not the database's own privileges (pg_database.datacl): the
 * copy starts with the defaults, CONNECT for PUBLIC among them. Migrations decide who may connect (REVOKE CONNECT
 * ... FROM PUBLIC, GRANT to each service's login), so the copy is given the template's privileges, or tests would
 * run against a database more open than the one the migrations build.
 */
async function copyDatabaseGrants(admin: pg.Client, template: string, name: string): Promise<void> {
  const { rows } = await admin.query<{ grantee: string | null; privilege: string }>(
    `SELECT r.rolname AS grantee, a.privilege_type AS privilege
     FROM pg_database d, aclexplode(d.datacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
     WHERE d.datname = $1 AND d.datacl IS NOT NULL`,
    [template],
  );
  if (rows.length === 0) return;
  await admin.query(`REVOKE ALL ON DATABASE ${ident(name)} FROM PUBLIC`);
  for (const { grantee, privilege } of rows) {
    await admin.query(
      `GRANT ${privilege} ON DATABASE ${ident(name)} TO ${grantee === null ? 'PUBLIC' : ident(grantee)}`,
    );
  }
}
