// CONNECT on the platform's database is a decision, not a default (design §4.2; issue "hardening round 4",
// section 1). PostgreSQL gives PUBLIC CONNECT on every new database (GRANT in the manual: "CONNECT ... granted to
// PUBLIC by default"), so any login of the cluster could connect to this one, and once connected, send and hear
// notifications on any channel (LISTEN and NOTIFY take no privilege). This set takes CONNECT from PUBLIC and gives
// it to its own logins, PostgREST's `authenticator` and the workflow's `enterprise_api_login`; the gateway's
// migration 0017 does the same for its login. Owners and superusers keep connecting as before (an owner holds
// every privilege on its database).
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const UP_SQL = `
DO $$
BEGIN
  EXECUTE pg_catalog.format('REVOKE CONNECT ON DATABASE %I FROM PUBLIC', pg_catalog.current_database());
  EXECUTE pg_catalog.format('GRANT CONNECT ON DATABASE %I TO authenticator, enterprise_api_login',
    pg_catalog.current_database());
END $$;
`;

const DOWN_SQL = `
DO $$
BEGIN
  EXECUTE pg_catalog.format('REVOKE CONNECT ON DATABASE %I FROM authenticator, enterprise_api_login',
    pg_catalog.current_database());
  EXECUTE pg_catalog.format('GRANT CONNECT ON DATABASE %I TO PUBLIC', pg_catalog.current_database());
END $$;
`;

export const connectGrantsMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
