// The locks that serialise intents in parts of one uploader and of one site (design §4.4, the caps of issue 39 §4)
// become row locks on a table only the workflow may write, instead of transaction-scoped advisory locks.
// pg_advisory_xact_lock and pg_advisory_lock are executable by PUBLIC, and the keys were
// hashtextextended('multipart-open-uploader:<sub>') and ('multipart-open-site:<site id>'), both predictable: any
// login that may connect to the platform's database (PostgREST's authenticator, the gateway's login) could hold a
// user's or a site's key in an idle session and make every intent in parts of that user or site wait until the
// workflow's statement deadline, then fail. A row lock needs UPDATE on the row's table (ON CONFLICT DO UPDATE takes
// it, PostgreSQL "INSERT": "ON CONFLICT DO UPDATE ... locks the existing row"), which only enterprise_api_role has.
// One row per uploader and per site, written once and locked in every intent in parts that follows, uploader first
// and site second as before, so two intents never wait on each other in a cycle.
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const UP_SQL = `
CREATE TABLE enterprise.multipart_gates (
  gate text PRIMARY KEY CHECK (gate ~ '^(uploader|site):' AND octet_length(gate) <= 300)
);
COMMENT ON TABLE enterprise.multipart_gates IS 'One row per uploader (uploader:<sub>) and per site (site:<id>); an intent in parts locks its two rows (INSERT ... ON CONFLICT DO UPDATE) while it counts the open uploads it is capped by. Only the workflow may write or lock them.';
ALTER TABLE enterprise.multipart_gates ENABLE ROW LEVEL SECURITY;
ALTER TABLE enterprise.multipart_gates FORCE ROW LEVEL SECURITY;
GRANT SELECT, INSERT, UPDATE (gate) ON enterprise.multipart_gates TO enterprise_api_role;
-- A caller locks only its own uploader row and the rows of sites it may see (the site list, as every policy).
CREATE POLICY api_locks_gates ON enterprise.multipart_gates TO enterprise_api_role
  USING (CASE WHEN gate LIKE 'site:%' THEN substr(gate, 6) = ANY ((SELECT enterprise_api.authorized_site_ids())::text[]) ELSE gate = 'uploader:' || (SELECT enterprise_api.request_sub()) END)
  WITH CHECK (CASE WHEN gate LIKE 'site:%' THEN substr(gate, 6) = ANY ((SELECT enterprise_api.authorized_site_ids())::text[]) ELSE gate = 'uploader:' || (SELECT enterprise_api.request_sub()) END);
`;

const DOWN_SQL = `
DROP TABLE enterprise.multipart_gates;
`;

export const multipartGatesMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
