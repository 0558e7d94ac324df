import { Kysely } from 'kysely';
import type { PostgresCursor, PostgresPool, PostgresPoolClient, PostgresQueryResult } from 'kysely';
import pg from 'pg';
import { Gauge } from 'prom-client';
import type { Registry } from 'prom-client';
import { TableLockPostgresDialect } from './migration-lock.js';

/** The part of a winston logger the pool needs; any logger with `warn` fits. */
export interface DbLogger {
  warn(message: string, meta: Record<string, unknown>): unknown;
}

export interface CreateDbOptions {
  /** Pool size (connections). Default 10. */
  max?: number;
  /** Shown in `pg_stat_activity.application_name`. */
  applicationName?: string;
  /** Server-side `statement_timeout` per statement, in ms. Default: none (server setting). */
  statementTimeoutMs?: number;
  /**
   * Client-side deadline of each statement, in ms: past it the statement fails with `Query read
   * timeout` (node-postgres `query_timeout`), every later statement on that connection fails at once,
   * and the connection is closed instead of returned to the pool. This is what ends a wait on a server
   * that accepted the statement and stopped answering (frozen, partitioned), where a server-side
   * `statement_timeout` cannot fire. Keep it above `statementTimeoutMs`, so a merely slow statement is
   * cancelled by the server and its connection kept. Default: none.
   */
  queryTimeoutMs?: number;
  /**
   * How long to wait for a connection, in ms: a free one from the pool, or a new one to be opened and
   * authenticated (a frozen server accepts TCP connections and never answers the startup). Default 5000.
   */
  connectionTimeoutMs?: number;
  /** Idle connections are closed after this many ms. Default 30000. */
  idleTimeoutMs?: number;
  /**
   * `synchronous_commit` of every session of the pool. `'off'`: a commit returns (and its NOTIFYs are
   * delivered) before the WAL reaches disk; a PostgreSQL crash can lose the last few hundred ms of
   * commits, never leave a transaction half done. Only for writes that need not survive such a crash.
   * Default: the server's (on).
   */
  synchronousCommit?: 'on' | 'off';
  /** Where connection errors are reported. Default: `console.warn`. */
  logger?: DbLogger;
  /**
   * Publish the pool's use on this registry as `db_pool_connections{pool, state}` (state: total,
   * idle, waiting — waiting counts queries queued for a connection, the sign of a pool too small).
   */
  metrics?: Registry;
}

/**
 * Session settings every connection of this kit states in its startup packet (`options`, `-c name=value`; a space
 * in a value is escaped with a backslash). A login may give itself defaults that outlive its sessions (`ALTER ROLE
 * <itself> [IN DATABASE ...] SET ...` needs no privilege), and each later session of every process inherits them:
 * `default_transaction_read_only = on` made every write, and a gateway replica's start, fail until someone reset
 * it (issue 39, the sixth cold review). Values from the startup packet take precedence over role and database
 * defaults and over postgresql.conf (PostgreSQL manual, "Setting Parameters": options in the connection request;
 * checked against PostgreSQL 18 with role defaults), so these hold whatever the role's defaults say. Pinned here:
 * what the services' statements rely on; the statement deadline is the pool's own `statementTimeoutMs` (also a
 * startup parameter), `search_path` is PostgreSQL's default, and `DateStyle`/`IntervalStyle`/`bytea_output` are
 * what node-postgres parses. The three settings that end a session are pinned off (the seventh cold review: a
 * login's own `idle_session_timeout = '300ms'` ended a gateway replica's listening connection after every connect,
 * `transaction_timeout = '1ms'` ended every session before its first statement could run, so no statement, not even
 * RESET_OWN_DEFAULTS_SQL below, can undo them): a service's connections idle on purpose (a pool's idle connections,
 * a LISTEN connection between heartbeats) and bound their statements themselves (`statementTimeoutMs`, client-side
 * `queryTimeoutMs`); the pool closes its own idle connections after `idleTimeoutMs`. An operator's cluster-wide
 * idle timeouts therefore do not apply to these connections. Every other setting a login gave itself is reset when
 * the connection opens (RESET_OWN_DEFAULTS_SQL).
 */
export const PINNED_SESSION_OPTIONS = [
  '-c idle_session_timeout=0',
  '-c idle_in_transaction_session_timeout=0',
  '-c transaction_timeout=0',
  '-c default_transaction_read_only=off',
  '-c default_transaction_isolation=read\\ committed',
  '-c default_transaction_deferrable=off',
  '-c lock_timeout=0',
  '-c search_path="$user",public',
  '-c DateStyle=ISO',
  '-c IntervalStyle=postgres',
  '-c bytea_output=hex',
  // A library the login named for itself would be loaded before the first statement, and a missing one refuses
  // every connection, before any reset could run (tenth cold review): none, whatever the role says.
  '-c local_preload_libraries=',
  // `role` is hidden from pg_settings (so RESET_OWN_DEFAULTS_SQL does not see it), and a login may give itself any
  // role it may SET ROLE to as a default: the gateway's login made every later session run as
  // pg_use_reserved_connections, refused everything in its schema (eleventh cold review). The login itself, always.
  '-c role=none',
  // PL/pgSQL's settings are custom (`plpgsql.*`) until it loads, so the reset leaves them; a login may give them to
  // itself. The gateway's definer functions are written for PostgreSQL's defaults (print_strict_params would also
  // put a STRICT failure's parameters into its error message); pinned to them (twelfth cold review's hardening).
  '-c plpgsql.variable_conflict=error',
  '-c plpgsql.extra_errors=none',
  '-c plpgsql.extra_warnings=none',
  '-c plpgsql.print_strict_params=off',
].join(' ');

