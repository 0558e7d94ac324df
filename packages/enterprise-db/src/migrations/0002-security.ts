// Roles, the access functions, row-level security, grants and the read surface (design §4.2).
//
// Who owns what:
// - tables, views: the migration user (never a runtime login);
// - enterprise_api.authorized_*() and postgrest.*: `enterprise_authz`, a NOLOGIN role that may read
//   only the access map, the sites and the PostgREST settings (its own policies);
// - enterprise_api.record_object_created(): `enterprise_media_ingest`, a NOLOGIN role that may only
//   move media items out of `pending_upload` (its own policies).
// So no SECURITY DEFINER function runs with the table owner's rights, and FORCE ROW LEVEL SECURITY
// holds even for a non-superuser owner.
import { sql } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';
import type { Kysely, Migration } from 'kysely';
import {
  API_LOGIN,
  API_ROLE,
  AUTHENTICATOR,
  AUTHZ_OWNER,
  MEDIA_INGEST_OWNER,
  PORTAL_ANON,
  PORTAL_ROLE,
} from '../roles.js';
import type { RolePasswords } from '../roles.js';

/**
 * The access functions as this migration creates them (migration 0003 replaces their bodies; its `down`
 * restores these).
 */
export const ACCESS_FUNCTIONS_0002 = `CREATE FUNCTION enterprise_api.authorized_company_id() RETURNS uuid
  LANGUAGE sql STABLE SECURITY DEFINER PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT p.company_id
  FROM enterprise.principals p
  WHERE p.sub = enterprise_api.request_sub() AND p.active
$$;
COMMENT ON FUNCTION enterprise_api.authorized_company_id() IS 'The company of the current caller (NULL: none). Used by every policy; call it as (SELECT ...) so it runs once per statement.';

CREATE FUNCTION enterprise_api.authorized_site_ids() RETURNS uuid[]
  LANGUAGE sql STABLE SECURITY DEFINER PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}'::uuid[])
  FROM enterprise.principals p
  JOIN enterprise.sites s ON s.company_id = p.company_id
  WHERE p.sub = enterprise_api.request_sub()
    AND p.active
    AND (p.all_sites OR EXISTS (
      SELECT 1 FROM enterprise.principal_sites ps WHERE ps.sub = p.sub AND ps.site_id = s.id))
$$;
COMMENT ON FUNCTION enterprise_api.authorized_site_ids() IS 'Sorted ids of the sites the current caller may see and act on (empty: none). The one access decision for PostgREST reads and workflow writes; policies use it as site_id = ANY ((SELECT enterprise_api.authorized_site_ids())::uuid[]).';`;

/** PostgREST's db-pre-request function as this migration creates it (migration 0004 extends it). */
export const PRE_REQUEST_0002 = `CREATE FUNCTION postgrest.pre_request() RETURNS void
  LANGUAGE plpgsql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  claims jsonb := coalesce(nullif(current_setting('request.jwt.claims', true), '')::jsonb, '{}'::jsonb);
  expected enterprise.postgrest_settings%ROWTYPE;
  problem text;
BEGIN
  SELECT * INTO expected FROM enterprise.postgrest_settings LIMIT 1;
  IF NOT FOUND THEN
    problem := 'token issuer is not configured';
  ELSIF claims ->> 'iss' IS DISTINCT FROM expected.jwt_issuer THEN
    problem := 'token issuer is not accepted';
  ELSIF claims ->> 'azp' IS DISTINCT FROM expected.jwt_client_id THEN
    problem := 'token was not issued to this client';
  ELSIF coalesce(claims ->> 'sub', '') = '' THEN
    problem := 'token has no subject';
  END IF;
  IF problem IS NOT NULL THEN
    RAISE SQLSTATE 'PGRST' USING
      message = json_build_object('code', 'unauthorized', 'message', problem, 'details', NULL, 'hint', NULL)::text,
      detail = json_build_object(
        'status', 401,
        'headers', json_build_object('WWW-Authenticate', format('Bearer error="invalid_token", error_description="%s"', problem)))::text;
  END IF;
END
$$;
COMMENT ON FUNCTION postgrest.pre_request() IS 'PostgREST db-pre-request: refuses (401 via SQLSTATE PGRST) tokens whose iss or azp is not the configured realm and client, or that have no sub.';`;

/** A row's tenant check: its site and company columns against the caller's. */
export type TenantCheck = (siteColumn?: string, companyColumn?: string) => string;

