import type { ColumnType, Generated } from 'kysely';

/** device_gateway.audit_events (migration 0025): append-only; `id` and `at` are the database's. */
// Type aliases, not interfaces: Kysely.withTables needs an index-signature-compatible type.
export type AuditEventsTable = {
  id: Generated<string>;
  at: ColumnType<Date, never, never>;
  principal: string;
  principal_kind: string;
  principal_name: string | null;
  role: string | null;
  request_id: string | null;
  source_address: string | null;
  action: string;
  device_id: string | null;
  rollout_id: string | null;
  site_ids: string[];
  /**
   * `<site id>/<company id>` of each site at the change: the change's own (read at the change for a caller scoped by
   * companies, sites/confirm.ts), else the queue's stamp (audit/queue.ts), else the database's at the insert: the
   * rollout's own pairs for a row about a rollout (0043), the sites' companies now otherwise (0037, 0038; only pairs
   * of the row's own sites are taken).
   */
  site_companies: ColumnType<string[], string[] | undefined, never>;
  /** JSON text on insert, an object on select. */
  detail: ColumnType<Record<string, unknown>, string, never>;
};

/** The audit's table, added to the gateway's tables where the audit is read or written (Kysely.withTables). */
export type AuditDatabase = {
  'device_gateway.audit_events': AuditEventsTable;
};
