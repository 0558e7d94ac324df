// Multipart uploads of large media (design §4.4): an upload intent above a size threshold starts an S3
// multipart upload instead of answering one PUT URL, and the media item remembers the plan (upload id,
// part size, part count) that presigning, listing, completing and aborting check against.
//
// A new media state, `abandoned`: a multipart upload that its uploader aborted, or whose intent expired
// before it was completed (the sweep aborts it in the store). Like `rejected` it is final, and its
// reason is kept in rejection_reason.
//
// Who may write it:
// - the workflow under the caller's claims (enterprise_api_role): a pending multipart item of the caller's
//   sites to `abandoned`, nothing else (the abort endpoint);
// - the sweep, which has no caller: two SECURITY DEFINER functions owned by `enterprise_media_ingest`,
//   one listing expired pending multipart items, one marking such an item abandoned. Neither can touch an
//   item that is not pending, not multipart or not expired.
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const TENANT_CHECK = `company_id = (SELECT COALESCE(NULLIF(pg_catalog.current_setting('enterprise.company_hint', true), '')::pg_catalog.uuid, enterprise_api.authorized_company_id()))
    AND site_id = ANY ((SELECT CASE WHEN pg_catalog.current_setting('enterprise.company_hint', true) OPERATOR(pg_catalog.=) '00000000-0000-0000-0000-000000000000' THEN '{}'::pg_catalog.uuid[]
      ELSE enterprise_api.authorized_site_ids() END)::uuid[])`;

const UP_SQL = `
ALTER TABLE enterprise.media_items
  ADD COLUMN multipart_upload_id text CHECK (length(multipart_upload_id) BETWEEN 1 AND 1024),
  ADD COLUMN part_size_bytes bigint CHECK (part_size_bytes > 0),
  ADD COLUMN part_count integer CHECK (part_count BETWEEN 1 AND 10000),
  ADD CONSTRAINT media_items_multipart_plan CHECK (
    (multipart_upload_id IS NULL AND part_size_bytes IS NULL AND part_count IS NULL)
    OR (multipart_upload_id IS NOT NULL AND part_size_bytes IS NOT NULL AND part_count IS NOT NULL)),
  ADD CONSTRAINT media_items_abandoned_reason CHECK (status <> 'abandoned' OR rejection_reason IS NOT NULL);
ALTER TABLE enterprise.media_items DROP CONSTRAINT media_items_status_check;
ALTER TABLE enterprise.media_items ADD CONSTRAINT media_items_status_check
  CHECK (status IN ('pending_upload', 'available', 'rejected', 'abandoned'));
CREATE INDEX media_items_pending_multipart_idx ON enterprise.media_items (upload_expires_at)
  WHERE status = 'pending_upload' AND multipart_upload_id IS NOT NULL;
COMMENT ON COLUMN enterprise.media_items.status IS 'pending_upload until the store reports the object, then available or rejected; a multipart upload aborted by its uploader or expired before completion is abandoned.';
COMMENT ON COLUMN enterprise.media_items.rejection_reason IS 'Why the upload was rejected (size or type differ from the intent) or abandoned (aborted, or its intent expired).';
COMMENT ON COLUMN enterprise.media_items.multipart_upload_id IS 'The store''s multipart upload id, for an upload in parts; null for a single PUT.';
COMMENT ON COLUMN enterprise.media_items.part_size_bytes IS 'Size of every part but the last, for an upload in parts.';
COMMENT ON COLUMN enterprise.media_items.part_count IS 'Number of parts of an upload in parts.';

GRANT INSERT (multipart_upload_id, part_size_bytes, part_count) ON enterprise.media_items TO enterprise_api_role;
GRANT UPDATE (status, rejection_reason, updated_at) ON enterprise.media_items TO enterprise_api_role;
CREATE POLICY api_abandons_multipart_media ON enterprise.media_items FOR UPDATE TO enterprise_api_role
  USING (${TENANT_CHECK} AND status = 'pending_upload' AND multipart_upload_id IS NOT NULL)
  WITH CHECK (${TENANT_CHECK} AND status = 'abandoned' AND multipart_upload_id IS NOT NULL);

GRANT SELECT (multipart_upload_id, upload_expires_at) ON enterprise.media_items TO enterprise_media_ingest;
CREATE POLICY ingest_abandons_expired_multipart ON enterprise.media_items FOR UPDATE TO enterprise_media_ingest
  USING (status = 'pending_upload' AND multipart_upload_id IS NOT NULL AND upload_expires_at < now())
  WITH CHECK (status = 'abandoned');

CREATE FUNCTION enterprise_api.expired_multipart_uploads(p_expired_before timestamptz, p_limit integer)
  RETURNS TABLE (media_id uuid, site_id uuid, object_key text, upload_id text)
  LANGUAGE sql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT mi.id, mi.site_id, mi.object_key, mi.multipart_upload_id
  FROM enterprise.media_items mi
  WHERE mi.status = 'pending_upload' AND mi.multipart_upload_id IS NOT NULL
    AND mi.upload_expires_at < LEAST(p_expired_before, now())
  ORDER BY mi.upload_expires_at
  LIMIT LEAST(GREATEST(p_limit, 0), 1000)
$$;
COMMENT ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer) IS 'Sweep of abandoned uploads: pending multipart items whose intent expired before p_expired_before (never later than now), oldest first, at most p_limit (1000). Runs as enterprise_media_ingest.';

CREATE FUNCTION enterprise_api.record_upload_abandoned(p_media_id uuid, p_reason text)
  RETURNS boolean
  LANGUAGE sql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  WITH changed AS (
    UPDATE enterprise.media_items mi
    SET status = 'abandoned', rejection_reason = p_reason, updated_at = now()
    WHERE mi.id = p_media_id AND mi.status = 'pending_upload' AND mi.multipart_upload_id IS NOT NULL
      AND mi.upload_expires_at < now()
    RETURNING mi.id
  )
  SELECT EXISTS (SELECT 1 FROM changed)
$$;
COMMENT ON FUNCTION enterprise_api.record_upload_abandoned(uuid, text) IS 'Sweep of abandoned uploads: marks one pending multipart item whose intent expired abandoned, with a reason; false when it is no longer such an item. Runs as enterprise_media_ingest.';

REVOKE EXECUTE ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer),
  enterprise_api.record_upload_abandoned(uuid, text) FROM PUBLIC;
GRANT CREATE ON SCHEMA enterprise_api TO enterprise_media_ingest;
ALTER FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer) OWNER TO enterprise_media_ingest;
ALTER FUNCTION enterprise_api.record_upload_abandoned(uuid, text) OWNER TO enterprise_media_ingest;
REVOKE CREATE ON SCHEMA enterprise_api FROM enterprise_media_ingest;
GRANT EXECUTE ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer),
  enterprise_api.record_upload_abandoned(uuid, text) TO enterprise_api_role;
`;

