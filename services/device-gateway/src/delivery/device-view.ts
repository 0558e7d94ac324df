// What on-call reads about devices (design §3.8): one device's view (GET /api/devices/{device_id}) and the fleet
// list (GET /api/devices). The view puts together this replica's registry and keys, the shared delivery record,
// and every replica's live part (relations, DTLS sessions) gathered over the bus with a deadline.
import { isDeviceId } from '@platform/contracts';
import { COMMON_ERRORS } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { ReplicaPart } from '../cluster/inspect.js';
import { READ_GRACE_MS, withDeadline, type Turns } from '../deadline.js';
import type { DeliveryState, GatewayDatabase } from '../db/tables.js';
import type { CredentialSummary } from '../domain/credentials.js';
import { UnknownDeviceError, type GatewayState } from '../domain/gateway-state.js';
import { listDelivery, readDelivery, type DeliveryCursor, type DeliveryRecordRow } from './sql.js';

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
}

const iso = (d: Date | null): string | null => (d === null ? null : d.toISOString());
const num = (v: string | null): number | null => (v === null ? null : Number(v));

/** The delivery record as the API shows it (never replica-internal content hashes). */
export function deliveryOf(row: DeliveryRecordRow | undefined): Record<string, unknown> | null {
  if (row === undefined) return null;
  const sentAcknowledged =
    row.sent_content !== null &&
    row.acked_content === row.sent_content &&
    Number(row.acked_version) >= Number(row.sent_version);
  return {
    state: row.state,
    desired: {
      version: num(row.desired_version),
      source: row.desired_source,
      since: iso(row.desired_at),
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
    heard_at: iso(row.heard_at),
    observed_by: row.observed_by,
    updated_at: iso(row.updated_at),
  };
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
  const [row, replicas] = await Promise.all([
    recordWithin(deps, deviceId, deps.config.delivery.viewDeadlineMs),
    deps.replicas(deviceId),
  ]);
  return {
    device: {
      device_id: record.deviceId,
      site_id: record.siteId,
      name: record.name,
      model: record.model,
      enabled: record.enabled,
    },
    settings: settings.body,
    delivery: deliveryOf(row),
    replicas,
    credentials: deps.credentials(deviceId),
  };
}

export interface DeviceListQuery {
  siteId?: string;
  delivery?: DeliveryState;
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
): Promise<{ items: Record<string, unknown>[]; next_cursor: string | null }> {
  const rows = await listDelivery(db, {
    limit: q.limit,
    ...(q.siteId === undefined ? {} : { siteId: q.siteId }),
    ...(q.delivery === undefined ? {} : { state: q.delivery }),
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
      ...deliveryOf(row),
    })),
    next_cursor:
      more && last !== undefined
        ? encodeCursor({ atMicros: last.at_micros, deviceId: last.device_id })
        : null,
  };
}
