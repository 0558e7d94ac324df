// The sweep of uploads in parts makes progress, and open uploads are counted cheaply (design §4.4; issue 39 §4,
// the workflow's probe). Before this, expired_multipart_uploads (0007, 0011) answered the oldest 100 expired
// pending items, and an upload the store had assembled in time but whose event never arrived stayed pending and
// first in that list for ever: 100 of them and nothing else was ever abandoned. Now:
// - expired_multipart_uploads pages (keyset on upload_expires_at, id), so one run reaches every expired item
//   whatever stays pending ahead of it; the index it walks is (upload_expires_at, id);
// - `assembled_seen_at` records when the sweep first found the store had assembled an expired upload whose event
//   had not been handled (note_upload_assembled): the event gets the grace period from then to arrive, after
//   which the sweep accepts the object itself through the webhook's path (record_object_created, 0002);
// - two partial indexes count a user's and a site's open uploads in parts, which an intent is capped by.
// The definer functions keep 0011's rule: with a caller's claims set they return nothing and change nothing.
//
// Frozen SQL: this file is the whole migration. It imports nothing from other migrations and is never edited
// once released; a change is a new migration.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

/** True outside a caller's transaction: no JWT claims set. */
const NO_CALLER = `COALESCE(pg_catalog.current_setting('request.jwt.claims', true), '') = ''`;

const UP_SQL = `
ALTER TABLE enterprise.media_items ADD COLUMN assembled_seen_at timestamptz;
COMMENT ON COLUMN enterprise.media_items.assembled_seen_at IS 'When the sweep first found the store had assembled this expired upload in parts while its object event was still unhandled; the sweep accepts the object itself once the grace period has passed since.';

DROP INDEX enterprise.media_items_pending_multipart_idx;
CREATE INDEX media_items_pending_multipart_idx ON enterprise.media_items (upload_expires_at, id)
  WHERE status = 'pending_upload' AND multipart_upload_id IS NOT NULL;
CREATE INDEX media_items_open_multipart_uploader_idx ON enterprise.media_items (uploaded_by)
  WHERE status = 'pending_upload' AND part_count IS NOT NULL;
CREATE INDEX media_items_open_multipart_site_idx ON enterprise.media_items (site_id)
  WHERE status = 'pending_upload' AND part_count IS NOT NULL;

GRANT SELECT (assembled_seen_at), UPDATE (assembled_seen_at) ON enterprise.media_items TO enterprise_media_ingest;
CREATE POLICY ingest_notes_assembled_multipart ON enterprise.media_items FOR UPDATE TO enterprise_media_ingest
  USING (status = 'pending_upload' AND multipart_upload_id IS NOT NULL AND upload_expires_at < now())
  WITH CHECK (status = 'pending_upload' AND multipart_upload_id IS NOT NULL AND upload_expires_at < now());

DROP FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer);
CREATE FUNCTION enterprise_api.expired_multipart_uploads(p_expired_before timestamptz,
    p_after_expires_at timestamptz, p_after_id uuid, p_limit integer)
  RETURNS TABLE (media_id uuid, site_id uuid, object_key text, upload_id text, upload_expires_at text,
    assembled_seen_at timestamptz)
  LANGUAGE sql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT mi.id, mi.site_id, mi.object_key, mi.multipart_upload_id, mi.upload_expires_at::text, mi.assembled_seen_at
  FROM enterprise.media_items mi
  WHERE mi.status = 'pending_upload' AND mi.multipart_upload_id IS NOT NULL
    AND mi.upload_expires_at < LEAST(p_expired_before, now())
    AND (p_after_expires_at IS NULL OR (mi.upload_expires_at, mi.id) > (p_after_expires_at, p_after_id))
    AND ${NO_CALLER}
  ORDER BY mi.upload_expires_at, mi.id
  LIMIT LEAST(GREATEST(p_limit, 0), 1000)
$$;
COMMENT ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, timestamptz, uuid, integer) IS 'Sweep of abandoned uploads: a page of the pending multipart items whose intent expired before p_expired_before (never later than now), after (p_after_expires_at, p_after_id) when given (the last row of the previous page, its upload_expires_at as this answers it, text at full precision), oldest first, at most p_limit (1000). Nothing with a caller''s claims set. Runs as enterprise_media_ingest.';

CREATE FUNCTION enterprise_api.note_upload_assembled(p_media_id uuid)
  RETURNS timestamptz
  LANGUAGE sql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  UPDATE enterprise.media_items mi
  SET assembled_seen_at = COALESCE(mi.assembled_seen_at, now())
  WHERE mi.id = p_media_id AND mi.status = 'pending_upload' AND mi.multipart_upload_id IS NOT NULL
    AND mi.upload_expires_at < now()
    AND ${NO_CALLER}
  RETURNING mi.assembled_seen_at
$$;
COMMENT ON FUNCTION enterprise_api.note_upload_assembled(uuid) IS 'Sweep of abandoned uploads: records, once, when the store was first found to have assembled this expired pending upload in parts; answers that instant, or NULL when it is no longer such an item. Nothing with a caller''s claims set. Runs as enterprise_media_ingest.';

REVOKE EXECUTE ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, timestamptz, uuid, integer),
  enterprise_api.note_upload_assembled(uuid) FROM PUBLIC;
GRANT CREATE ON SCHEMA enterprise_api TO enterprise_media_ingest;
ALTER FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, timestamptz, uuid, integer)
  OWNER TO enterprise_media_ingest;
ALTER FUNCTION enterprise_api.note_upload_assembled(uuid) OWNER TO enterprise_media_ingest;
REVOKE CREATE ON SCHEMA enterprise_api FROM enterprise_media_ingest;
GRANT EXECUTE ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, timestamptz, uuid, integer),
  enterprise_api.note_upload_assembled(uuid) TO enterprise_api_role;
`;

