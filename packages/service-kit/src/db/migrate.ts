import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto';
import { errorMessage } from '../errors.js';
import { Migrator, sql } from 'kysely';
import { sideSession, type SideSession } from './create-db.js';
import { sqlState } from './errors.js';
import { MIGRATION_STATEMENT_LOCK_TIMEOUT_MS, TableLockPostgresAdapter } from './migration-lock.js';

/**
 * Runs again after a migration's statement waited MIGRATION_STATEMENT_LOCK_TIMEOUT_MS for a lock (another session
 * holds a lock on a table it changes): after 2, 4 and 8 s, then the run fails naming the migration.
 */
export const MIGRATION_LOCK_RETRIES = 3;
import type { Kysely, Migration, MigrationResult, MigrationResultSet } from 'kysely';

/**
 * One owner's migrations. Each set keeps its own migration and lock tables, so the gateway's
 * registry migrations and the enterprise migrations are versioned independently in one database.
 */
export interface MigrationSet {
  /** Human name used in errors and logs, e.g. `enterprise`. */
  name: string;
  /** This set's migration table (in schema `public`); its lock table is `<table>_lock`. */
  table: string;
  /** Migrations by name; applied in name order (use sortable names such as `0001_registry`). */
  migrations: Record<string, Migration>;
  /**
   * Run after the set's migrations at every run, in a transaction of its own, also when nothing was pending:
   * state a run must restore whatever happened since, such as a login's password (a login may change its own, and
   * a rotation is a re-run). Must be idempotent.
   */
  everyRun?: (db: Kysely<unknown>, context: EveryRunContext) => Promise<void>;
}

/** What an `everyRun` step may use besides its transaction. */
export interface EveryRunContext {
  /** Opens a connection of the migrating login outside the run's transaction (undefined: none can be opened). */
  sideSession?: () => Promise<SideSession>;
}

/**
 * An `everyRun` step that gives each role the password this run was given: a login may change its own password
 * (`ALTER ROLE <itself> PASSWORD ...` needs no privilege; the seventh cold review left every gateway replica refused
 * that way), so a re-run of the migrations repairs it, and a rotation is a re-run. `roles` are role names of the
 * code, never input. What the eighth cold review showed, and how it is met:
 * - the password never reaches SQL text, a server log or an error: what is sent is its SCRAM-SHA-256 verifier
 *   (RFC 7677, RFC 5802 §3; PostgreSQL stores a verifier given as the password as it is), through a
 *   transaction-local setting, and a failure is raised again with a message of its own (an ERROR's CONTEXT would
 *   quote the statement);
 * - the login cannot hold the step off: while the step's ALTER ROLE waits for the role's row, a second session
 *   (`context.sideSession`) ends the role's sessions that block it (pg_blocking_pids), where the migrating role may
 *   end them. The step stays queued on the row meanwhile, holding its tuple lock, so the row goes to the step when
 *   the holder ends and not to a session of the login that polls for it (the tenth cold review's pollers, with a
 *   1 ms lock_timeout, won it back in the pause between two tries of the step's own session). Without a side
 *   session, a lock is waited for at most 2 s, after which the role's own sessions that hold a transaction id (an
 *   uncommitted ALTER ROLE of itself holds its row, idle or with a statement still running: the ninth cold review
 *   slept in one) are ended from the step's session, and the step tries again;
 * - two runs at the same moment (a parallel test worker, another database's Job) may update a role's row together,
 *   which PostgreSQL refuses as "tuple concurrently updated" (XX000): tried again after a pause.
 */
export function setRolePasswords(
  roles: Readonly<Record<string, string>>,
): (db: Kysely<unknown>, context?: EveryRunContext) => Promise<void> {
  return async (db, context) => {
    await sql`SET LOCAL lock_timeout = '2s'`.execute(db);
    await sql`SET LOCAL statement_timeout = '30s'`.execute(db);
    const ender = await endBlockers(db, context, Object.keys(roles));
    try {
      await setEach(db, roles);
    } finally {
      await ender.stop();
    }
  };
}

/** How often the side session looks for sessions that block the password step (ms). */
const ENDER_INTERVAL_MS = 25;

/**
 * From a side session, ends the sessions of `roles` that block the step's own session (`db`), until stopped, and the
 * prepared transactions of `roles` in this database when one blocks it (pg_blocking_pids names a prepared
 * transaction as pid 0: a login that PREPAREs a transaction holding its own row leaves a lock no session holds,
 * which outlives its session and a restart; eleventh cold review, where max_prepared_transactions > 0). Ends
 * nothing (and the step's own tries remain) when no side session opens or the migrating role may not end them.
 */
