// Who may touch an upload in parts, held by the database too (design §4.2, §4.4; issue 29's cold review,
// findings M1, M2 and L1). The service answers 404 to anyone but the intent's creator (0010), but the rules
// underneath still let any user of the site abandon someone else's upload, rewrite an upload id already set,
// and let a user's transaction call the sweep's functions, which see every company's rows. Each is closed here,
// so a flaw in the service cannot undo the rule:
// - api_abandons_multipart_media (0007) gives way to api_abandons_own_multipart_media: only the upload's creator
//   may abandon it (the service's own rule, markAbandoned).
// - An upload id, once set, never changes (a trigger: a policy sees either the old row or the new one, never
//   both): the store's upload a row names is the one its creator started.
// - The sweep's definer functions (expired_multipart_uploads and record_upload_abandoned of 0007,
//   unclaimed_multipart_uploads of 0009, abandon_unstarted_multipart_uploads of 0010) act only outside a
//   caller's transaction: with `request.jwt.claims` set (every portal request, through the workflow or
//   PostgREST) they return nothing and change nothing.
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

/** True outside a caller's transaction: no JWT claims set. */
const NO_CALLER = `COALESCE(pg_catalog.current_setting('request.jwt.claims', true), '') = ''`;

const UP_SQL = `
DROP POLICY api_abandons_multipart_media ON enterprise.media_items;
CREATE POLICY api_abandons_own_multipart_media ON enterprise.media_items FOR UPDATE TO enterprise_api_role
  USING (${TENANT_CHECK} AND ${OWN} AND status = 'pending_upload' AND multipart_upload_id IS NOT NULL)
  WITH CHECK (${TENANT_CHECK} AND ${OWN} AND status = 'abandoned' AND multipart_upload_id IS NOT NULL);

CREATE FUNCTION enterprise.keep_multipart_upload_id() RETURNS trigger
  LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF OLD.multipart_upload_id IS NOT NULL AND NEW.multipart_upload_id IS DISTINCT FROM OLD.multipart_upload_id THEN
    RAISE EXCEPTION 'an upload id, once set, does not change' USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER media_items_keep_multipart_upload_id BEFORE UPDATE OF multipart_upload_id ON enterprise.media_items
  FOR EACH ROW EXECUTE FUNCTION enterprise.keep_multipart_upload_id();
-- A trigger function runs whoever updates the row; nobody needs to call it (the anonymous role holds nothing).
REVOKE ALL ON FUNCTION enterprise.keep_multipart_upload_id() FROM PUBLIC;

CREATE OR REPLACE FUNCTION enterprise_api.expired_multipart_uploads(p_expired_before timestamptz, p_limit integer)
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

CREATE OR REPLACE FUNCTION enterprise_api.record_upload_abandoned(p_media_id uuid, p_reason text)
  RETURNS boolean
  LANGUAGE sql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  WITH changed AS (
    UPDATE enterprise.media_items mi
    SET status = 'abandoned', rejection_reason = p_reason, updated_at = now()
    WHERE mi.id = p_media_id AND mi.status = 'pending_upload' AND mi.multipart_upload_id IS NOT NULL
      AND mi.upload_expires_at < now()
      AND ${NO_CALLER}
    RETURNING mi.id
  )
  SELECT EXISTS (SELECT 1 FROM changed)
$$;

CREATE OR REPLACE FUNCTION enterprise_api.unclaimed_multipart_uploads(p_object_keys text[], p_upload_ids text[])
  RETURNS TABLE (object_key text, upload_id text)
  LANGUAGE sql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT u.object_key, u.upload_id
  FROM unnest(p_object_keys, p_upload_ids) AS u(object_key, upload_id)
  WHERE u.object_key IS NOT NULL AND u.upload_id IS NOT NULL
    AND ${NO_CALLER}
    AND NOT EXISTS (
      SELECT 1 FROM enterprise.media_items mi
      WHERE mi.object_key = u.object_key AND mi.multipart_upload_id = u.upload_id
        AND mi.status = 'pending_upload')
  LIMIT 1000
$$;

CREATE OR REPLACE FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(p_created_before timestamptz, p_limit integer)
  RETURNS integer
  LANGUAGE sql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
  WITH stale AS (
    SELECT mi.id FROM enterprise.media_items mi
    WHERE mi.status = 'pending_upload' AND mi.multipart_upload_id IS NULL AND mi.part_count IS NOT NULL
      AND mi.created_at < LEAST(p_created_before, now())
      AND ${NO_CALLER}
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
`;

const DOWN_SQL = `
CREATE OR REPLACE FUNCTION enterprise_api.abandon_unstarted_multipart_uploads(p_created_before timestamptz, p_limit integer)
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

CREATE OR REPLACE FUNCTION enterprise_api.unclaimed_multipart_uploads(p_object_keys text[], p_upload_ids text[])
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

CREATE OR REPLACE FUNCTION enterprise_api.record_upload_abandoned(p_media_id uuid, p_reason text)
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

CREATE OR REPLACE FUNCTION enterprise_api.expired_multipart_uploads(p_expired_before timestamptz, p_limit integer)
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

DROP TRIGGER media_items_keep_multipart_upload_id ON enterprise.media_items;
DROP FUNCTION enterprise.keep_multipart_upload_id();
DROP POLICY api_abandons_own_multipart_media ON enterprise.media_items;
CREATE POLICY api_abandons_multipart_media ON enterprise.media_items FOR UPDATE TO enterprise_api_role
  USING (${TENANT_CHECK} AND status = 'pending_upload' AND multipart_upload_id IS NOT NULL)
  WITH CHECK (${TENANT_CHECK} AND status = 'abandoned' AND multipart_upload_id IS NOT NULL);
`;

export const multipartOwnershipMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
