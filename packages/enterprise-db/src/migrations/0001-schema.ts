// Private base tables of the enterprise side (schema `enterprise`). Every client-data table carries
// `site_id` and a denormalised `company_id` (the tenant), kept consistent with the site by a composite
// foreign key; indexes lead with `company_id` so a caller's queries touch only their tenant's index
// range (see the benchmark notes in README.md). Links between records must stay within one site:
// they are composite foreign keys on (id, site_id).
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';

export const schemaMigration: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    // The SQL sits inside up() so that its text is part of the migration's fingerprint (testkit
    // keys its template databases on the source of up()).
    await sql
      .raw(
        `
CREATE SCHEMA IF NOT EXISTS enterprise;
COMMENT ON SCHEMA enterprise IS 'Private base tables of the enterprise side; clients read them only through schema enterprise_api, under row-level security.';

CREATE TABLE enterprise.companies (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE enterprise.companies IS 'Client organisations (tenants) whose facilities are managed.';
COMMENT ON COLUMN enterprise.companies.id IS 'Company id.';
COMMENT ON COLUMN enterprise.companies.name IS 'Legal or trading name shown in the portal.';
COMMENT ON COLUMN enterprise.companies.created_at IS 'When the company was registered.';

CREATE TABLE enterprise.sites (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  company_id uuid NOT NULL REFERENCES enterprise.companies (id),
  name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  address_line text NOT NULL DEFAULT '',
  city text NOT NULL DEFAULT '',
  postal_code text NOT NULL DEFAULT '',
  country_code char(2) NOT NULL DEFAULT 'US' CHECK (country_code ~ '^[A-Z]{2}$'),
  timezone text NOT NULL DEFAULT 'UTC',
  gross_floor_area_m2 numeric(10, 1) CHECK (gross_floor_area_m2 > 0),
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (id, company_id)
);
CREATE INDEX sites_company_idx ON enterprise.sites (company_id, id);
COMMENT ON TABLE enterprise.sites IS 'Buildings or campuses of a company; the unit of access control.';
COMMENT ON COLUMN enterprise.sites.id IS 'Site id.';
COMMENT ON COLUMN enterprise.sites.company_id IS 'Owning company (tenant).';
COMMENT ON COLUMN enterprise.sites.name IS 'Site name, e.g. "Acme HQ".';
COMMENT ON COLUMN enterprise.sites.address_line IS 'Street address.';
COMMENT ON COLUMN enterprise.sites.city IS 'City.';
COMMENT ON COLUMN enterprise.sites.postal_code IS 'Postal code.';
COMMENT ON COLUMN enterprise.sites.country_code IS 'ISO 3166-1 alpha-2 country code.';
COMMENT ON COLUMN enterprise.sites.timezone IS 'IANA time zone of the site, for schedules and reports.';
COMMENT ON COLUMN enterprise.sites.gross_floor_area_m2 IS 'Gross floor area in square metres.';
COMMENT ON COLUMN enterprise.sites.created_at IS 'When the site was registered.';

CREATE TABLE enterprise.principals (
  sub text PRIMARY KEY CHECK (length(sub) BETWEEN 1 AND 255),
  company_id uuid NOT NULL REFERENCES enterprise.companies (id),
  all_sites boolean NOT NULL DEFAULT false,
  display_name text NOT NULL DEFAULT '',
  active boolean NOT NULL DEFAULT true,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (sub, company_id)
);
CREATE INDEX principals_company_idx ON enterprise.principals (company_id);
COMMENT ON TABLE enterprise.principals IS 'Access map, part 1: a portal user (identity provider subject) belongs to exactly one company and sees either all its sites or the sites listed in principal_sites.';
COMMENT ON COLUMN enterprise.principals.sub IS 'The JWT "sub" claim (Keycloak user id).';
COMMENT ON COLUMN enterprise.principals.company_id IS 'The one company this user may see data of.';
COMMENT ON COLUMN enterprise.principals.all_sites IS 'True: every site of the company, including sites added later. False: only the sites in principal_sites.';
COMMENT ON COLUMN enterprise.principals.display_name IS 'Name for audit views; never used for access decisions.';
COMMENT ON COLUMN enterprise.principals.active IS 'False revokes all access without deleting the mapping.';
COMMENT ON COLUMN enterprise.principals.created_at IS 'When the mapping was created.';

CREATE TABLE enterprise.principal_sites (
  sub text NOT NULL,
  company_id uuid NOT NULL,
  site_id uuid NOT NULL,
  granted_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (sub, site_id),
  FOREIGN KEY (sub, company_id) REFERENCES enterprise.principals (sub, company_id) ON DELETE CASCADE,
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id) ON DELETE CASCADE
);
CREATE INDEX principal_sites_site_idx ON enterprise.principal_sites (site_id);
COMMENT ON TABLE enterprise.principal_sites IS 'Access map, part 2: single sites granted to a principal; the composite keys keep every granted site inside the principal''s company.';
COMMENT ON COLUMN enterprise.principal_sites.sub IS 'The principal (JWT "sub").';
COMMENT ON COLUMN enterprise.principal_sites.company_id IS 'The principal''s company, repeated so the keys can enforce that the site belongs to it.';
COMMENT ON COLUMN enterprise.principal_sites.site_id IS 'A site the principal may see.';
COMMENT ON COLUMN enterprise.principal_sites.granted_at IS 'When the grant was made.';

CREATE TABLE enterprise.assets (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  category text NOT NULL CHECK (category IN ('hvac', 'electrical', 'plumbing', 'fire_safety', 'elevator', 'roofing', 'security', 'lighting', 'structural', 'other')),
  manufacturer text,
  model text,
  serial_number text,
  location text NOT NULL DEFAULT '',
  installed_on date,
  expected_life_years smallint CHECK (expected_life_years > 0),
  condition text NOT NULL DEFAULT 'good' CHECK (condition IN ('good', 'fair', 'poor', 'critical')),
  status text NOT NULL DEFAULT 'in_service' CHECK (status IN ('in_service', 'out_of_service', 'retired')),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id),
  UNIQUE (id, site_id)
);
CREATE INDEX assets_tenant_idx ON enterprise.assets (company_id, site_id, name);
COMMENT ON TABLE enterprise.assets IS 'Property equipment at a site (chillers, panels, lifts ...).';
COMMENT ON COLUMN enterprise.assets.id IS 'Asset id.';
COMMENT ON COLUMN enterprise.assets.site_id IS 'Site where the asset is installed.';
COMMENT ON COLUMN enterprise.assets.company_id IS 'Tenant; always the site''s company (set by trigger, enforced by foreign key).';
COMMENT ON COLUMN enterprise.assets.name IS 'Asset name or tag, e.g. "Rooftop unit RTU-3".';
COMMENT ON COLUMN enterprise.assets.category IS 'Trade category.';
COMMENT ON COLUMN enterprise.assets.manufacturer IS 'Manufacturer.';
COMMENT ON COLUMN enterprise.assets.model IS 'Manufacturer model.';
COMMENT ON COLUMN enterprise.assets.serial_number IS 'Serial number.';
COMMENT ON COLUMN enterprise.assets.location IS 'Where in the site, e.g. "Roof, north side".';
COMMENT ON COLUMN enterprise.assets.installed_on IS 'Installation date.';
COMMENT ON COLUMN enterprise.assets.expected_life_years IS 'Expected service life in years.';
COMMENT ON COLUMN enterprise.assets.condition IS 'Condition from the latest inspection.';
COMMENT ON COLUMN enterprise.assets.status IS 'Operational status.';
COMMENT ON COLUMN enterprise.assets.created_at IS 'When the record was created.';
COMMENT ON COLUMN enterprise.assets.updated_at IS 'When the record last changed.';

CREATE TABLE enterprise.maintenance_schedules (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  asset_id uuid,
  title text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
  description text NOT NULL DEFAULT '',
  frequency text NOT NULL CHECK (frequency IN ('weekly', 'monthly', 'quarterly', 'semiannual', 'annual')),
  next_due_on date NOT NULL,
  last_completed_on date,
  vendor text,
  active boolean NOT NULL DEFAULT true,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id),
  FOREIGN KEY (asset_id, site_id) REFERENCES enterprise.assets (id, site_id)
);
CREATE INDEX maintenance_schedules_tenant_idx ON enterprise.maintenance_schedules (company_id, next_due_on, site_id);
CREATE INDEX maintenance_schedules_asset_idx ON enterprise.maintenance_schedules (asset_id) WHERE asset_id IS NOT NULL;
COMMENT ON TABLE enterprise.maintenance_schedules IS 'Planned preventive maintenance at a site.';
COMMENT ON COLUMN enterprise.maintenance_schedules.id IS 'Schedule id.';
COMMENT ON COLUMN enterprise.maintenance_schedules.site_id IS 'Site.';
COMMENT ON COLUMN enterprise.maintenance_schedules.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.maintenance_schedules.asset_id IS 'Asset maintained, if the task concerns one (same site).';
COMMENT ON COLUMN enterprise.maintenance_schedules.title IS 'Task, e.g. "Replace AHU filters".';
COMMENT ON COLUMN enterprise.maintenance_schedules.description IS 'Scope of work.';
COMMENT ON COLUMN enterprise.maintenance_schedules.frequency IS 'Recurrence.';
COMMENT ON COLUMN enterprise.maintenance_schedules.next_due_on IS 'Next due date (site local date).';
COMMENT ON COLUMN enterprise.maintenance_schedules.last_completed_on IS 'Last completion date, if any.';
COMMENT ON COLUMN enterprise.maintenance_schedules.vendor IS 'Contractor performing the task.';
COMMENT ON COLUMN enterprise.maintenance_schedules.active IS 'False when the schedule is paused or retired.';
COMMENT ON COLUMN enterprise.maintenance_schedules.created_at IS 'When the record was created.';
COMMENT ON COLUMN enterprise.maintenance_schedules.updated_at IS 'When the record last changed.';

CREATE TABLE enterprise.walkthrough_logs (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  performed_at timestamptz NOT NULL,
  inspector_name text NOT NULL,
  kind text NOT NULL DEFAULT 'routine' CHECK (kind IN ('routine', 'annual', 'incident', 'handover')),
  condition_rating smallint CHECK (condition_rating BETWEEN 1 AND 5),
  summary text NOT NULL DEFAULT '',
  report text NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id),
  UNIQUE (id, site_id)
);
CREATE INDEX walkthrough_logs_tenant_idx ON enterprise.walkthrough_logs (company_id, performed_at DESC, site_id);
COMMENT ON TABLE enterprise.walkthrough_logs IS 'Site inspections (walkthroughs): the report and its summary.';
COMMENT ON COLUMN enterprise.walkthrough_logs.id IS 'Walkthrough id.';
COMMENT ON COLUMN enterprise.walkthrough_logs.site_id IS 'Site inspected.';
COMMENT ON COLUMN enterprise.walkthrough_logs.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.walkthrough_logs.performed_at IS 'When the walkthrough took place.';
COMMENT ON COLUMN enterprise.walkthrough_logs.inspector_name IS 'Who inspected.';
COMMENT ON COLUMN enterprise.walkthrough_logs.kind IS 'Kind of inspection.';
COMMENT ON COLUMN enterprise.walkthrough_logs.condition_rating IS 'Overall condition, 1 (poor) to 5 (excellent).';
COMMENT ON COLUMN enterprise.walkthrough_logs.summary IS 'Short summary for lists.';
COMMENT ON COLUMN enterprise.walkthrough_logs.report IS 'Full inspection report (plain text / Markdown).';
COMMENT ON COLUMN enterprise.walkthrough_logs.created_at IS 'When the record was created.';

CREATE TABLE enterprise.work_items (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  asset_id uuid,
  walkthrough_id uuid,
  title text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
  description text NOT NULL DEFAULT '',
  category text NOT NULL DEFAULT 'other' CHECK (category IN ('hvac', 'electrical', 'plumbing', 'fire_safety', 'elevator', 'roofing', 'security', 'lighting', 'structural', 'other')),
  severity text NOT NULL CHECK (severity IN ('low', 'medium', 'high', 'critical')),
  state text NOT NULL DEFAULT 'proposed' CHECK (state IN ('proposed', 'accepted', 'deferred', 'declined')),
  estimate_amount numeric(12, 2) CHECK (estimate_amount >= 0),
  estimate_currency char(3) NOT NULL DEFAULT 'USD' CHECK (estimate_currency ~ '^[A-Z]{3}$'),
  defer_until timestamptz,
  decided_at timestamptz,
  decided_by text,
  decision_note text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id),
  FOREIGN KEY (asset_id, site_id) REFERENCES enterprise.assets (id, site_id),
  FOREIGN KEY (walkthrough_id, site_id) REFERENCES enterprise.walkthrough_logs (id, site_id),
  UNIQUE (id, site_id),
  CHECK (state <> 'deferred' OR defer_until IS NOT NULL),
  CHECK (state = 'proposed' OR (decided_at IS NOT NULL AND decided_by IS NOT NULL))
);
-- The portal's list ("newest first") and count ("proposed") queries; see README.md, benchmark.
CREATE INDEX work_items_tenant_created_idx ON enterprise.work_items (company_id, created_at DESC, site_id);
CREATE INDEX work_items_tenant_state_idx ON enterprise.work_items (company_id, state, site_id);
CREATE INDEX work_items_asset_idx ON enterprise.work_items (asset_id) WHERE asset_id IS NOT NULL;
CREATE INDEX work_items_walkthrough_idx ON enterprise.work_items (walkthrough_id) WHERE walkthrough_id IS NOT NULL;
COMMENT ON TABLE enterprise.work_items IS 'Recommended repairs awaiting or carrying the client''s decision.';
COMMENT ON COLUMN enterprise.work_items.id IS 'Work item id.';
COMMENT ON COLUMN enterprise.work_items.site_id IS 'Site.';
COMMENT ON COLUMN enterprise.work_items.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.work_items.asset_id IS 'Asset concerned, if any (same site).';
COMMENT ON COLUMN enterprise.work_items.walkthrough_id IS 'Walkthrough that found the issue, if any (same site).';
COMMENT ON COLUMN enterprise.work_items.title IS 'Short description, e.g. "Replace corroded condensate pan".';
COMMENT ON COLUMN enterprise.work_items.description IS 'Findings and proposed remedy.';
COMMENT ON COLUMN enterprise.work_items.category IS 'Trade category.';
COMMENT ON COLUMN enterprise.work_items.severity IS 'Risk if not done.';
COMMENT ON COLUMN enterprise.work_items.state IS 'proposed -> accepted | deferred | declined; deferred may be decided again; accepted and declined are final.';
COMMENT ON COLUMN enterprise.work_items.estimate_amount IS 'Estimated cost in estimate_currency (major units, e.g. dollars).';
COMMENT ON COLUMN enterprise.work_items.estimate_currency IS 'ISO 4217 currency of the estimate.';
COMMENT ON COLUMN enterprise.work_items.defer_until IS 'For deferred items: when to bring the item back.';
COMMENT ON COLUMN enterprise.work_items.decided_at IS 'When the latest decision was made.';
COMMENT ON COLUMN enterprise.work_items.decided_by IS 'JWT "sub" of the user who made the latest decision.';
COMMENT ON COLUMN enterprise.work_items.decision_note IS 'Note given with the latest decision.';
COMMENT ON COLUMN enterprise.work_items.created_at IS 'When the item was proposed.';
COMMENT ON COLUMN enterprise.work_items.updated_at IS 'When the item last changed.';

CREATE TABLE enterprise.work_item_decisions (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  work_item_id uuid NOT NULL,
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  decision text NOT NULL CHECK (decision IN ('accept', 'defer', 'decline')),
  previous_state text NOT NULL CHECK (previous_state IN ('proposed', 'accepted', 'deferred', 'declined')),
  new_state text NOT NULL CHECK (new_state IN ('proposed', 'accepted', 'deferred', 'declined')),
  note text,
  defer_until timestamptz,
  decided_by text NOT NULL,
  decided_at timestamptz NOT NULL DEFAULT now(),
  request_id text NOT NULL CHECK (length(request_id) BETWEEN 1 AND 200),
  FOREIGN KEY (work_item_id, site_id) REFERENCES enterprise.work_items (id, site_id),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id)
);
CREATE INDEX work_item_decisions_item_idx ON enterprise.work_item_decisions (work_item_id, decided_at);
CREATE INDEX work_item_decisions_tenant_idx ON enterprise.work_item_decisions (company_id, site_id);
COMMENT ON TABLE enterprise.work_item_decisions IS 'Append-only audit of every decision, written in the same transaction as the state change.';
COMMENT ON COLUMN enterprise.work_item_decisions.id IS 'Audit row id (increasing).';
COMMENT ON COLUMN enterprise.work_item_decisions.work_item_id IS 'Work item decided.';
COMMENT ON COLUMN enterprise.work_item_decisions.site_id IS 'Site of the work item.';
COMMENT ON COLUMN enterprise.work_item_decisions.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.work_item_decisions.decision IS 'Decision requested: accept, defer or decline.';
COMMENT ON COLUMN enterprise.work_item_decisions.previous_state IS 'State before the decision.';
COMMENT ON COLUMN enterprise.work_item_decisions.new_state IS 'State after the decision.';
COMMENT ON COLUMN enterprise.work_item_decisions.note IS 'Note given by the decider.';
COMMENT ON COLUMN enterprise.work_item_decisions.defer_until IS 'For defer: until when.';
COMMENT ON COLUMN enterprise.work_item_decisions.decided_by IS 'JWT "sub" of the decider.';
COMMENT ON COLUMN enterprise.work_item_decisions.decided_at IS 'When the decision was recorded.';
COMMENT ON COLUMN enterprise.work_item_decisions.request_id IS 'X-Request-Id of the HTTP request that made it.';

CREATE TABLE enterprise.decision_idempotency_keys (
  caller_sub text NOT NULL,
  idempotency_key text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
  work_item_id uuid NOT NULL,
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  request_fingerprint text NOT NULL,
  response_status smallint NOT NULL CHECK (response_status BETWEEN 100 AND 599),
  response_body jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (caller_sub, idempotency_key),
  FOREIGN KEY (work_item_id, site_id) REFERENCES enterprise.work_items (id, site_id),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id)
);
CREATE INDEX decision_idempotency_keys_created_idx ON enterprise.decision_idempotency_keys (created_at);
CREATE INDEX decision_idempotency_keys_item_idx ON enterprise.decision_idempotency_keys (work_item_id);
COMMENT ON TABLE enterprise.decision_idempotency_keys IS 'Idempotency-Key replay store for decisions: a retried request with the same key from the same caller gets the stored response.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.caller_sub IS 'JWT "sub" of the caller; keys are scoped per caller.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.idempotency_key IS 'Value of the Idempotency-Key header.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.work_item_id IS 'Work item the request targeted.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.site_id IS 'Site of the work item.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.request_fingerprint IS 'Hash of method, path and body; the same key with another request is a conflict.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.response_status IS 'HTTP status of the stored response.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.response_body IS 'JSON body of the stored response.';
COMMENT ON COLUMN enterprise.decision_idempotency_keys.created_at IS 'When the key was first used; entries older than the replay window may be deleted.';

CREATE TABLE enterprise.service_records (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  asset_id uuid,
  work_item_id uuid,
  schedule_id uuid REFERENCES enterprise.maintenance_schedules (id),
  performed_on date NOT NULL,
  vendor text NOT NULL,
  technician text,
  summary text NOT NULL,
  labor_hours numeric(6, 2) CHECK (labor_hours >= 0),
  cost_amount numeric(12, 2) CHECK (cost_amount >= 0),
  cost_currency char(3) NOT NULL DEFAULT 'USD' CHECK (cost_currency ~ '^[A-Z]{3}$'),
  created_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id),
  FOREIGN KEY (asset_id, site_id) REFERENCES enterprise.assets (id, site_id),
  FOREIGN KEY (work_item_id, site_id) REFERENCES enterprise.work_items (id, site_id)
);
CREATE INDEX service_records_tenant_idx ON enterprise.service_records (company_id, performed_on DESC, site_id);
CREATE INDEX service_records_asset_idx ON enterprise.service_records (asset_id) WHERE asset_id IS NOT NULL;
CREATE INDEX service_records_work_item_idx ON enterprise.service_records (work_item_id) WHERE work_item_id IS NOT NULL;
CREATE INDEX service_records_schedule_idx ON enterprise.service_records (schedule_id) WHERE schedule_id IS NOT NULL;
COMMENT ON TABLE enterprise.service_records IS 'Completed service: what was done, by whom, at what cost.';
COMMENT ON COLUMN enterprise.service_records.id IS 'Service record id.';
COMMENT ON COLUMN enterprise.service_records.site_id IS 'Site.';
COMMENT ON COLUMN enterprise.service_records.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.service_records.asset_id IS 'Asset serviced, if any (same site).';
COMMENT ON COLUMN enterprise.service_records.work_item_id IS 'Work item this service carried out, if any (same site).';
COMMENT ON COLUMN enterprise.service_records.schedule_id IS 'Maintenance schedule this visit fulfilled, if any.';
COMMENT ON COLUMN enterprise.service_records.performed_on IS 'Date of the service (site local date).';
COMMENT ON COLUMN enterprise.service_records.vendor IS 'Contractor.';
COMMENT ON COLUMN enterprise.service_records.technician IS 'Technician name.';
COMMENT ON COLUMN enterprise.service_records.summary IS 'What was done.';
COMMENT ON COLUMN enterprise.service_records.labor_hours IS 'Labour in hours.';
COMMENT ON COLUMN enterprise.service_records.cost_amount IS 'Invoiced cost in cost_currency (major units).';
COMMENT ON COLUMN enterprise.service_records.cost_currency IS 'ISO 4217 currency of the cost.';
COMMENT ON COLUMN enterprise.service_records.created_at IS 'When the record was created.';

CREATE TABLE enterprise.media_items (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  object_key text NOT NULL UNIQUE CHECK (length(object_key) BETWEEN 1 AND 1024),
  status text NOT NULL DEFAULT 'pending_upload' CHECK (status IN ('pending_upload', 'available', 'rejected')),
  filename text NOT NULL CHECK (length(filename) BETWEEN 1 AND 255),
  declared_content_type text NOT NULL,
  declared_size_bytes bigint NOT NULL CHECK (declared_size_bytes > 0),
  declared_checksum_sha256 text,
  actual_content_type text,
  actual_size_bytes bigint CHECK (actual_size_bytes >= 0),
  etag text,
  rejection_reason text,
  walkthrough_id uuid,
  work_item_id uuid,
  asset_id uuid,
  uploaded_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  upload_expires_at timestamptz,
  uploaded_at timestamptz,
  updated_at timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id),
  FOREIGN KEY (walkthrough_id, site_id) REFERENCES enterprise.walkthrough_logs (id, site_id),
  FOREIGN KEY (work_item_id, site_id) REFERENCES enterprise.work_items (id, site_id),
  FOREIGN KEY (asset_id, site_id) REFERENCES enterprise.assets (id, site_id),
  CHECK (status <> 'available' OR (actual_size_bytes IS NOT NULL AND uploaded_at IS NOT NULL)),
  CHECK (status <> 'rejected' OR rejection_reason IS NOT NULL)
);
CREATE INDEX media_items_tenant_idx ON enterprise.media_items (company_id, created_at DESC, site_id);
CREATE INDEX media_items_walkthrough_idx ON enterprise.media_items (walkthrough_id) WHERE walkthrough_id IS NOT NULL;
CREATE INDEX media_items_work_item_idx ON enterprise.media_items (work_item_id) WHERE work_item_id IS NOT NULL;
CREATE INDEX media_items_asset_idx ON enterprise.media_items (asset_id) WHERE asset_id IS NOT NULL;
COMMENT ON TABLE enterprise.media_items IS 'Photos and videos uploaded from site visits, stored in object storage.';
COMMENT ON COLUMN enterprise.media_items.id IS 'Media id.';
COMMENT ON COLUMN enterprise.media_items.site_id IS 'Site.';
COMMENT ON COLUMN enterprise.media_items.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.media_items.object_key IS 'Object storage key, generated by the server (never from the filename); never exposed to the portal.';
COMMENT ON COLUMN enterprise.media_items.status IS 'pending_upload until the store reports the object, then available or rejected.';
COMMENT ON COLUMN enterprise.media_items.filename IS 'Client file name, for display and Content-Disposition only.';
COMMENT ON COLUMN enterprise.media_items.declared_content_type IS 'Content type declared in the upload intent (and bound into the signed URL).';
COMMENT ON COLUMN enterprise.media_items.declared_size_bytes IS 'Size in bytes declared in the upload intent.';
COMMENT ON COLUMN enterprise.media_items.declared_checksum_sha256 IS 'Base64 SHA-256 declared in the upload intent, if any.';
COMMENT ON COLUMN enterprise.media_items.actual_content_type IS 'Content type the store reported.';
COMMENT ON COLUMN enterprise.media_items.actual_size_bytes IS 'Size in bytes the store reported.';
COMMENT ON COLUMN enterprise.media_items.etag IS 'ETag the store reported (without quotes).';
COMMENT ON COLUMN enterprise.media_items.rejection_reason IS 'Why the upload was rejected (size or type differ from the intent).';
COMMENT ON COLUMN enterprise.media_items.walkthrough_id IS 'Linked walkthrough, if any (same site).';
COMMENT ON COLUMN enterprise.media_items.work_item_id IS 'Linked work item, if any (same site).';
COMMENT ON COLUMN enterprise.media_items.asset_id IS 'Linked asset, if any (same site).';
COMMENT ON COLUMN enterprise.media_items.uploaded_by IS 'JWT "sub" of the user who created the upload intent.';
COMMENT ON COLUMN enterprise.media_items.created_at IS 'When the upload intent was created.';
COMMENT ON COLUMN enterprise.media_items.upload_expires_at IS 'When the signed upload URL expires.';
COMMENT ON COLUMN enterprise.media_items.uploaded_at IS 'When the store reported the object.';
COMMENT ON COLUMN enterprise.media_items.updated_at IS 'When the record last changed.';

CREATE TABLE enterprise.postgrest_settings (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  jwt_issuer text NOT NULL,
  jwt_client_id text NOT NULL,
  jwks jsonb NOT NULL CHECK (jsonb_typeof(jwks -> 'keys') = 'array'),
  updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE enterprise.postgrest_settings IS 'PostgREST authentication settings (one row): the expected issuer and client, and the identity provider''s JWKS served to PostgREST by postgrest.pre_config(). Empty means every token is refused.';
COMMENT ON COLUMN enterprise.postgrest_settings.singleton IS 'Always true; keeps the table to one row.';
COMMENT ON COLUMN enterprise.postgrest_settings.jwt_issuer IS 'Expected "iss", e.g. https://keycloak.example/realms/platform.';
COMMENT ON COLUMN enterprise.postgrest_settings.jwt_client_id IS 'Expected "azp" (Keycloak client id), e.g. platform-enterprise-web.';
COMMENT ON COLUMN enterprise.postgrest_settings.jwks IS 'JSON Web Key Set of the issuer (public keys only).';
COMMENT ON COLUMN enterprise.postgrest_settings.updated_at IS 'When the row was last installed.';
`,
      )
      .execute(db);
  },
};