async function endBlockers(
  db: Kysely<unknown>,
  context: EveryRunContext | undefined,
  roles: string[],
): Promise<{ stop(): Promise<void> }> {
  const open = context?.sideSession;
  let side: SideSession | undefined;
  try {
    side = open === undefined ? undefined : await open();
  } catch {
    side = undefined;
  }
  if (side === undefined) return { stop: () => Promise.resolve() };
  const session = side;
  const { rows } = await sql<{ pid: number }>`SELECT pg_catalog.pg_backend_pid() AS pid`.execute(db);
  const stepPid = rows[0]!.pid;
  let stopped = false;
  let wake = (): void => undefined;
  const loop = (async () => {
    while (!stopped) {
      try {
        const { rows: blocked } = await session.query<{ gid: string }>(
          `SELECT x.gid FROM pg_catalog.pg_prepared_xacts x
           WHERE 0 = ANY (pg_catalog.pg_blocking_pids($1)) AND x.owner = ANY ($2::text[])
             AND x.database = pg_catalog.current_database()`,
          [stepPid, roles],
        );
        // Outside a transaction block, as ROLLBACK PREPARED must be; the gid is the login's text, quoted.
        for (const { gid } of blocked) await session.query(`ROLLBACK PREPARED ${session.escapeLiteral(gid)}`);
        await session.query(
          `SELECT pg_catalog.pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a
           WHERE a.pid = ANY (pg_catalog.pg_blocking_pids($1)) AND a.usename = ANY ($2::text[])`,
          [stepPid, roles],
        );
      } catch {
        return; // not ours to end, or the side session failed: the step's own tries remain
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, ENDER_INTERVAL_MS);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  })();
  return {
    async stop() {
      stopped = true;
      wake();
      await loop;
      await session.end().catch(() => undefined);
    },
  };
}

async function setEach(db: Kysely<unknown>, roles: Readonly<Record<string, string>>): Promise<void> {
  for (const [role, password] of Object.entries(roles)) {
    await sql`SELECT set_config('platform.role_password', ${scramVerifier(password)}, true)`.execute(db);
    await sql
      .raw(
        `DO $$
DECLARE
  v_role text := ${sqlLiteral(role)};
BEGIN
  FOR attempt IN 1..5 LOOP
    BEGIN
      -- A library the role named for itself goes too (\`ALTER ROLE <itself> SET ...\` needs no privilege; a
      -- missing one refused every later connection of it before any statement, PostgREST's included, whose
      -- connections we do not start; tenth cold review). Other role settings stay: an operator may have set them
      -- (PostgREST's statement_timeout is one), and the services reset their own on connect.
      EXECUTE format('ALTER ROLE %I RESET local_preload_libraries', v_role);
      EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET local_preload_libraries', v_role, current_database());
      -- And a role it gave itself as a default (\`SET role = <a role it may SET ROLE to>\`): every later session runs
      -- as that role, PostgREST's included (eleventh cold review).
      EXECUTE format('ALTER ROLE %I RESET role', v_role);
      EXECUTE format('ALTER ROLE %I IN DATABASE %I RESET role', v_role, current_database());
      EXECUTE format('ALTER ROLE %I PASSWORD %L', v_role, current_setting('platform.role_password'));
      RETURN;
    EXCEPTION
      WHEN internal_error OR lock_not_available THEN
        IF attempt = 5 THEN
          RAISE EXCEPTION 'the password of role % could not be set (%): its row stayed locked or busy%', v_role, SQLSTATE,
            coalesce((SELECT '; prepared transactions of the role hold it (pg_prepared_xacts: ' ||
                        pg_catalog.string_agg(pg_catalog.quote_literal(x.gid) || ' in ' || x.database, ', ') ||
                        '), end them with ROLLBACK PREPARED in their database'
                      FROM pg_catalog.pg_prepared_xacts x WHERE x.owner = v_role), '')
            USING ERRCODE = 'lock_not_available';
        END IF;
        BEGIN
          -- A DO block is one transaction, and pg_stat_activity is read once per transaction unless cleared: each
          -- try must see the sessions holding the row now (tenth cold review).
          PERFORM pg_catalog.pg_stat_clear_snapshot();
          PERFORM pg_catalog.pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a
          WHERE a.usename = v_role AND a.backend_xid IS NOT NULL AND a.pid <> pg_catalog.pg_backend_pid();
        EXCEPTION WHEN insufficient_privilege THEN
          NULL; -- not ours to end: tried again, and failed with the message above
        END;
        PERFORM pg_catalog.pg_sleep(0.05 * attempt);
      WHEN OTHERS THEN
        RAISE EXCEPTION 'the password of role % could not be set (%)', v_role, SQLSTATE USING ERRCODE = SQLSTATE;
    END;
  END LOOP;
END $$;`,
      )
      .execute(db);
  }
  await sql`SELECT set_config('platform.role_password', '', true)`.execute(db);
}

/** A role name of the code as an SQL string literal (letters, digits and underscores only). */
function sqlLiteral(role: string): string {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(role)) throw new Error(`not a role name: ${role}`);
  return `'${role}'`;
}

