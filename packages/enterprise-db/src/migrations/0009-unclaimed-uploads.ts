// The sweep of uploads in parts that no media item claims (design §4.4): an upload the store started for an
// intent that was never recorded (the service timed out waiting for CreateMultipartUpload's answer, the
// recording failed and its abort too, the process stopped in between) lives in the store until a lifecycle
// rule removes it (s3rver and some MinIO setups: never). The sweep lists the store's open uploads under the
// media prefix (ListMultipartUploads) and asks this function which of them no pending item names; it aborts
// those once they are older than its grace period.
//
// Like the sweep's two functions of 0007 it runs without a caller, so it is a SECURITY DEFINER function of
// `enterprise_media_ingest` (which may read media_items' keys, upload ids and states). It answers only whether
// each (key, upload id) pair it is given is claimed by a pending item: it returns nothing the sweep did not
// send, and at most 1000 pairs.
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const UP_SQL = `
CREATE FUNCTION enterprise_api.unclaimed_multipart_uploads(p_object_keys text[], p_upload_ids text[])
  RETURNS TABLE (object_key text, upload_id text)
  LANGUAGE sql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT u.object_key, u.upload_id
  FROM unnest(p_object_keys, p_upload_ids) AS u(object_key, upload_id)
  WHERE u.object_key IS NOT NULL AND u.upload_id IS NOT NULL
    AND NOT EXISTS (
      SELECT 1 FROM enterprise.media_items mi
      WHERE mi.object_key = u.object_key AND mi.multipart_upload_id = u.upload_id
        AND mi.status = 'pending_upload')
  LIMIT 1000
$$;
COMMENT ON FUNCTION enterprise_api.unclaimed_multipart_uploads(text[], text[]) IS 'Sweep of uploads no item claims: of the given (object key, upload id) pairs (the store''s open uploads), those no pending media item names, at most 1000. Runs as enterprise_media_ingest.';

REVOKE EXECUTE ON FUNCTION enterprise_api.unclaimed_multipart_uploads(text[], text[]) FROM PUBLIC;
GRANT CREATE ON SCHEMA enterprise_api TO enterprise_media_ingest;
ALTER FUNCTION enterprise_api.unclaimed_multipart_uploads(text[], text[]) OWNER TO enterprise_media_ingest;
REVOKE CREATE ON SCHEMA enterprise_api FROM enterprise_media_ingest;
GRANT EXECUTE ON FUNCTION enterprise_api.unclaimed_multipart_uploads(text[], text[]) TO enterprise_api_role;
`;

const DOWN_SQL = `
DROP FUNCTION enterprise_api.unclaimed_multipart_uploads(text[], text[]);
`;

export const unclaimedUploadsMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
