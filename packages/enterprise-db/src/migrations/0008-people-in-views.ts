// One rule for every read-surface view that names a person (design §4.2): a `sub` is shown only while it
// belongs to a user of the row's company, as the decision history (0006) already shows its deciders.
//
// Before this migration enterprise_api.work_items.decided_by and enterprise_api.media_items.uploaded_by were
// the stored `sub`, whoever it was now: a user who had left the company (moved to another, removed) stayed
// named there while the decision history showed NULL for the same decision. Both views now join the person
// on (sub, company_id = the row's company), exactly as work_item_decisions does: NULL for anyone who is not
// a principal of the row's company. The portal role already reads principals' (sub, company_id,
// display_name) of its own company (0006), so no grant changes. The base tables keep the stored `sub` (the
// audit, the workflow's own checks).
//
// The columns keep their names, types and order (CREATE OR REPLACE VIEW), so PostgREST's clients see the
// same shape; only the values follow the rule.
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const UP_SQL = `
CREATE OR REPLACE VIEW enterprise_api.work_items WITH (security_invoker = true) AS
  SELECT w.id, w.site_id, w.company_id, w.asset_id, w.walkthrough_id, w.title, w.description, w.category,
         w.severity, w.state, w.estimate_amount, w.estimate_currency, w.defer_until, w.decided_at,
         p.sub AS decided_by, w.decision_note, w.created_at, w.updated_at
  FROM enterprise.work_items w
  LEFT JOIN enterprise.principals p ON p.sub = w.decided_by AND p.company_id = w.company_id;
COMMENT ON COLUMN enterprise_api.work_items.decided_by IS 'JWT "sub" of the user who made the latest decision; NULL when undecided or the decider is not a user of this company.';

CREATE OR REPLACE VIEW enterprise_api.media_items WITH (security_invoker = true) AS
  SELECT m.id, m.site_id, m.company_id, m.status, m.filename,
         CASE WHEN m.status = 'available' THEN m.actual_content_type ELSE m.declared_content_type END AS content_type,
         CASE WHEN m.status = 'available' THEN m.actual_size_bytes ELSE m.declared_size_bytes END AS size_bytes,
         m.walkthrough_id, m.work_item_id, m.asset_id, p.sub AS uploaded_by, m.created_at, m.uploaded_at
  FROM enterprise.media_items m
  LEFT JOIN enterprise.principals p ON p.sub = m.uploaded_by AND p.company_id = m.company_id;
COMMENT ON COLUMN enterprise_api.media_items.uploaded_by IS 'JWT "sub" of the user who created the upload intent; NULL when that user is not a user of this company.';
`;

const DOWN_SQL = `
COMMENT ON COLUMN enterprise_api.media_items.uploaded_by IS NULL;
CREATE OR REPLACE VIEW enterprise_api.media_items WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, status, filename,
         CASE WHEN status = 'available' THEN actual_content_type ELSE declared_content_type END AS content_type,
         CASE WHEN status = 'available' THEN actual_size_bytes ELSE declared_size_bytes END AS size_bytes,
         walkthrough_id, work_item_id, asset_id, uploaded_by, created_at, uploaded_at
  FROM enterprise.media_items;
COMMENT ON COLUMN enterprise_api.work_items.decided_by IS NULL;
CREATE OR REPLACE VIEW enterprise_api.work_items WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, asset_id, walkthrough_id, title, description, category, severity,
         state, estimate_amount, estimate_currency, defer_until, decided_at, decided_by,
         decision_note, created_at, updated_at
  FROM enterprise.work_items;
`;

export const peopleInViewsMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
