import { PostgresAdapter, PostgresDialect, sql } from 'kysely';
import type { DialectAdapter, Kysely, MigrationLockOptions } from 'kysely';

/** How long a runner waits for another runner's migrations before it fails (lock_timeout on the lock row). */
export const MIGRATION_LOCK_TIMEOUT_MS = 60 * 60 * 1000;

/**
 * How long one statement of a migration waits for a lock on what it changes (lock_timeout once the runner holds the
 * lock row). A DDL statement asks for ACCESS EXCLUSIVE, and every statement on that table, the services' reads
 * included, queues behind the request while it waits: a long wait would stall the running services. migrateToLatest
 * retries a run that timed out this way (MIGRATION_LOCK_RETRIES).
 */
export const MIGRATION_STATEMENT_LOCK_TIMEOUT_MS = 2000;

/**
 * Kysely's PostgreSQL adapter with the migration lock on a row of the set's lock table instead of one advisory key.
 *
 * Kysely (0.28) serialises migration runners with `pg_advisory_lock(3853314791062309107)`, a fixed key in
 * every database of every project. `pg_advisory_lock` is executable by PUBLIC, so any login that may connect
 * to the database (the workflow's, PostgREST's authenticator) can take that key and hold it: every later
 * migration run then waits an hour and fails. Nor can it be a table lock: PostgreSQL's sequence functions lock a
 * relation named by oid (ROW EXCLUSIVE, for the top transaction) before they check its kind or the caller's
 * privileges, so any session can hold ROW EXCLUSIVE on any table and keep it after the error (`SAVEPOINT s;
 * SELECT nextval(<oid>::regclass); ROLLBACK TO s`; a cold review, issue 39), which blocks every stronger lock
 * mode. A row lock (`SELECT ... FOR UPDATE`) needs UPDATE on the table (PostgreSQL, "SELECT", The Locking Clause)
 * and only ROW SHARE on the table itself, which conflicts with nothing but EXCLUSIVE and ACCESS EXCLUSIVE; the
 * lock table (`<set>_lock`, created by the migrator under the migration owner, its row `migration_lock` written
 * before the lock is taken) grants nothing to anyone.
 *
 * Kysely takes the lock on the migration's connection before it opens the migration's transaction
 * (Migrator#runMigrations: acquireMigrationLock, then `db.transaction()`), and a row lock lasts only as long as a
 * transaction. So the lock opens the transaction itself: BEGIN, `lock_timeout` of an hour, the row FOR UPDATE,
 * then `lock_timeout` of MIGRATION_STATEMENT_LOCK_TIMEOUT_MS for the migrations' own statements. Kysely's BEGIN
 * that follows is a documented no-op inside a transaction (PostgreSQL, "BEGIN": "Issuing BEGIN when already
 * inside a transaction block will provoke a warning message. The state of the transaction is not affected."), and
 * its COMMIT or ROLLBACK ends the transaction, migrations and lock together: a failed migration releases the lock
 * with its rollback. The release below only rolls back what an interrupted acquisition left open; after Kysely's
 * COMMIT it is a no-op (with a warning). A second runner waits for the row, then reads the migrations the first one
 * committed and has nothing left to do.
 */
export class TableLockPostgresAdapter extends PostgresAdapter {
  override async acquireMigrationLock(db: Kysely<unknown>, options: MigrationLockOptions): Promise<void> {
    const table =
      options.lockTableSchema === undefined
        ? sql.table(options.lockTable)
        : sql.table(`${options.lockTableSchema}.${options.lockTable}`);
    await sql`BEGIN`.execute(db);
    await sql`SELECT set_config('lock_timeout', ${`${MIGRATION_LOCK_TIMEOUT_MS}ms`}, true)`.execute(db);
    const { rows } = await sql`SELECT 1 FROM ${table} WHERE id = ${options.lockRowId} FOR UPDATE`.execute(db);
    // The migrator writes the row before it locks; without it nothing would be serialised.
    if (rows.length !== 1) throw new Error(`migration lock row missing in ${options.lockTable}`);
    await sql`SELECT set_config('lock_timeout', ${`${MIGRATION_STATEMENT_LOCK_TIMEOUT_MS}ms`}, true)`.execute(
      db,
    );
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
