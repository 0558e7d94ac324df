// Connections are a shared resource of the PostgreSQL cluster (max_connections): a login that opens them
// without end refuses every other login, the gateway's included (issue "hardening round 4", section 1; the
// second attack on the bus took every slot as the workflow's login). This migration gives the enterprise
// side's logins a CONNECTION LIMIT, so that together they cannot take the whole cluster:
//   - `authenticator` (PostgREST): 30, for 2 replicas of PGRST_DB_POOL=10 and a third during a rolling update;
//   - `enterprise_api_login` (the workflow): 30, for 2 replicas of DB_POOL_MAX=10 and a third likewise.
// A login whose limit an operator has already set (anything but -1, "no limit") keeps it: the migration
// only sets a limit where there is none. The limit counts a login's sessions in every database of the
// cluster (CREATE ROLE in the manual: "how many concurrent connections the role can make"). The gateway's
// own login gets the cluster's reserved connections instead (gateway migration 0022); operations §7 says
// how the sizes fit max_connections.
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const UP_SQL = `
DO $$
DECLARE
  login record;
BEGIN
  FOR login IN
    SELECT r.rolname, l.connlimit
    FROM (VALUES ('authenticator', 30), ('enterprise_api_login', 30)) AS l(rolname, connlimit)
    JOIN pg_catalog.pg_roles r ON r.rolname = l.rolname
    WHERE r.rolconnlimit = -1
  LOOP
    EXECUTE pg_catalog.format('ALTER ROLE %I CONNECTION LIMIT %s', login.rolname, login.connlimit);
  END LOOP;
END $$;
`;

const DOWN_SQL = `
ALTER ROLE authenticator CONNECTION LIMIT -1;
ALTER ROLE enterprise_api_login CONNECTION LIMIT -1;
`;

export const connectionLimitsMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
