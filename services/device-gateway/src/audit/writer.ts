// The audit of changes on the fleet side (design §3.1, issue 42 §4): one function per kind of change, each taking
// who (the principal), the request id and source address (when it came over HTTP), what, and the scope it touched;
// each writes one append-only row of device_gateway.audit_events (migration 0025). A function that is given a
// transaction writes in it, so the change and its row commit together.
import { sql, type Insertable, type Kysely, type Transaction } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';
import type { Principal } from '../auth/principal.js';
import type { AuditDatabase, AuditEventsTable } from './table.js';

/** Where a change came from: the principal, and for HTTP the request id and the client address. */
export interface AuditOrigin {
  principal: Principal;
  requestId?: string | undefined;
  sourceAddress?: string | undefined;
}

/** The scope of a change: the sites it touched (for scoped readers), and the device or rollout. */
export interface AuditScope {
  siteIds?: readonly string[];
  deviceId?: string;
  rolloutId?: string;
}

type Db = Kysely<GatewayDatabase> | Transaction<GatewayDatabase>;

/**
 * Identities named in one device-key row: 20 of at most 128 characters fit the 4 KiB detail; a device with more
 * keys revoked at once is recorded with its count (the rest are in device_credentials' revoked_at).
 */
const MAX_AUDITED_IDENTITIES = 20;

/** Longest client address kept (an IPv6 address with a zone fits). */
const MAX_ADDRESS = 64;

/** One row as audit_events takes it (the descriptive columns the login may write). */
export type AuditRow = Insertable<AuditEventsTable>;

/** Writes one row. `action` is a lower-case dotted name (`settings.notified`); `detail` at most 4 KiB of JSON. */
export async function recordAudit(
  db: Db,
  origin: AuditOrigin,
  action: string,
  scope: AuditScope,
  detail: Record<string, unknown> = {},
): Promise<void> {
  await insertAuditRows(db, [auditRow(origin, action, scope, detail)]);
}

/** A row's detail as stored: at most MAX_DETAIL_TEXT bytes of jsonb text, else a note of what was left out. */
const MAX_DETAIL_TEXT = 4000;

/**
 * Writes rows in one statement. A detail is bounded where its size is known, as jsonb prints it: jsonb spells
 * numbers without exponents, so 1.8e308 from a caller's settings takes 309 bytes, and one such row past 0025's 4 KiB
 * check refused the whole batch (a cold review lost a burst of other callers' rows that way). A detail too long keeps
 * its scalar fields and its settings' scalar fields (maintenance mode, firmware channel, interval: what a change set;
 * a sixth cold review hid them behind thresholds jsonb spells long) with {"truncated": true, "bytes": n}, or only
 * the latter when even that is too long; the rest of the row stands.
 */
/** The scalar fields of a jsonb object (SQL of the detail's alias `d.j`, constant text). */
const scalarsOf = (json: string) =>
  sql.raw(`coalesce((SELECT jsonb_object_agg(e.k, e.v) FROM jsonb_each(${json}) AS e(k, v)
    WHERE jsonb_typeof(e.v) NOT IN ('object', 'array')), '{}'::jsonb)`);
const SCALARS_OF_DETAIL = scalarsOf('d.j');
const SCALARS_OF_SETTINGS = scalarsOf("d.j->'settings'");

export async function insertAuditRows(db: Db, rows: readonly AuditRow[]): Promise<void> {
  if (rows.length === 0) return;
  await (db as unknown as Kysely<AuditDatabase>)
    .insertInto('device_gateway.audit_events')
    .values(
      rows.map((r) => ({
        ...r,
        detail: sql<string>`(SELECT CASE WHEN octet_length(d.j::text) <= ${MAX_DETAIL_TEXT} THEN d.j
          ELSE (SELECT CASE WHEN octet_length(a.x::text) <= ${MAX_DETAIL_TEXT} THEN a.x ELSE a.mark END
                FROM (SELECT ${SCALARS_OF_DETAIL}
                        || CASE WHEN jsonb_typeof(d.j->'settings') = 'object'
                             THEN jsonb_build_object('settings', ${SCALARS_OF_SETTINGS}) ELSE '{}'::jsonb END
                        || m.mark AS x, m.mark
                      FROM (SELECT jsonb_build_object('truncated', true, 'bytes', octet_length(d.j::text)) AS mark) m) a)
          END FROM (SELECT ${r.detail}::jsonb AS j) d)`,
      })),
    )
    .execute();
}

