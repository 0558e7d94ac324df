// Whether the gateway's login can still connect when other logins take every ordinary connection slot (issue 39;
// migration 0022, operations §7). Read once at start from catalogs every login may read; a gap is logged, not
// fatal: the gateway works without the reserve until someone exhausts the cluster.
import { sql, type Kysely } from 'kysely';

export interface ConnectionReserve {
  /** `reserved_connections`; undefined before PostgreSQL 16, which has none. */
  reserved: number | undefined;
  /** Whether this login has the privileges of `pg_use_reserved_connections` (membership alone is not enough). */
  member: boolean;
  /** Databases of the cluster any login may connect to (CONNECT held by PUBLIC). */
  openToPublic: string[];
  /**
   * What lets any login of this database fill the cluster's lock table, its disk or its WAL (migrations 0031, 0034,
   * 0036): EXECUTE for PUBLIC on nextval, pg_advisory_lock, pg_get_object_address, the large-object functions or
   * pg_logical_emit_message, TEMP for PUBLIC on the database. Empty when those migrations took them.
   */
  lockRightsOfPublic: string[];
  /**
   * This login's own defaults (`ALTER ROLE <login> [IN DATABASE <this one>] SET ...`, pg_db_role_setting), e.g.
   * `default_transaction_read_only=on`: the login may set them itself and they outlive its sessions. The gateway's
   * connections pin what they rely on (service-kit's PINNED_SESSION_OPTIONS); any row is still named at start.
   */
  roleSettings: string[];
  /**
   * `temp_file_limit` of this session (kB, or -1 for none): -1 lets every session of any login keep temporary files
   * without bound on the disk the WAL shares (migration 0040 sets it where a superuser runs the migrations).
   */
  tempFileLimit: string;
  /**
   * `max_prepared_transactions`: above 0, a login may leave a prepared transaction that holds rows (its own role's,
   * which the migrations' password step must change) after its session is gone (eleventh cold review); no service of
   * the platform uses two-phase commit.
   */
  preparedTransactions: number;
}

export async function readConnectionReserve(db: Kysely<unknown>): Promise<ConnectionReserve> {
  const { rows } = await sql<{
    reserved: string | null;
    member: boolean;
    open: string[];
    locks: string[];
    settings: string[];
    temp: string;
    prepared: string;
  }>`
    SELECT
      (SELECT setting FROM pg_catalog.pg_settings WHERE name = 'reserved_connections') AS reserved,
      EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = 'pg_use_reserved_connections'
              AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')) AS member,
      ARRAY(SELECT datname::text FROM pg_catalog.pg_database
            WHERE datallowconn AND pg_catalog.has_database_privilege('public', oid, 'CONNECT')
            ORDER BY datname) AS open,
      ARRAY(SELECT w FROM (VALUES
              ('EXECUTE on nextval', pg_catalog.has_function_privilege('public', 'pg_catalog.nextval(regclass)', 'EXECUTE')),
              ('EXECUTE on pg_advisory_lock',
               pg_catalog.has_function_privilege('public', 'pg_catalog.pg_advisory_lock(bigint)', 'EXECUTE')),
              ('TEMP on the database', pg_catalog.has_database_privilege('public', pg_catalog.current_database(), 'TEMP')),
              ('EXECUTE on pg_get_object_address', pg_catalog.has_function_privilege('public',
                'pg_catalog.pg_get_object_address(text, text[], text[])', 'EXECUTE')),
              ('EXECUTE on lo_from_bytea',
               pg_catalog.has_function_privilege('public', 'pg_catalog.lo_from_bytea(oid, bytea)', 'EXECUTE')),
              ('EXECUTE on pg_logical_emit_message', pg_catalog.has_function_privilege('public',
                'pg_catalog.pg_logical_emit_message(boolean, text, text, boolean)', 'EXECUTE')
                OR pg_catalog.has_function_privilege('public',
                'pg_catalog.pg_logical_emit_message(boolean, text, bytea, boolean)', 'EXECUTE'))
            ) AS x(w, open) WHERE open) AS locks,
      ARRAY(SELECT CASE WHEN s.setdatabase = 0 THEN '' ELSE 'in this database: ' END || c.setting
            FROM pg_catalog.pg_db_role_setting s, pg_catalog.unnest(s.setconfig) AS c(setting)
            WHERE s.setrole = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = session_user)
              AND s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d
                                        WHERE d.datname = pg_catalog.current_database()))
            ORDER BY s.setdatabase, c.setting) AS settings,
      pg_catalog.current_setting('temp_file_limit') AS temp,
      pg_catalog.current_setting('max_prepared_transactions') AS prepared`.execute(db);
  const row = rows[0];
  if (row === undefined) throw new Error('connection reserve: no answer');
  return {
    reserved: row.reserved === null ? undefined : Number(row.reserved),
    member: row.member,
    openToPublic: row.open,
    lockRightsOfPublic: row.locks,
    roleSettings: row.settings,
    tempFileLimit: row.temp,
    preparedTransactions: Number(row.prepared),
  };
}

/** What leaves the gateway's login without a slot when others take them all, in words for the log; or undefined. */
export function connectionReserveGap(reserve: ConnectionReserve): string | undefined {
  if (reserve.reserved === undefined) return 'PostgreSQL before 16 has no reserved_connections';
  if (reserve.reserved === 0) return 'reserved_connections is 0';
  if (!reserve.member) return 'the login lacks the privileges of pg_use_reserved_connections';
  return undefined;
}

/** What lets any login fill the lock table and lock this gateway out, in words for the log; or undefined. */
export function lockTableGap(reserve: ConnectionReserve): string | undefined {
  return reserve.lockRightsOfPublic.length === 0
    ? undefined
    : `PUBLIC still has ${reserve.lockRightsOfPublic.join(', ')}`;
}

/**
 * This login's own defaults, in words for the log (operations §7: `ALTER ROLE device_gateway_login RESET ALL`, and
 * `... IN DATABASE <db> RESET ALL`); or undefined. Not fatal: the pinned settings hold whatever they say.
 */
export function roleSettingsGap(reserve: ConnectionReserve): string | undefined {
  return reserve.roleSettings.length === 0
    ? undefined
    : `the login has defaults of its own (ALTER ROLE ... SET): ${reserve.roleSettings.join(', ')}`;
}

/** Whether prepared transactions are enabled, in words for the log (operations §7: keep it 0); or undefined. */
export function preparedTransactionsGap(reserve: ConnectionReserve): string | undefined {
  return reserve.preparedTransactions > 0
    ? `max_prepared_transactions is ${reserve.preparedTransactions}: a login's prepared transaction can hold rows ` +
        'after its session ends (the migrations end those of the logins they manage, where they may)'
    : undefined;
}

/**
 * Whether any session may keep temporary files without bound, in words for the log (operations §7: a superuser's
 * `ALTER SYSTEM SET temp_file_limit = '1GB'`, or migration 0040 run by one); or undefined.
 */
export function tempFileGap(reserve: ConnectionReserve): string | undefined {
  return reserve.tempFileLimit === '-1'
    ? "temp_file_limit is -1: any login's session may keep temporary files without bound"
    : undefined;
}
