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
}

export async function readConnectionReserve(db: Kysely<unknown>): Promise<ConnectionReserve> {
  const { rows } = await sql<{ reserved: string | null; member: boolean; open: string[] }>`
    SELECT
      (SELECT setting FROM pg_catalog.pg_settings WHERE name = 'reserved_connections') AS reserved,
      EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = 'pg_use_reserved_connections'
              AND pg_catalog.pg_has_role(current_user, r.oid, 'USAGE')) AS member,
      ARRAY(SELECT datname::text FROM pg_catalog.pg_database
            WHERE datallowconn AND pg_catalog.has_database_privilege('public', oid, 'CONNECT')
            ORDER BY datname) AS open`.execute(db);
  const row = rows[0];
  if (row === undefined) throw new Error('connection reserve: no answer');
  return {
    reserved: row.reserved === null ? undefined : Number(row.reserved),
    member: row.member,
    openToPublic: row.open,
  };
}

/** What leaves the gateway's login without a slot when others take them all, in words for the log; or undefined. */
export function connectionReserveGap(reserve: ConnectionReserve): string | undefined {
  if (reserve.reserved === undefined) return 'PostgreSQL before 16 has no reserved_connections';
  if (reserve.reserved === 0) return 'reserved_connections is 0';
  if (!reserve.member) return 'the login lacks the privileges of pg_use_reserved_connections';
  return undefined;
}
