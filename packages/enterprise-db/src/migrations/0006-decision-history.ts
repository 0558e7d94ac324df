// Decision history on the read surface: the audit of decisions (enterprise.work_item_decisions) as the
// view enterprise_api.work_item_decisions, so the portal shows who decided what and when (design §4.2).
//
// What the portal role gets, and why no more:
// - The audit rows of its sites, under the same tenant check as every other portal read (the stored
//   company narrows, the site ids grant; design §4.2). Not `request_id`: it correlates server logs, as
//   object keys address storage, and neither is the portal's business.
// - The decider's display name, from enterprise.principals, which the portal role could not read at all.
//   It gets three columns (sub, company_id, display_name: not all_sites or active, the access map's
//   decisions) and only the principals of its own company. That policy uses authorized_company_id() and
//   not the stored company hint: here no site check backs the company up, so a forged hint would name
//   another company's people (the rule 0004 follows for enterprise.companies).
// - The view joins the decider on (sub, company_id = the decision's company): a decider who is not a
//   principal of the row's company (moved to another company, removed, a service identity) shows as
//   NULL, sub and name alike. The principals policy already hides other companies' people; the join
//   keeps the view from naming them by itself, should that policy ever be widened.
// - An index (company_id, decided_at DESC, site_id) for "newest decisions first", the shape of
//   work_items' list index: one ordered scan of the caller's tenant range, site check inside it.
//
// Self-contained SQL: no helper of an earlier migration is imported, so this file reads as what it does.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const TENANT_CHECK = `company_id = (SELECT COALESCE(NULLIF(pg_catalog.current_setting('enterprise.company_hint', true), '')::pg_catalog.uuid, enterprise_api.authorized_company_id()))
    AND site_id = ANY ((SELECT CASE WHEN pg_catalog.current_setting('enterprise.company_hint', true) OPERATOR(pg_catalog.=) '00000000-0000-0000-0000-000000000000' THEN '{}'::pg_catalog.uuid[]
      ELSE enterprise_api.authorized_site_ids() END)::uuid[])`;

const UP_SQL = `
CREATE INDEX work_item_decisions_tenant_decided_idx
  ON enterprise.work_item_decisions (company_id, decided_at DESC, site_id);

GRANT SELECT (id, work_item_id, site_id, company_id, decision, previous_state, new_state, note, defer_until,
  decided_by, decided_at) ON enterprise.work_item_decisions TO enterprise_portal_role;
CREATE POLICY portal_reads_work_item_decisions ON enterprise.work_item_decisions FOR SELECT TO enterprise_portal_role
  USING (${TENANT_CHECK});

GRANT SELECT (sub, company_id, display_name) ON enterprise.principals TO enterprise_portal_role;
CREATE POLICY portal_reads_own_company_names ON enterprise.principals FOR SELECT TO enterprise_portal_role
  USING (company_id = (SELECT enterprise_api.authorized_company_id()));

CREATE VIEW enterprise_api.work_item_decisions WITH (security_invoker = true) AS
  SELECT d.id, d.work_item_id, d.site_id, d.company_id, d.decision, d.previous_state, d.new_state, d.note,
         d.defer_until, d.decided_at, p.sub AS decided_by, NULLIF(p.display_name, '') AS decided_by_name
  FROM enterprise.work_item_decisions d
  LEFT JOIN enterprise.principals p ON p.sub = d.decided_by AND p.company_id = d.company_id;
COMMENT ON VIEW enterprise_api.work_item_decisions IS 'Decision history of the work items at the caller''s sites: who decided what and when; decide through the workflow service.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.id IS 'Audit row id (increasing).';
COMMENT ON COLUMN enterprise_api.work_item_decisions.work_item_id IS 'Work item decided.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.site_id IS 'Site of the work item.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.decision IS 'Decision requested: accept, defer or decline.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.previous_state IS 'State before the decision.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.new_state IS 'State after the decision.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.note IS 'Note given by the decider.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.defer_until IS 'For defer: until when.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.decided_at IS 'When the decision was recorded.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.decided_by IS 'JWT "sub" of the decider; NULL when the decider is not a user of this company.';
COMMENT ON COLUMN enterprise_api.work_item_decisions.decided_by_name IS 'Display name of the decider; NULL when none is recorded or the decider is not a user of this company.';
GRANT SELECT ON enterprise_api.work_item_decisions TO enterprise_portal_role;
`;

const DOWN_SQL = `
DROP VIEW enterprise_api.work_item_decisions;
DROP POLICY portal_reads_own_company_names ON enterprise.principals;
REVOKE SELECT (sub, company_id, display_name) ON enterprise.principals FROM enterprise_portal_role;
DROP POLICY portal_reads_work_item_decisions ON enterprise.work_item_decisions;
REVOKE SELECT (id, work_item_id, site_id, company_id, decision, previous_state, new_state, note, defer_until,
  decided_by, decided_at) ON enterprise.work_item_decisions FROM enterprise_portal_role;
DROP INDEX enterprise.work_item_decisions_tenant_decided_idx;
`;

export const decisionHistoryMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
