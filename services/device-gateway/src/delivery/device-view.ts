// What on-call reads about devices (design §3.8): one device's view (GET /api/devices/{device_id}) and the fleet
// list (GET /api/devices). The view puts together this replica's registry and keys, the shared delivery record,
// and every replica's live part (relations, DTLS sessions) gathered over the bus with a deadline.
import { isDeviceId } from '@platform/contracts';
import { COMMON_ERRORS } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { ReplicaPart } from '../cluster/inspect.js';
import { settingsLayers } from '../cluster/overrides.js';
import { READ_GRACE_MS, withDeadline, type Turns } from '../deadline.js';
import type { DeliveryState, GatewayDatabase } from '../db/tables.js';
import type { CredentialSummary } from '../domain/credentials.js';
import type { VisibleDocument } from '../domain/documents.js';
import { UnknownDeviceError, type GatewayState } from '../domain/gateway-state.js';
import {
  listDelivery,
  readDelivery,
  type DeliveryCursor,
  type DeliveryListQuery,
  type DeliveryRecordRow,
} from './sql.js';

export interface DeviceViewDeps {
  db: Kysely<GatewayDatabase>;
  state: GatewayState;
  credentials: (deviceId: string) => CredentialSummary;
  /** This replica's and the others' live parts. */
  replicas: (deviceId: string) => Promise<ReplicaPart[]>;
  /** GATEWAY_DEVICE_VIEW_DEADLINE_MS: the delivery record's read keeps to it, as the replicas' parts do. */
  config: { delivery: { viewDeadlineMs: number } };
  /** Views' reads of the delivery record, one at a time (recordWithin). */
  recordReads: Turns;
  /** Whether a relation over `transport` speaks for the device (plain CoAP not for a keyed one, §3.8). */
  speaks: (deviceId: string, transport: string) => boolean;
}

const iso = (d: Date | null): string | null => (d === null ? null : d.toISOString());
const num = (v: string | null): number | null => (v === null ? null : Number(v));

/**
 * The delivery record as the API shows it (design §3.8). `desired`: this replica's settings document, when it is
 * what the record says the device should have (its content's digest is the record's desired one): the reported
 * document's `delta` is taken against it.
 */