const DOWN_SQL = `
DROP FUNCTION enterprise_api.note_upload_assembled(uuid);
DROP FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, timestamptz, uuid, integer);
CREATE FUNCTION enterprise_api.expired_multipart_uploads(p_expired_before timestamptz, p_limit integer)
  RETURNS TABLE (media_id uuid, site_id uuid, object_key text, upload_id text)
  LANGUAGE sql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT mi.id, mi.site_id, mi.object_key, mi.multipart_upload_id
  FROM enterprise.media_items mi
  WHERE mi.status = 'pending_upload' AND mi.multipart_upload_id IS NOT NULL
    AND mi.upload_expires_at < LEAST(p_expired_before, now())
    AND ${NO_CALLER}
  ORDER BY mi.upload_expires_at
  LIMIT LEAST(GREATEST(p_limit, 0), 1000)
$$;
COMMENT ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer) IS 'Sweep of abandoned uploads: pending multipart items whose intent expired before p_expired_before (never later than now), oldest first, at most p_limit (1000). Runs as enterprise_media_ingest.';
REVOKE EXECUTE ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer) FROM PUBLIC;
GRANT CREATE ON SCHEMA enterprise_api TO enterprise_media_ingest;
ALTER FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer) OWNER TO enterprise_media_ingest;
REVOKE CREATE ON SCHEMA enterprise_api FROM enterprise_media_ingest;
GRANT EXECUTE ON FUNCTION enterprise_api.expired_multipart_uploads(timestamptz, integer) TO enterprise_api_role;

DROP POLICY ingest_notes_assembled_multipart ON enterprise.media_items;
REVOKE SELECT (assembled_seen_at), UPDATE (assembled_seen_at) ON enterprise.media_items FROM enterprise_media_ingest;

DROP INDEX enterprise.media_items_open_multipart_site_idx;
DROP INDEX enterprise.media_items_open_multipart_uploader_idx;
DROP INDEX enterprise.media_items_pending_multipart_idx;
CREATE INDEX media_items_pending_multipart_idx ON enterprise.media_items (upload_expires_at)
  WHERE status = 'pending_upload' AND multipart_upload_id IS NOT NULL;

ALTER TABLE enterprise.media_items DROP COLUMN assembled_seen_at;
`;

export const sweepProgressMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