/**
 * The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (its `pg_authid.rolpassword` form,
 * `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`; RFC 5802 §3, 4096 iterations as PostgreSQL's
 * default). PostgreSQL applies SASLprep to a password; it leaves printable ASCII unchanged, and node has no
 * SASLprep, so any other password is sent as it is (PostgreSQL then makes the verifier itself).
 */
export function scramVerifier(password: string): string {
  if (!/^[\x20-\x7e]*$/.test(password)) return password;
  const iterations = 4096;
  const salt = randomBytes(16);
  const salted = pbkdf2Sync(password, salt, iterations, 32, 'sha256');
  const clientKey = createHmac('sha256', salted).update('Client Key').digest();
  const storedKey = createHash('sha256').update(clientKey).digest();
  const serverKey = createHmac('sha256', salted).update('Server Key').digest();
  const b64 = (b: Buffer) => b.toString('base64');
  return `SCRAM-SHA-256$${iterations}:${b64(salt)}$${b64(storedKey)}:${b64(serverKey)}`;
}

/**
 * `migration` with the SQL it runs that is built outside its functions, as one more field. Template
 * databases (testkit) are keyed on a migration's fields, functions by their source text; SQL that up()
 * only names (a helper's result) is not in that text, so an edited helper would reuse a stale template.
 */
export function withGeneratedSql(generated: string, migration: Migration): Migration {
  return Object.assign(migration, { generated });
}

export interface AppliedMigration {
  set: string;
  migration: string;
}

export class MigrationError extends Error {
  readonly set: string;
  readonly migration: string | undefined;

  constructor(set: string, migration: string | undefined, cause: unknown) {
    const reason = errorMessage(cause);
    super(
      migration === undefined
        ? `migration set "${set}" failed: ${reason}`
        : `migration set "${set}" failed at migration "${migration}": ${reason}`,
      { cause },
    );
    this.name = 'MigrationError';
    this.set = set;
    this.migration = migration;
  }
}

/**
 * Applies every pending migration of each set, in the order the sets are given. Idempotent:
 * already applied migrations are skipped. Kysely runs a set's pending migrations in one transaction
 * that holds the set's lock table (migration-lock.ts), so concurrent runners wait for each other and no
 * other login can make them wait. `db` must come from `createDb`, whose dialect takes that lock.
 * Returns the migrations applied by this call.
 */
export async function migrateToLatest<DB>(
  db: Kysely<DB>,
  sets: readonly MigrationSet[],
): Promise<AppliedMigration[]> {
  if (!(db.getExecutor().adapter instanceof TableLockPostgresAdapter)) {
    // Kysely's own adapter would lock with a fixed advisory key any login can hold (migration-lock.ts).
    throw new Error('migrateToLatest needs a database handle from createDb (its migration lock)');
  }
  const applied: AppliedMigration[] = [];
  for (const set of sets) {
    const migrator = new Migrator({
      db,
      provider: { getMigrations: () => Promise.resolve(set.migrations) },
      migrationTableName: set.table,
      migrationLockTableName: `${set.table}_lock`,
    });
    let outcome = await migrator.migrateToLatest();
    for (let retry = 1; retry <= MIGRATION_LOCK_RETRIES && waitedForLock(outcome); retry++) {
      await new Promise((resolve) => setTimeout(resolve, 1000 * 2 ** retry));
      outcome = await migrator.migrateToLatest();
    }
    const { error, results } = outcome;
    if (error !== undefined) {
      const failed = results?.find((r: MigrationResult) => r.status === 'Error');
      throw new MigrationError(
        set.name,
        failed?.migrationName,
        waitedForLock(outcome)
          ? new Error(
              `${errorMessage(error)}: another session held a lock on a table the migration changes for ` +
                `${MIGRATION_STATEMENT_LOCK_TIMEOUT_MS} ms, ${MIGRATION_LOCK_RETRIES + 1} times (pg_locks shows who)`,
              { cause: error },
            )
          : error,
      );
    }
    for (const r of results ?? []) {
      if (r.status === 'Success') applied.push({ set: set.name, migration: r.migrationName });
    }
    const everyRun = set.everyRun;
    if (everyRun !== undefined) {
      try {
        const context: EveryRunContext = { sideSession: sideSession(db) };
        await (db as unknown as Kysely<unknown>).transaction().execute((trx) => everyRun(trx, context));
      } catch (err) {
        throw new MigrationError(set.name, 'every run', err);
      }
    }
  }
  return applied;
}

/** A migration (not the wait for the runners' lock row) failed on its statement lock timeout. */
function waitedForLock(outcome: MigrationResultSet): boolean {
  return (
    outcome.error !== undefined &&
    sqlState(outcome.error) === '55P03' &&
    outcome.results?.some((r) => r.status === 'Error') === true
  );
}