/** The row of a change (recordAudit's, without writing it). */
export function auditRow(
  origin: AuditOrigin,
  action: string,
  scope: AuditScope,
  detail: Record<string, unknown> = {},
): AuditRow {
  const p = origin.principal;
  return {
    principal: p.id,
    principal_kind: p.kind,
    principal_name: p.name,
    role: p.role,
    request_id: origin.requestId ?? null,
    source_address: origin.sourceAddress?.slice(0, MAX_ADDRESS) ?? null,
    action,
    device_id: scope.deviceId ?? null,
    rollout_id: scope.rolloutId ?? null,
    site_ids: [...new Set(scope.siteIds ?? [])].sort(),
    detail: JSON.stringify(detail),
  };
}

/**
 * The rows of the changes audited at a high rate (a notify, a clear), for AuditQueue: written in batches after the
 * answer, not one INSERT per request.
 */
export const auditRows = {
  settingsNotified: (
    o: AuditOrigin,
    what: { deviceId: string; siteId: string; version: number; settings: Record<string, unknown> },
  ) =>
    auditRow(
      o,
      'settings.notified',
      { deviceId: what.deviceId, siteIds: [what.siteId] },
      { version: what.version, settings: what.settings },
    ),
  overrideCleared: (o: AuditOrigin, what: { deviceId: string; siteId: string }) =>
    auditRow(o, 'override.cleared', { deviceId: what.deviceId, siteIds: [what.siteId] }),
  /** A registry reload over HTTP (every site: `siteIds` empty). */
  registryReloaded: (o: AuditOrigin) => auditRow(o, 'registry.reloaded', {}),
};

/** The kinds of change, one function each (the lead wires the ones in routes.ts and the rollout code). */
export const audit = {
  /** notify-settings: an override set on one device. */
  settingsNotified: (
    db: Db,
    o: AuditOrigin,
    what: { deviceId: string; siteId: string; version: number; settings: Record<string, unknown> },
  ) => insertAuditRows(db, [auditRows.settingsNotified(o, what)]),
  /** An override cleared (the device falls back to its rollout's or the registry's settings). */
  overrideCleared: (db: Db, o: AuditOrigin, what: { deviceId: string; siteId: string }) =>
    insertAuditRows(db, [auditRows.overrideCleared(o, what)]),
  /** A rollout's creation, with the sites its targets are at. */
  rolloutCreated: (
    db: Db,
    o: AuditOrigin,
    what: {
      rolloutId: string;
      siteIds: readonly string[];
      targets: number;
      selector: Record<string, unknown>;
    },
  ) =>
    recordAudit(
      db,
      o,
      'rollout.created',
      { rolloutId: what.rolloutId, siteIds: what.siteIds },
      { targets: what.targets, selector: what.selector },
    ),
  /** pause, resume, cancel, rollback, promote (by a person or a tool), or the driver's own halt. */
  rolloutChanged: (
    db: Db,
    o: AuditOrigin,
    what: {
      rolloutId: string;
      siteIds: readonly string[];
      change: 'paused' | 'resumed' | 'cancelled' | 'rolled_back' | 'promoted' | 'completed' | 'aborted';
      reason?: string;
      /** The driver's own decision: its rollout event (where the driver's audit resumes after a restart). */
      eventId?: string;
    },
  ) =>
    recordAudit(
      db,
      o,
      `rollout.${what.change}`,
      { rolloutId: what.rolloutId, siteIds: what.siteIds },
      {
        ...(what.reason === undefined ? {} : { reason: what.reason }),
        ...(what.eventId === undefined ? {} : { event_id: what.eventId }),
      },
    ),
  /** A device key issued, rotated or revoked (the device-key command, an owner login). */
  deviceKeyChanged: (
    db: Db,
    o: AuditOrigin,
    what: {
      deviceId: string;
      siteId: string | undefined;
      change: 'issued' | 'revoked';
      identities: readonly string[];
      /** The OS user that ran the command, when the principal names someone else (`--by`). */
      osUser?: string;
    },
  ) =>
    recordAudit(
      db,
      o,
      `device_key.${what.change}`,
      { deviceId: what.deviceId, siteIds: what.siteId === undefined ? [] : [what.siteId] },
      {
        count: what.identities.length,
        identities: what.identities.slice(0, MAX_AUDITED_IDENTITIES),
        ...(what.osUser === undefined ? {} : { os_user: what.osUser }),
      },
    ),
};