/**
 * `company_id = <company> AND site_id = ANY(<sites>)`, each a scalar sub-select computed once per
 * statement. Migration 0002 uses the two access functions; 0004 the company stored per request.
 */
export const tenantCheckWith =
  (company: string, sites = '(SELECT enterprise_api.authorized_site_ids())'): TenantCheck =>
  (siteColumn = 'site_id', companyColumn = 'company_id') =>
    `${companyColumn} = ${company} AND ${siteColumn} = ANY (${sites}::uuid[])`;

const tenantCheck = tenantCheckWith('(SELECT enterprise_api.authorized_company_id())');

/**
 * Every policy that applies the tenant check (the portal's reads, the workflow's reads and writes),
 * built on `check`: migration 0004 drops and recreates exactly these.
 */
export const tenantPolicies = (check: TenantCheck): string => `
CREATE POLICY portal_reads_sites ON enterprise.sites FOR SELECT TO ${PORTAL_ROLE}
  USING (${check('id')});
${['assets', 'maintenance_schedules', 'walkthrough_logs', 'work_items', 'service_records', 'media_items']
  .map(
    (t) =>
      `CREATE POLICY portal_reads_${t} ON enterprise.${t} FOR SELECT TO ${PORTAL_ROLE} USING (${check()});`,
  )
  .join('\n')}
CREATE POLICY api_reads_sites ON enterprise.sites FOR SELECT TO ${API_ROLE} USING (${check('id')});
${['assets', 'walkthrough_logs', 'work_items', 'media_items', 'work_item_decisions']
  .map((t) => `CREATE POLICY api_reads_${t} ON enterprise.${t} FOR SELECT TO ${API_ROLE} USING (${check()});`)
  .join('\n')}
CREATE POLICY api_creates_media ON enterprise.media_items FOR INSERT TO ${API_ROLE}
  WITH CHECK (${check()} AND status = 'pending_upload' AND uploaded_by = (SELECT enterprise_api.request_sub()));
CREATE POLICY api_decides_work_items ON enterprise.work_items FOR UPDATE TO ${API_ROLE}
  USING (${check()})
  WITH CHECK (${check()} AND (state = 'proposed' OR decided_by = (SELECT enterprise_api.request_sub())));
CREATE POLICY api_audits_decisions ON enterprise.work_item_decisions FOR INSERT TO ${API_ROLE}
  WITH CHECK (${check()} AND decided_by = (SELECT enterprise_api.request_sub()));
CREATE POLICY api_own_idempotency_keys ON enterprise.decision_idempotency_keys FOR ALL TO ${API_ROLE}
  USING (caller_sub = (SELECT enterprise_api.request_sub()) AND ${check()})
  WITH CHECK (caller_sub = (SELECT enterprise_api.request_sub()) AND ${check()});
`;

const siteTables = [
  'assets',
  'maintenance_schedules',
  'walkthrough_logs',
  'work_items',
  'work_item_decisions',
  'decision_idempotency_keys',
  'service_records',
  'media_items',
] as const;

const allTables = [
  'companies',
  'sites',
  'principals',
  'principal_sites',
  'postgrest_settings',
  ...siteTables,
];