const DOWN_SQL = `
DROP FUNCTION enterprise_api.record_upload_abandoned(uuid, text);
DROP FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer);
DROP POLICY ingest_abandons_expired_multipart ON enterprise.media_items;
REVOKE SELECT (multipart_upload_id, upload_expires_at) ON enterprise.media_items FROM enterprise_media_ingest;
DROP POLICY api_abandons_multipart_media ON enterprise.media_items;
REVOKE UPDATE (status, rejection_reason, updated_at) ON enterprise.media_items FROM enterprise_api_role;
-- The previous states cannot say abandoned; such an item (which always has a reason) reads as rejected.
UPDATE enterprise.media_items SET status = 'rejected' WHERE status = 'abandoned';
ALTER TABLE enterprise.media_items DROP CONSTRAINT media_items_status_check;
ALTER TABLE enterprise.media_items ADD CONSTRAINT media_items_status_check
  CHECK (status IN ('pending_upload', 'available', 'rejected'));
ALTER TABLE enterprise.media_items DROP CONSTRAINT media_items_abandoned_reason,
  DROP CONSTRAINT media_items_multipart_plan,
  DROP COLUMN part_count, DROP COLUMN part_size_bytes, DROP COLUMN multipart_upload_id;
COMMENT ON COLUMN enterprise.media_items.status IS 'pending_upload until the store reports the object, then available or rejected.';
COMMENT ON COLUMN enterprise.media_items.rejection_reason IS 'Why the upload was rejected (size or type differ from the intent).';
`;

export const multipartUploadsMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