export function deliveryOf(
  row: DeliveryRecordRow | undefined,
  desired?: VisibleDocument,
): Record<string, unknown> | null {
  if (row === undefined) return null;
  const sentAcknowledged =
    row.sent_content !== null &&
    row.acked_content === row.sent_content &&
    Number(row.acked_version) >= Number(row.sent_version);
  const desiredSettings =
    desired !== undefined && desired.contentDigest === row.desired_content
      ? ((desired.body as { settings?: Record<string, unknown> }).settings ?? null)
      : null;
  return {
    state: row.state,
    desired: {
      version: num(row.desired_version),
      source: row.desired_source,
      since: iso(row.desired_at),
      digest: row.desired_content,
    },
    sent:
      row.sent_version === null
        ? null
        : {
            version: num(row.sent_version),
            at: iso(row.sent_at),
            replica: row.sent_by,
            transport: row.sent_transport,
            type: row.sent_confirmable === true ? 'CON' : 'NON',
            is_desired: row.sent_content === row.desired_content,
            acknowledged: sentAcknowledged,
          },
    acknowledged:
      row.acked_version === null
        ? null
        : {
            version: num(row.acked_version),
            at: iso(row.acked_at),
            replica: row.acked_by,
            transport: row.acked_transport,
            is_desired: row.acked_content === row.desired_content,
          },
    reported:
      row.reported_version === null
        ? null
        : {
            version: num(row.reported_version),
            outcome: row.reported_outcome,
            reason: row.reported_reason,
            at: iso(row.reported_at),
            replica: row.reported_by,
            transport: row.reported_transport,
            is_desired: row.reported_content !== null && row.reported_content === row.desired_content,
            settings: row.reported_settings,
            delta:
              row.reported_settings === null || desiredSettings === null
                ? null
                : mergeDelta(row.reported_settings, desiredSettings),
          },
    heard_at: iso(row.heard_at),
    observed_by: row.observed_by,
    observed_unauthenticated_by: row.observed_unauthenticated_by,
    updated_at: iso(row.updated_at),
  };
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * What the device would have to change to run `desired`, as an RFC 7396 JSON Merge Patch of `reported`: each
 * member of `desired` that `reported` lacks or holds otherwise, objects compared member by member (§2), and
 * null for a member `reported` holds and `desired` does not. `{}` when they are equal (AWS IoT's `delta` is the
 * same idea, without the nulls).
 */
export function mergeDelta(
  reported: Record<string, unknown>,
  desired: Record<string, unknown>,
): Record<string, unknown> {
  const delta: Record<string, unknown> = {};
  for (const [key, want] of Object.entries(desired)) {
    const have = reported[key];
    if (isObject(want) && isObject(have)) {
      const inner = mergeDelta(have, want);
      if (Object.keys(inner).length > 0) delta[key] = inner;
    } else if (JSON.stringify(have) !== JSON.stringify(want)) delta[key] = want;
  }
  for (const key of Object.keys(reported)) if (!Object.hasOwn(desired, key)) delta[key] = null;
  return delta;
}

/**
 * Whether each relation speaks for the device (design §3.8): over DTLS always; over plain CoAP only for a device
 * without a key on a gateway that serves coaps. A relation that does not is listed, marked, and moves nothing in
 * the record.
 */
function markRelations(replicas: ReplicaPart[], speaks: (transport: string) => boolean): ReplicaPart[] {
  return replicas.map((part) => {
    const relations = (part as { relations?: { transport: string }[] }).relations;
    if (relations === undefined) return part;
    return {
      ...part,
      relations: relations.map((rel) => ({ ...rel, speaks_for_device: speaks(rel.transport) })),
    };
  });
}

/**
 * The device's delivery record within the view's deadline. The read's own statement and lock timeouts start
 * once it holds a connection, so views read one at a time (a read takes about a millisecond) and a view that
 * does not get its turn, or its answer, within the deadline (plus 250 ms) is 503 backend_unavailable without
 * touching the pool: a cold review had 24 views behind a locked table (a migration) hold the whole pool, the
 * views answered after 2 s and notify-settings failed meanwhile.
 */
async function recordWithin(
  deps: DeviceViewDeps,
  deviceId: string,
  deadlineMs: number,
): Promise<DeliveryRecordRow | undefined> {
  const timedOut = (): Error =>
    COMMON_ERRORS.databaseTimedOut(new Error(`no delivery record within ${deadlineMs} ms`));
  const until = Date.now() + deadlineMs + READ_GRACE_MS;
  const turns = deps.recordReads;
  if (!(await turns.take(until - Date.now()))) throw timedOut();
  const read = readDelivery(deps.db, deviceId, deadlineMs);
  // The turn is given back when the read ends (at its own timeouts at the latest), not when the view stops
  // waiting for it.
  read.then(
    () => turns.give(),
    () => turns.give(),
  );
  return withDeadline(read, until - Date.now(), timedOut);
}

export async function deviceView(deps: DeviceViewDeps, deviceId: string): Promise<Record<string, unknown>> {
  const record = deps.state.deviceRecord(deviceId);
  const settings = deps.state.settingsDocument(deviceId);
  if (record === undefined || settings === undefined) throw new UnknownDeviceError(deviceId);
  const [row, parts] = await Promise.all([
    recordWithin(deps, deviceId, deps.config.delivery.viewDeadlineMs),
    deps.replicas(deviceId),
  ]);
  const replicas = markRelations(parts, (transport) => deps.speaks(deviceId, transport));
  const delivery = deliveryOf(row, settings);
  return {
    device: {
      device_id: record.deviceId,
      site_id: record.siteId,
      name: record.name,
      model: record.model,
      enabled: record.enabled,
    },
    settings: settings.body,
    settings_layers: settingsLayers(deps.state, deviceId),
    delivery,
    replicas,
    credentials: deps.credentials(deviceId),
  };
}

export interface DeviceListQuery {
  siteId?: string;
  /** The caller's site scope (DeliveryListQuery.siteScope). */
  siteScope?: DeliveryListQuery['siteScope'];
  /** Devices in any of these states (none: all). */
  delivery?: readonly DeliveryState[];
  /** Of the acknowledged ones, only those acknowledged at least this long ago (s): acknowledged, not applied. */
  acknowledgedForS?: number;
  limit: number;
  /** Where the page starts (decodeCursor of the previous page's next_cursor). */
  after?: DeliveryCursor;
}

/** The opaque cursor: base64url of the last row's (desired_at µs, device_id). */
export function encodeCursor(c: DeliveryCursor): string {
  return Buffer.from(JSON.stringify([c.atMicros, c.deviceId])).toString('base64url');
}

/** Undefined when the text is not a cursor this service issued (the caller answers 400). */
export function decodeCursor(text: string): DeliveryCursor | undefined {
  if (text.length > 400 || !/^[A-Za-z0-9_-]+$/.test(text)) return undefined;
  try {
    const data: unknown = JSON.parse(Buffer.from(text, 'base64url').toString('utf8'));
    if (!Array.isArray(data) || data.length !== 2) return undefined;
    const [at, id] = data as unknown[];
    // Within timestamptz's range (17 digits of µs: up to the year 5138) and a device id the registry allows.
    if (typeof at !== 'string' || !/^-?\d{1,17}$/.test(at) || !isDeviceId(id)) return undefined;
    return { atMicros: at, deviceId: id };
  } catch {
    return undefined;
  }
}

export async function deviceList(
  db: Kysely<GatewayDatabase>,
  q: DeviceListQuery,
  desired?: (deviceId: string) => VisibleDocument | undefined,
): Promise<{ items: Record<string, unknown>[]; next_cursor: string | null }> {
  const rows = await listDelivery(db, {
    limit: q.limit,
    ...(q.siteId === undefined ? {} : { siteId: q.siteId }),
    ...(q.siteScope === undefined ? {} : { siteScope: q.siteScope }),
    ...(q.delivery === undefined ? {} : { states: q.delivery }),
    ...(q.acknowledgedForS === undefined ? {} : { acknowledgedForS: q.acknowledgedForS }),
    ...(q.after === undefined ? {} : { after: q.after }),
  });
  const more = rows.length > q.limit;
  const page = more ? rows.slice(0, q.limit) : rows;
  const last = page.at(-1);
  return {
    items: page.map((row) => ({
      device_id: row.device_id,
      site_id: row.site_id,
      name: row.name,
      model: row.model,
      ...deliveryOf(row, desired?.(row.device_id)),
    })),
    next_cursor:
      more && last !== undefined
        ? encodeCursor({ atMicros: last.at_micros, deviceId: last.device_id })
        : null,
  };
}
