import { PostgresAdapter, PostgresDialect, sql } from 'kysely';
import type { DialectAdapter, Kysely, MigrationLockOptions } from 'kysely';

/** How long a runner waits for another runner's migrations before it fails (lock_timeout). */
export const MIGRATION_LOCK_TIMEOUT_MS = 60 * 60 * 1000;

/**
 * Kysely's PostgreSQL adapter with the migration lock on the set's lock table instead of one advisory key.
 *
 * Kysely (0.28) serialises migration runners with `pg_advisory_lock(3853314791062309107)`, a fixed key in
 * every database of every project. `pg_advisory_lock` is executable by PUBLIC, so any login that may connect
 * to the database (the workflow's, PostgREST's authenticator) can take that key and hold it: every later
 * migration run then waits an hour and fails. A table lock needs a privilege on the table
 * (PostgreSQL, "LOCK": EXCLUSIVE mode requires UPDATE, DELETE or TRUNCATE), and the lock table
 * (`<set>_lock`, created by the migrator under the migration owner) grants nothing to anyone.
 *
 * Kysely takes the lock on the migration's connection before it opens the migration's transaction
 * (Migrator#runMigrations: acquireMigrationLock, then `db.transaction()`), and a table lock lasts only as
 * long as a transaction. So the lock opens the transaction itself: BEGIN, `SET LOCAL lock_timeout`,
 * `LOCK TABLE ... IN EXCLUSIVE MODE`. Kysely's own BEGIN that follows is a documented no-op inside a
 * transaction (PostgreSQL, "BEGIN": "Issuing BEGIN when already inside a transaction block will provoke a
 * warning message. The state of the transaction is not affected."), and its COMMIT or ROLLBACK ends the
 * transaction, migrations and lock together: a failed migration releases the lock with its rollback.
 * The release below only rolls back what an interrupted acquisition left open; after Kysely's COMMIT it
 * is a no-op (with a warning). EXCLUSIVE conflicts with itself but not with the ACCESS SHARE of the
 * migrator's reads of the lock table before it locks, so a second runner waits here, then reads the
 * migrations the first one committed and has nothing left to do.
 */
export class TableLockPostgresAdapter extends PostgresAdapter {
  override async acquireMigrationLock(db: Kysely<unknown>, options: MigrationLockOptions): Promise<void> {
    const table =
      options.lockTableSchema === undefined
        ? sql.table(options.lockTable)
        : sql.table(`${options.lockTableSchema}.${options.lockTable}`);
    await sql`BEGIN`.execute(db);
    await sql`SELECT set_config('lock_timeout', ${`${MIGRATION_LOCK_TIMEOUT_MS}ms`}, true)`.execute(db);
    await sql`LOCK TABLE ${table} IN EXCLUSIVE MODE`.execute(db);
  }

  override async releaseMigrationLock(db: Kysely<unknown>): Promise<void> {
    await sql`ROLLBACK`.execute(db);
  }
}

/** PostgresDialect whose adapter is {@link TableLockPostgresAdapter}: what `createDb` builds. */
export class TableLockPostgresDialect extends PostgresDialect {
  override createAdapter(): DialectAdapter {
    return new TableLockPostgresAdapter();
  }
}
