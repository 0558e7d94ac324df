// Kysely types of the enterprise base tables the workflow service uses (schema-qualified names).
// Timestamps are read as Date (node-postgres parses timestamptz); numerics and bigints as strings
// (node-postgres keeps them exact), written as number | string.
// The decision and work-item vocabularies are the API's (contracts): the columns hold exactly those values.
import type { Decision, WorkItemStatus } from '@platform/contracts';
import type { ColumnType, Generated, Insertable, Selectable, Updateable } from 'kysely';

type Timestamp = ColumnType<Date, Date | string, Date | string>;
type GeneratedTimestamp = ColumnType<Date, Date | string | undefined, Date | string>;
type NumericColumn = ColumnType<string, number | string, number | string>;
/** Set by the BEFORE trigger from the row's site; never written by the service. */
type DerivedCompanyId = ColumnType<string, never, never>;
/** Fixed once the row exists. */
type Immutable<T> = ColumnType<T, T, never>;

export type MediaStatus = 'pending_upload' | 'available' | 'rejected' | 'abandoned';
export type Severity = 'low' | 'medium' | 'high' | 'critical';

export interface SitesTable {
  id: Generated<string>;
  company_id: string;
  name: string;
  address_line: Generated<string>;
  city: Generated<string>;
  postal_code: Generated<string>;
  country_code: Generated<string>;
  timezone: Generated<string>;
  gross_floor_area_m2: NumericColumn | null;
  created_at: GeneratedTimestamp;
}

export interface AssetsTable {
  id: Generated<string>;
  site_id: Immutable<string>;
  company_id: DerivedCompanyId;
  name: string;
  category: string;
  manufacturer: string | null;
  model: string | null;
  serial_number: string | null;
  location: Generated<string>;
  installed_on: ColumnType<Date, Date | string, Date | string> | null;
  expected_life_years: number | null;
  condition: Generated<'good' | 'fair' | 'poor' | 'critical'>;
  status: Generated<'in_service' | 'out_of_service' | 'retired'>;
  created_at: GeneratedTimestamp;
  updated_at: GeneratedTimestamp;
}

export interface WalkthroughLogsTable {
  id: Generated<string>;
  site_id: Immutable<string>;
  company_id: DerivedCompanyId;
  performed_at: Timestamp;
  inspector_name: string;
  kind: Generated<'routine' | 'annual' | 'incident' | 'handover'>;
  condition_rating: number | null;
  summary: Generated<string>;
  report: Generated<string>;
  created_at: GeneratedTimestamp;
}

export interface WorkItemsTable {
  id: Generated<string>;
  site_id: Immutable<string>;
  company_id: DerivedCompanyId;
  asset_id: string | null;
  walkthrough_id: string | null;
  title: string;
  description: Generated<string>;
  category: Generated<string>;
  severity: Severity;
  state: ColumnType<WorkItemStatus, WorkItemStatus | undefined, WorkItemStatus>;
  estimate_amount: NumericColumn | null;
  estimate_currency: Generated<string>;
  defer_until: Timestamp | null;
  decided_at: Timestamp | null;
  decided_by: string | null;
  decision_note: string | null;
  created_at: GeneratedTimestamp;
  updated_at: GeneratedTimestamp;
}

export interface WorkItemDecisionsTable {
  id: ColumnType<string, never, never>;
  work_item_id: string;
  site_id: string;
  company_id: DerivedCompanyId;
  decision: Decision;
  previous_state: WorkItemStatus;
  new_state: WorkItemStatus;
  note: string | null;
  defer_until: Timestamp | null;
  decided_by: string;
  decided_at: GeneratedTimestamp;
  request_id: string;
}

export interface DecisionIdempotencyKeysTable {
  caller_sub: string;
  idempotency_key: string;
  work_item_id: string;
  site_id: string;
  company_id: DerivedCompanyId;
  request_fingerprint: string;
  response_status: number;
  /** Any JSON value; written as a JSON string or object. */
  response_body: ColumnType<unknown, string, string>;
  created_at: GeneratedTimestamp;
}

export interface UploadIntentIdempotencyKeysTable {
  caller_sub: string;
  idempotency_key: string;
  site_id: string;
  company_id: DerivedCompanyId;
  media_id: string;
  request_fingerprint: string;
  signed_at: ColumnType<Date, Date | string, never>;
  created_at: GeneratedTimestamp;
}

export interface MediaItemsTable {
  id: Generated<string>;
  site_id: Immutable<string>;
  company_id: DerivedCompanyId;
  object_key: Immutable<string>;
  /** The workflow may only move a pending multipart item to `abandoned` (its abort). */
  status: ColumnType<MediaStatus, 'pending_upload' | undefined, 'abandoned'>;
  filename: Immutable<string>;
  declared_content_type: Immutable<string>;
  declared_size_bytes: ColumnType<string, number | string, never>;
  declared_checksum_sha256: ColumnType<string | null, string | null | undefined, never>;
  /** Written only by enterprise_api.record_object_created() (recordObjectCreated()). */
  actual_content_type: ColumnType<string | null, never, never>;
  actual_size_bytes: ColumnType<string | null, never, never>;
  etag: ColumnType<string | null, never, never>;
  /** Set by record_object_created() for rejected items, and with `abandoned` by an abort or the sweep. */
  rejection_reason: ColumnType<string | null, never, string>;
  walkthrough_id: ColumnType<string | null, string | null | undefined, never>;
  work_item_id: ColumnType<string | null, string | null | undefined, never>;
  asset_id: ColumnType<string | null, string | null | undefined, never>;
  uploaded_by: Immutable<string>;
  created_at: GeneratedTimestamp;
  upload_expires_at: ColumnType<Date | null, Date | string | null | undefined, never>;
  uploaded_at: ColumnType<Date | null, never, never>;
  updated_at: ColumnType<Date, never, Date | string>;
  /** The store's multipart upload id of an upload in parts (null: a single PUT, or a plan not started yet). */
  multipart_upload_id: ColumnType<string | null, string | null | undefined, string>;
  part_size_bytes: ColumnType<string | null, number | string | null | undefined, never>;
  part_count: ColumnType<number | null, number | null | undefined, never>;
}

/** Tables visible to `enterprise_api_role` (through RLS), keyed as Kysely expects. */
export interface EnterpriseDatabase {
  'enterprise.sites': SitesTable;
  'enterprise.assets': AssetsTable;
  'enterprise.walkthrough_logs': WalkthroughLogsTable;
  'enterprise.work_items': WorkItemsTable;
  'enterprise.work_item_decisions': WorkItemDecisionsTable;
  'enterprise.decision_idempotency_keys': DecisionIdempotencyKeysTable;
  'enterprise.upload_intent_idempotency_keys': UploadIntentIdempotencyKeysTable;
  'enterprise.media_items': MediaItemsTable;
}

export type WorkItem = Selectable<WorkItemsTable>;
export type WorkItemUpdate = Updateable<WorkItemsTable>;
export type NewWorkItemDecision = Insertable<WorkItemDecisionsTable>;
export type MediaItem = Selectable<MediaItemsTable>;
export type NewMediaItem = Insertable<MediaItemsTable>;
export type NewDecisionIdempotencyKey = Insertable<DecisionIdempotencyKeysTable>;