/**
 * Run once on every new connection, before anything else: every setting an ordinary session may change (context
 * `user`) whose value comes from a default of the login's own (`ALTER ROLE <itself> [IN DATABASE ...] SET ...`,
 * source `user` or `database user`) goes back to PostgreSQL's built-in value. This closes the class the pinned
 * options close member by member: a login may give itself a default for any such setting (`synchronous_commit =
 * off`, `statement_timeout` where a pool sets none, `row_security = off`, `extra_float_digits`, `enable_*` ...) and
 * every later session of every process inherits it. `RESET` would not do: it returns to the role's default. What
 * the startup options state (source `client`) and what the database's owner or the server's configuration set
 * (`database`, `configuration file`) are not touched; superuser settings cannot be given by a login to itself.
 * The `transaction_*` settings are left out: they cannot change once a statement has run, and the session-wide
 * `default_transaction_*` ones are pinned. Custom settings (`x.y`, no built-in value) are left as they are.
 */
export const RESET_OWN_DEFAULTS_SQL = `SELECT pg_catalog.count(pg_catalog.set_config(s.name, s.boot_val, false))::int AS reset
  FROM pg_catalog.pg_settings s
  WHERE s.source IN ('user', 'database user') AND s.context = 'user' AND s.boot_val IS NOT NULL
    AND s.name NOT IN ('transaction_isolation', 'transaction_read_only', 'transaction_deferrable')`;

/**
 * RESET_OWN_DEFAULTS_SQL on `client`. A failure is logged, not thrown: the connection then keeps the login's
 * defaults, as before this reset existed, and the service's start-time check names them.
 */
export async function resetOwnDefaults(
  client: { query(text: string): Promise<unknown> },
  logger: DbLogger,
): Promise<void> {
  try {
    await client.query(RESET_OWN_DEFAULTS_SQL);
  } catch (err) {
    logger.warn("database: the login's own session defaults not reset on a new connection", {
      error: err instanceof Error ? err.message : String(err),
      code: (err as { code?: unknown }).code,
    });
  }
}

const consoleLogger: DbLogger = {
  warn: (message, meta) => {
    console.warn(message, meta);
  },
};

/**
 * A Kysely instance over a pg Pool. A connection the server drops while it is idle in the pool
 * (restart, `pg_terminate_backend`, network loss) makes pg emit 'error' on the pool and on the
 * client; an 'error' event without a listener would crash the process, so both are logged here.
 * The failed client is discarded by the pool and the next query opens a new connection. Migration runs
 * lock their set's lock table, not a shared advisory key (migration-lock.ts).
 */
export function createDb<DB>(url: string, options: CreateDbOptions = {}): Kysely<DB> {
  const logger = options.logger ?? consoleLogger;
  const pool = new pg.Pool({
    connectionString: url,
    max: options.max ?? 10,
    connectionTimeoutMillis: options.connectionTimeoutMs ?? 5000,
    idleTimeoutMillis: options.idleTimeoutMs ?? 30000,
    ...(options.applicationName === undefined ? {} : { application_name: options.applicationName }),
    ...(options.statementTimeoutMs === undefined ? {} : { statement_timeout: options.statementTimeoutMs }),
    ...(options.queryTimeoutMs === undefined ? {} : { query_timeout: options.queryTimeoutMs }),
    // Startup parameters: set once per connection, no extra round trip per transaction.
    options: [
      PINNED_SESSION_OPTIONS,
      ...(options.synchronousCommit === undefined
        ? []
        : [`-c synchronous_commit=${options.synchronousCommit}`]),
    ].join(' '),
    // pg-pool (3.10+) awaits `onConnect` before it hands the connection out; @types/pg still types it as void.
    // eslint-disable-next-line @typescript-eslint/no-misused-promises
    onConnect: (client) => resetOwnDefaults(client, logger),
  });
  // The same error reaches both listeners when the client was idle; report it once.
  const reported = new WeakSet<Error>();
  const report = (err: Error): void => {
    if (reported.has(err)) return;
    reported.add(err);
    logger.warn('database connection error', {
      error: err.message,
      code: (err as { code?: unknown }).code,
    });
  };
  pool.on('error', report);
  // A client checked out by Kysely (inside a transaction, between statements) has no listener
  // of the pool's own; the query in flight, if any, still gets the error.
  pool.on('connect', (client) => {
    client.on('error', report);
  });
  if (options.metrics !== undefined)
    registerPoolMetrics(options.metrics, pool, options.applicationName ?? 'db');
  const db = new Kysely<DB>({ dialect: new TableLockPostgresDialect({ pool: new DeadlinePool(pool) }) });
  sideSessions.set(db, async () => {
    // Outside the pool (a migration handle has one connection, held by the run's transaction), with the same
    // login, startup options and connect deadline, and a short statement deadline of its own.
    const client = new pg.Client({
      connectionString: url,
      connectionTimeoutMillis: options.connectionTimeoutMs ?? 5000,
      application_name: `${options.applicationName ?? 'db'}-side`,
      statement_timeout: SIDE_STATEMENT_TIMEOUT_MS,
      options: PINNED_SESSION_OPTIONS,
    });
    client.on('error', report);
    await client.connect();
    return client;
  });
  return db;
}

