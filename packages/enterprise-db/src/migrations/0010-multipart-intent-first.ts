// An upload in parts is recorded before the store's upload exists (design §4.4). Until 0009 the workflow asked
// the store for the upload first and then recorded the item with the upload's id: an upload whose answer came
// too late, or whose recording failed, was named by no row. Now the intent's row is written first, with its
// plan (part size and count) and no upload id; the store's upload is started next and its id set on the row.
// Every store upload under a media key then has a row naming its key, and the sweep finds the rest (0009).
//
// What changes:
// - media_items_multipart_plan: a plan may exist without an upload id (`planned`); an upload id still needs a
//   plan.
// - enterprise_api_role may set the upload id of its caller's own planned item, once (only while it is NULL
//   and the item pending), and may abandon its caller's own planned item whose upload could not be started.
// - The sweep (no caller) abandons planned items whose upload was never started after a grace period (a
//   start takes seconds): a definer function of enterprise_media_ingest, which only touches such items.
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const TENANT_CHECK = `company_id = (SELECT COALESCE(NULLIF(pg_catalog.current_setting('enterprise.company_hint', true), '')::pg_catalog.uuid, enterprise_api.authorized_company_id()))
    AND site_id = ANY ((SELECT CASE WHEN pg_catalog.current_setting('enterprise.company_hint', true) OPERATOR(pg_catalog.=) '00000000-0000-0000-0000-000000000000' THEN '{}'::pg_catalog.uuid[]
      ELSE enterprise_api.authorized_site_ids() END)::uuid[])`;

const OWN = `uploaded_by = (SELECT enterprise_api.request_sub())`;

const UP_SQL = `
ALTER TABLE enterprise.media_items DROP CONSTRAINT media_items_multipart_plan;
ALTER TABLE enterprise.media_items ADD CONSTRAINT media_items_multipart_plan CHECK (
  (part_size_bytes IS NULL) = (part_count IS NULL)
  AND (multipart_upload_id IS NULL OR part_count IS NOT NULL));
CREATE INDEX media_items_unstarted_multipart_idx ON enterprise.media_items (created_at)
  WHERE status = 'pending_upload' AND multipart_upload_id IS NULL AND part_count IS NOT NULL;
COMMENT ON COLUMN enterprise.media_items.multipart_upload_id IS 'The store''s multipart upload id, for an upload in parts once the store started it (NULL before: the plan is recorded first); null for a single PUT.';

GRANT UPDATE (multipart_upload_id) ON enterprise.media_items TO enterprise_api_role;
CREATE POLICY api_starts_own_multipart_upload ON enterprise.media_items FOR UPDATE TO enterprise_api_role
  USING (${TENANT_CHECK} AND ${OWN} AND status = 'pending_upload' AND multipart_upload_id IS NULL
    AND part_count IS NOT NULL)
  WITH CHECK (${TENANT_CHECK} AND ${OWN} AND status = 'pending_upload' AND multipart_upload_id IS NOT NULL
    AND part_count IS NOT NULL);
CREATE POLICY api_abandons_own_unstarted_multipart ON enterprise.media_items FOR UPDATE TO enterprise_api_role
  USING (${TENANT_CHECK} AND ${OWN} AND status = 'pending_upload' AND multipart_upload_id IS NULL
    AND part_count IS NOT NULL)
  WITH CHECK (${TENANT_CHECK} AND ${OWN} AND status = 'abandoned' AND multipart_upload_id IS NULL
    AND part_count IS NOT NULL);

GRANT SELECT (part_count, created_at) ON enterprise.media_items TO enterprise_media_ingest;
CREATE POLICY ingest_abandons_unstarted_multipart ON enterprise.media_items FOR UPDATE TO enterprise_media_ingest
  USING (status = 'pending_upload' AND multipart_upload_id IS NULL AND part_count IS NOT NULL)
  WITH CHECK (status = 'abandoned' AND multipart_upload_id IS NULL);

CREATE FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(p_created_before timestamptz, p_limit integer)
  RETURNS integer
  LANGUAGE sql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  WITH stale AS (
    SELECT mi.id FROM enterprise.media_items mi
    WHERE mi.status = 'pending_upload' AND mi.multipart_upload_id IS NULL AND mi.part_count IS NOT NULL
      AND mi.created_at < LEAST(p_created_before, now())
    ORDER BY mi.created_at
    LIMIT LEAST(GREATEST(p_limit, 0), 1000)
  ), changed AS (
    UPDATE enterprise.media_items mi
    SET status = 'abandoned', rejection_reason = 'the store''s upload could not be started', updated_at = now()
    FROM stale WHERE mi.id = stale.id AND mi.status = 'pending_upload' AND mi.multipart_upload_id IS NULL
    RETURNING mi.id
  )
  SELECT count(*)::integer FROM changed
$$;
COMMENT ON FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(timestamptz, integer) IS 'Sweep: marks pending multipart items whose store upload was never started, created before p_created_before (never later than now), abandoned; at most p_limit (1000). Returns how many. Runs as enterprise_media_ingest.';

REVOKE EXECUTE ON FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(timestamptz, integer) FROM PUBLIC;
GRANT CREATE ON SCHEMA enterprise_api TO enterprise_media_ingest;
ALTER FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(timestamptz, integer) OWNER TO enterprise_media_ingest;
REVOKE CREATE ON SCHEMA enterprise_api FROM enterprise_media_ingest;
GRANT EXECUTE ON FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(timestamptz, integer) TO enterprise_api_role;
`;

const DOWN_SQL = `
DROP FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(timestamptz, integer);
DROP POLICY ingest_abandons_unstarted_multipart ON enterprise.media_items;
REVOKE SELECT (part_count, created_at) ON enterprise.media_items FROM enterprise_media_ingest;
DROP POLICY api_abandons_own_unstarted_multipart ON enterprise.media_items;
DROP POLICY api_starts_own_multipart_upload ON enterprise.media_items;
REVOKE UPDATE (multipart_upload_id) ON enterprise.media_items FROM enterprise_api_role;
-- The previous rule cannot hold a plan without an upload: such an item (never started) becomes an abandoned
-- item without a plan.
UPDATE enterprise.media_items SET status = 'abandoned',
  rejection_reason = coalesce(rejection_reason, 'the store''s upload could not be started'),
  part_size_bytes = NULL, part_count = NULL
  WHERE multipart_upload_id IS NULL AND part_count IS NOT NULL;
DROP INDEX enterprise.media_items_unstarted_multipart_idx;
ALTER TABLE enterprise.media_items DROP CONSTRAINT media_items_multipart_plan;
ALTER TABLE enterprise.media_items ADD CONSTRAINT media_items_multipart_plan CHECK (
  (multipart_upload_id IS NULL AND part_size_bytes IS NULL AND part_count IS NULL)
  OR (multipart_upload_id IS NOT NULL AND part_size_bytes IS NOT NULL AND part_count IS NOT NULL));
COMMENT ON COLUMN enterprise.media_items.multipart_upload_id IS 'The store''s multipart upload id, for an upload in parts; null for a single PUT.';
`;

export const multipartIntentFirstMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