// The SQL sits inside up() so that its text is part of the migration's fingerprint (testkit keys
// its template databases on the source of up()).
export const securityMigration = (passwords: RolePasswords): Migration =>
  withGeneratedSql(tenantPolicies(tenantCheck) + PRE_REQUEST_0002, {
    async up(db: Kysely<unknown>): Promise<void> {
      // Roles are cluster-wide: another database's migration may create the same role at the same
      // moment (parallel test databases), so "already exists" in any form is success. Passwords travel
      // as transaction-local settings quoted by format(%L), never spliced into SQL text here.
      await sql`SELECT set_config('enterprise_db.authenticator_password', ${passwords.authenticator}, true),
                     set_config('enterprise_db.enterprise_api_password', ${passwords.enterpriseApi}, true),
                     set_config('enterprise_db.explicit_passwords', ${String(passwords.explicit)}, true)`.execute(
        db,
      );
      await sql
        .raw(
          `
DO $roles$
DECLARE
  r record;
BEGIN
  FOR r IN
    SELECT * FROM (VALUES
      ('${AUTHENTICATOR}', 'LOGIN NOINHERIT', 'enterprise_db.authenticator_password'),
      ('${PORTAL_ROLE}', 'NOLOGIN', NULL),
      ('${PORTAL_ANON}', 'NOLOGIN', NULL),
      ('${API_ROLE}', 'NOLOGIN', NULL),
      ('${API_LOGIN}', 'LOGIN INHERIT', 'enterprise_db.enterprise_api_password'),
      ('${AUTHZ_OWNER}', 'NOLOGIN', NULL),
      ('${MEDIA_INGEST_OWNER}', 'NOLOGIN', NULL)
    ) AS v(name, attributes, password_setting)
  LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r.name) THEN
      BEGIN
        IF r.password_setting IS NULL THEN
          EXECUTE format('CREATE ROLE %I %s', r.name, r.attributes);
        ELSE
          EXECUTE format('CREATE ROLE %I %s PASSWORD %L', r.name, r.attributes,
                         current_setting(r.password_setting));
        END IF;
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;
      END;
    ELSIF r.password_setting IS NOT NULL
          AND current_setting('enterprise_db.explicit_passwords') = 'true' THEN
      EXECUTE format('ALTER ROLE %I PASSWORD %L', r.name, current_setting(r.password_setting));
    END IF;
  END LOOP;
END
$roles$;

DO $members$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT * FROM (VALUES
      ('${PORTAL_ROLE}', '${AUTHENTICATOR}', 'INHERIT FALSE, SET TRUE'),
      ('${PORTAL_ANON}', '${AUTHENTICATOR}', 'INHERIT FALSE, SET TRUE'),
      ('${API_ROLE}', '${API_LOGIN}', 'INHERIT TRUE, SET TRUE')
    ) AS v(role_name, member, options)
  LOOP
    IF NOT pg_catalog.pg_has_role(g.member, g.role_name, 'MEMBER') THEN
      BEGIN
        EXECUTE format('GRANT %I TO %I WITH %s', g.role_name, g.member, g.options);
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;
      END;
    END IF;
  END LOOP;
  -- ALTER ... OWNER TO needs the migration user to be able to become the new owner.
  IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
    EXECUTE format('GRANT %I, %I TO %I', '${AUTHZ_OWNER}', '${MEDIA_INGEST_OWNER}', current_user);
  END IF;
END
$members$;
`,
        )
        .execute(db);
      await sql
        .raw(
          `
CREATE SCHEMA IF NOT EXISTS enterprise_api;
COMMENT ON SCHEMA enterprise_api IS 'Read surface served by PostgREST (views, security_invoker) and the access functions shared with the workflow service.';
CREATE SCHEMA IF NOT EXISTS postgrest;
COMMENT ON SCHEMA postgrest IS 'Functions PostgREST calls around requests (db-pre-request, db-pre-config); not exposed as an API schema.';

REVOKE ALL ON SCHEMA enterprise, enterprise_api, postgrest FROM PUBLIC;

-- The caller is whatever request.jwt.claims says: PostgREST sets it from the verified JWT, the
-- workflow service from its own verified JWT (withRequestClaims). Empty or absent -> nobody.
CREATE FUNCTION enterprise_api.request_sub() RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT nullif(nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub', '')
$$;
COMMENT ON FUNCTION enterprise_api.request_sub() IS 'The "sub" claim of the current request (request.jwt.claims), or NULL.';

${ACCESS_FUNCTIONS_0002}

-- company_id is derived, never trusted from the writer: the site decides it.
CREATE FUNCTION enterprise.set_company_from_site() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  NEW.company_id := (SELECT s.company_id FROM enterprise.sites s WHERE s.id = NEW.site_id);
  RETURN NEW;
END
$$;
COMMENT ON FUNCTION enterprise.set_company_from_site() IS 'BEFORE trigger: sets company_id from the row''s site (NULL for an unknown site, which then fails the policy or NOT NULL).';

${siteTables
  .map(
    (t) => `CREATE TRIGGER ${t}_company BEFORE INSERT OR UPDATE OF site_id, company_id ON enterprise.${t}
  FOR EACH ROW EXECUTE FUNCTION enterprise.set_company_from_site();`,
  )
  .join('\n')}

-- The webhook's whole write power: one pending media item, by object key, to available or rejected.
CREATE FUNCTION enterprise_api.record_object_created(
  p_object_key text,
  p_size_bytes bigint,
  p_etag text,
  p_content_type text
) RETURNS TABLE (media_id uuid, site_id uuid, status text, outcome text)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  m record;
  clean_etag text := nullif(btrim(coalesce(p_etag, ''), '"'), '');
  actual_type text := nullif(lower(btrim(split_part(coalesce(p_content_type, ''), ';', 1))), '');
  reason text;
BEGIN
  -- Only pending items can be locked (the UPDATE policy applies to FOR UPDATE); a concurrent
  -- delivery of the same key waits here and then finds the item no longer pending.
  SELECT mi.id, mi.site_id, mi.status, mi.declared_size_bytes, mi.declared_content_type INTO m
  FROM enterprise.media_items mi WHERE mi.object_key = p_object_key FOR UPDATE;
  IF NOT FOUND THEN
    SELECT mi.id, mi.site_id, mi.status INTO m FROM enterprise.media_items mi WHERE mi.object_key = p_object_key;
    IF NOT FOUND THEN
      RETURN QUERY SELECT NULL::uuid, NULL::uuid, NULL::text, 'unknown_key'::text;
    ELSE
      -- Redelivery (or a late duplicate): report the state already recorded, change nothing.
      RETURN QUERY SELECT m.id, m.site_id, m.status, 'already_recorded'::text;
    END IF;
    RETURN;
  END IF;
  IF p_size_bytes IS NULL OR p_size_bytes <> m.declared_size_bytes THEN
    reason := format('size %s bytes differs from the declared %s bytes', coalesce(p_size_bytes::text, 'unknown'), m.declared_size_bytes);
  ELSIF actual_type IS NOT NULL AND actual_type <> lower(m.declared_content_type) THEN
    reason := format('content type %s differs from the declared %s', actual_type, m.declared_content_type);
  END IF;
  UPDATE enterprise.media_items mi
  SET status = CASE WHEN reason IS NULL THEN 'available' ELSE 'rejected' END,
      actual_size_bytes = p_size_bytes,
      actual_content_type = coalesce(actual_type, m.declared_content_type),
      etag = clean_etag,
      rejection_reason = reason,
      uploaded_at = now(),
      updated_at = now()
  WHERE mi.id = m.id;
  RETURN QUERY SELECT m.id, m.site_id,
    CASE WHEN reason IS NULL THEN 'available' ELSE 'rejected' END, 'recorded'::text;
END
$$;
COMMENT ON FUNCTION enterprise_api.record_object_created(text, bigint, text, text) IS 'Object-created webhook: marks the pending media item with this object key available (size and type match the intent; a missing type counts as the declared one) or rejected. outcome: recorded | already_recorded | unknown_key. Idempotent. Runs as enterprise_media_ingest, which can do nothing else.';

-- PostgREST hardening (PostgREST checks neither iss nor azp): called before every request, in the
-- request's role, with request.jwt.claims set. Anonymous requests never get here with rights (the
-- anonymous role has no USAGE on this schema: 42501, which PostgREST answers with 401).
${PRE_REQUEST_0002}

-- PostgREST db-pre-config: serves the JWKS and audience from enterprise.postgrest_settings, so the
-- installer updates one row and sends NOTIFY pgrst, 'reload config'.
CREATE FUNCTION postgrest.pre_config() RETURNS void
  LANGUAGE plpgsql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  s enterprise.postgrest_settings%ROWTYPE;
BEGIN
  SELECT * INTO s FROM enterprise.postgrest_settings LIMIT 1;
  IF FOUND THEN
    PERFORM set_config('pgrst.jwt_secret', s.jwks::text, true);
    PERFORM set_config('pgrst.jwt_aud', s.jwt_client_id, true);
  END IF;
END
$$;
COMMENT ON FUNCTION postgrest.pre_config() IS 'PostgREST db-pre-config: sets jwt-secret (the JWKS) and jwt-aud from enterprise.postgrest_settings.';

-- Functions are executable by PUBLIC by default; here only by the roles granted below.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA enterprise, enterprise_api, postgrest FROM PUBLIC;

-- A non-superuser may hand a function to a role only if that role may create in its schema.
GRANT CREATE ON SCHEMA enterprise, enterprise_api, postgrest TO ${AUTHZ_OWNER}, ${MEDIA_INGEST_OWNER};
ALTER FUNCTION enterprise_api.request_sub() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION enterprise_api.authorized_company_id() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION enterprise_api.authorized_site_ids() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION enterprise.set_company_from_site() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION postgrest.pre_request() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION postgrest.pre_config() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION enterprise_api.record_object_created(text, bigint, text, text) OWNER TO ${MEDIA_INGEST_OWNER};
REVOKE CREATE ON SCHEMA enterprise, enterprise_api, postgrest FROM ${AUTHZ_OWNER}, ${MEDIA_INGEST_OWNER};

-- Row-level security on every table, forced, so no one but a superuser or BYPASSRLS role reads
-- around it; tables without a policy for a role are invisible to it.
${allTables.map((t) => `ALTER TABLE enterprise.${t} ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;`).join('\n')}

-- The definer roles: exactly what their functions read or change.
GRANT USAGE ON SCHEMA enterprise, enterprise_api TO ${AUTHZ_OWNER}, ${MEDIA_INGEST_OWNER};
GRANT SELECT ON enterprise.principals, enterprise.principal_sites, enterprise.sites, enterprise.postgrest_settings TO ${AUTHZ_OWNER};
CREATE POLICY authz_reads_principals ON enterprise.principals FOR SELECT TO ${AUTHZ_OWNER} USING (true);
CREATE POLICY authz_reads_principal_sites ON enterprise.principal_sites FOR SELECT TO ${AUTHZ_OWNER} USING (true);
CREATE POLICY authz_reads_sites ON enterprise.sites FOR SELECT TO ${AUTHZ_OWNER} USING (true);
CREATE POLICY authz_reads_postgrest_settings ON enterprise.postgrest_settings FOR SELECT TO ${AUTHZ_OWNER} USING (true);
GRANT EXECUTE ON FUNCTION enterprise_api.request_sub() TO ${MEDIA_INGEST_OWNER};
GRANT SELECT (id, site_id, object_key, status, declared_size_bytes, declared_content_type),
      UPDATE (status, actual_size_bytes, actual_content_type, etag, rejection_reason, uploaded_at, updated_at)
  ON enterprise.media_items TO ${MEDIA_INGEST_OWNER};
CREATE POLICY ingest_reads_media ON enterprise.media_items FOR SELECT TO ${MEDIA_INGEST_OWNER} USING (true);
CREATE POLICY ingest_completes_pending_media ON enterprise.media_items FOR UPDATE TO ${MEDIA_INGEST_OWNER}
  USING (status = 'pending_upload')
  WITH CHECK (status IN ('available', 'rejected'));

-- Portal users (through PostgREST): read-only, their company's sites only.
GRANT USAGE ON SCHEMA enterprise, enterprise_api, postgrest TO ${PORTAL_ROLE};
GRANT EXECUTE ON FUNCTION enterprise_api.request_sub(), enterprise_api.authorized_company_id(),
  enterprise_api.authorized_site_ids(), postgrest.pre_request() TO ${PORTAL_ROLE};
GRANT SELECT ON enterprise.companies, enterprise.sites, enterprise.assets, enterprise.maintenance_schedules,
  enterprise.walkthrough_logs, enterprise.work_items, enterprise.service_records TO ${PORTAL_ROLE};
-- Not object_key, checksum, etag or rejection details: downloads go through the workflow service.
GRANT SELECT (id, site_id, company_id, status, filename, declared_content_type, declared_size_bytes,
  actual_content_type, actual_size_bytes, walkthrough_id, work_item_id, asset_id, uploaded_by,
  created_at, uploaded_at) ON enterprise.media_items TO ${PORTAL_ROLE};
CREATE POLICY portal_reads_own_company ON enterprise.companies FOR SELECT TO ${PORTAL_ROLE}
  USING (id = (SELECT enterprise_api.authorized_company_id()));

-- PostgREST's login: it holds no privileges of its own besides reading its configuration.
GRANT USAGE ON SCHEMA postgrest TO ${AUTHENTICATOR};
GRANT EXECUTE ON FUNCTION postgrest.pre_config() TO ${AUTHENTICATOR};

-- The workflow service: exactly its use cases, inside the caller's sites.
GRANT USAGE ON SCHEMA enterprise, enterprise_api TO ${API_ROLE};
GRANT EXECUTE ON FUNCTION enterprise_api.request_sub(), enterprise_api.authorized_company_id(),
  enterprise_api.authorized_site_ids(),
  enterprise_api.record_object_created(text, bigint, text, text) TO ${API_ROLE};
GRANT SELECT ON enterprise.sites, enterprise.assets, enterprise.walkthrough_logs, enterprise.work_items,
  enterprise.media_items, enterprise.work_item_decisions, enterprise.decision_idempotency_keys TO ${API_ROLE};
GRANT INSERT (site_id, object_key, filename, declared_content_type, declared_size_bytes,
  declared_checksum_sha256, walkthrough_id, work_item_id, asset_id, uploaded_by, upload_expires_at)
  ON enterprise.media_items TO ${API_ROLE};
GRANT UPDATE (state, defer_until, decided_at, decided_by, decision_note, updated_at) ON enterprise.work_items TO ${API_ROLE};
GRANT INSERT (work_item_id, site_id, decision, previous_state, new_state, note, defer_until, decided_by,
  decided_at, request_id) ON enterprise.work_item_decisions TO ${API_ROLE};
GRANT INSERT (caller_sub, idempotency_key, work_item_id, site_id, request_fingerprint, response_status,
  response_body, created_at), DELETE ON enterprise.decision_idempotency_keys TO ${API_ROLE};
${tenantPolicies(tenantCheck)}
-- The read surface. security_invoker: the caller's own privileges and policies apply underneath.
CREATE VIEW enterprise_api.sites WITH (security_invoker = true) AS
  SELECT s.id, s.company_id, c.name AS company_name, s.name, s.address_line, s.city, s.postal_code,
         s.country_code, s.timezone, s.gross_floor_area_m2, s.created_at
  FROM enterprise.sites s
  JOIN enterprise.companies c ON c.id = s.company_id;
CREATE VIEW enterprise_api.assets WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, name, category, manufacturer, model, serial_number, location,
         installed_on, expected_life_years, condition, status, created_at, updated_at
  FROM enterprise.assets;
CREATE VIEW enterprise_api.maintenance_schedules WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, asset_id, title, description, frequency, next_due_on,
         last_completed_on, vendor, active, created_at, updated_at
  FROM enterprise.maintenance_schedules;
CREATE VIEW enterprise_api.walkthrough_logs WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, performed_at, inspector_name, kind, condition_rating, summary,
         report, created_at
  FROM enterprise.walkthrough_logs;
CREATE VIEW enterprise_api.work_items WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, asset_id, walkthrough_id, title, description, category, severity,
         state, estimate_amount, estimate_currency, defer_until, decided_at, decided_by,
         decision_note, created_at, updated_at
  FROM enterprise.work_items;
CREATE VIEW enterprise_api.service_records WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, asset_id, work_item_id, schedule_id, performed_on, vendor,
         technician, summary, labor_hours, cost_amount, cost_currency, created_at
  FROM enterprise.service_records;
CREATE VIEW enterprise_api.media_items WITH (security_invoker = true) AS
  SELECT id, site_id, company_id, status, filename,
         CASE WHEN status = 'available' THEN actual_content_type ELSE declared_content_type END AS content_type,
         CASE WHEN status = 'available' THEN actual_size_bytes ELSE declared_size_bytes END AS size_bytes,
         walkthrough_id, work_item_id, asset_id, uploaded_by, created_at, uploaded_at
  FROM enterprise.media_items;
COMMENT ON VIEW enterprise_api.sites IS 'Sites the caller may see, with their company''s name.';
COMMENT ON VIEW enterprise_api.assets IS 'Equipment at the caller''s sites.';
COMMENT ON VIEW enterprise_api.maintenance_schedules IS 'Planned maintenance at the caller''s sites.';
COMMENT ON VIEW enterprise_api.walkthrough_logs IS 'Inspection reports of the caller''s sites.';
COMMENT ON VIEW enterprise_api.work_items IS 'Recommended repairs at the caller''s sites; decide them through the workflow service.';
COMMENT ON VIEW enterprise_api.service_records IS 'Completed service at the caller''s sites.';
COMMENT ON VIEW enterprise_api.media_items IS 'Photos and videos of the caller''s sites (no storage keys; downloads through the workflow service).';
GRANT SELECT ON enterprise_api.sites, enterprise_api.assets, enterprise_api.maintenance_schedules,
  enterprise_api.walkthrough_logs, enterprise_api.work_items, enterprise_api.service_records,
  enterprise_api.media_items TO ${PORTAL_ROLE};
`,
        )
        .execute(db);
      // Passwords must not outlive the statement that needed them, even inside this transaction.
      await sql`SELECT set_config('enterprise_db.authenticator_password', '', true),
                     set_config('enterprise_db.enterprise_api_password', '', true)`.execute(db);
    },
  });