/** A statement of a side session (sideSession) is cut off after this long (ms). */
const SIDE_STATEMENT_TIMEOUT_MS = 5000;

/** A connection of its own beside a createDb handle's pool; the caller ends it. */
export type SideSession = pg.Client;

const sideSessions = new WeakMap<object, () => Promise<SideSession>>();

/**
 * Opens one more connection of `db`'s login, outside its pool: work that must go on while the pool's connection
 * waits (the migrations' password step ends, from here, the sessions its statement waits for). Undefined for a
 * handle that does not come from createDb.
 */
export function sideSession(db: object): (() => Promise<SideSession>) | undefined {
  return sideSessions.get(db);
}

/** The message node-postgres gives a statement whose `query_timeout` passed (pg/lib/client.js). */
export const QUERY_DEADLINE_MESSAGE = 'Query read timeout';

function isQueryDeadline(err: unknown): boolean {
  return err instanceof Error && err.message === QUERY_DEADLINE_MESSAGE;
}

/**
 * The pool as Kysely sees it. node-postgres fails a statement at its `query_timeout` but leaves the
 * statement in flight on the connection: the next statement (Kysely's ROLLBACK, or the next request's
 * BEGIN if the connection went back to the pool) would queue behind it and wait as long as the server
 * stalls. A connection whose statement passed its deadline is therefore poisoned: later statements on
 * it fail at once with the same error, and its release closes it (pg-pool removes a client released
 * with an error). A transaction cut short this way is never committed by this process; whether the
 * server had already committed it when it stopped answering cannot be known from here.
 */
class DeadlinePool implements PostgresPool {
  constructor(private readonly pool: pg.Pool) {}

  async connect(): Promise<PostgresPoolClient> {
    return new DeadlineClient(await this.pool.connect());
  }

  end(): Promise<void> {
    return this.pool.end();
  }
}

class DeadlineClient implements PostgresPoolClient {
  private expired: Error | undefined;

  constructor(private readonly client: pg.PoolClient) {}

  query<R>(sql: string, parameters: readonly unknown[]): Promise<PostgresQueryResult<R>>;
  query<R>(cursor: PostgresCursor<R>): PostgresCursor<R>;
  query<R>(
    sqlOrCursor: string | PostgresCursor<R>,
    parameters?: readonly unknown[],
  ): Promise<PostgresQueryResult<R>> | PostgresCursor<R> {
    if (typeof sqlOrCursor !== 'string') {
      // Streaming (Kysely's `stream()` with a cursor) is not used by this project; passed through as is.
      return (this.client as unknown as { query(c: PostgresCursor<R>): PostgresCursor<R> }).query(
        sqlOrCursor,
      );
    }
    if (this.expired !== undefined) return Promise.reject(this.expired);
    const result = this.client.query(sqlOrCursor, parameters as unknown[]) as unknown as Promise<
      PostgresQueryResult<R>
    >;
    return result.catch((err: unknown) => {
      if (isQueryDeadline(err)) this.expired = err as Error;
      throw err;
    });
  }

  release(): void {
    this.client.release(this.expired);
  }
}

const POOL_METRIC = 'db_pool_connections';

/** One gauge per registry; each pool adds its own `pool` label value, read at scrape time. */
function registerPoolMetrics(registry: Registry, pool: pg.Pool, name: string): void {
  const pools = poolsByRegistry.get(registry) ?? new Map<string, pg.Pool>();
  pools.set(name, pool);
  if (poolsByRegistry.has(registry)) return;
  poolsByRegistry.set(registry, pools);
  new Gauge({
    name: POOL_METRIC,
    help: 'Database pool connections by state: total (open), idle, waiting (queries queued for a connection).',
    labelNames: ['pool', 'state'],
    registers: [registry],
    collect() {
      for (const [label, p] of pools) {
        this.set({ pool: label, state: 'total' }, p.totalCount);
        this.set({ pool: label, state: 'idle' }, p.idleCount);
        this.set({ pool: label, state: 'waiting' }, p.waitingCount);
      }
    },
  });
}

const poolsByRegistry = new WeakMap<Registry, Map<string, pg.Pool>>();
