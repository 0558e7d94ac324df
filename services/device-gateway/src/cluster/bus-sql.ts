// The replica bus's SQL (design §3.6): the functions of migrations 0003 and 0017 and the bus's tables, nothing else.
import { sql, type Kysely } from 'kysely';
import type pg from 'pg';
import type { GatewayDatabase } from '../db/tables.js';
import type { Settings } from '../domain/documents.js';
import { notifyChannel } from './channels.js';
import { BUS_CHANNEL, type RetainedMessage } from './messages.js';

/** What bus_publish_overrides did with one message. */
export type Written = 'written' | 'lost' | 'not_in_registry';

/**
 * Publishes override messages in one statement, so one transaction: each is kept as its device's retained
 * override when it wins on (version, origin), and NOTIFYed at commit.
 */
export async function publishOverrides(db: Kysely<GatewayDatabase>, payloads: string[]): Promise<Written[]> {
  const result = await sql<{ written: (boolean | null)[] }>`
    SELECT device_gateway.bus_publish_overrides(${payloads}::text[]) AS written`.execute(db);
  // Per message: true retained and sent, false lost to a newer one, NULL device not in the registry.
  const written: (boolean | null)[] = result.rows[0]?.written ?? [];
  return payloads.map((_, i) =>
    written[i] === true ? 'written' : written[i] === false ? 'lost' : 'not_in_registry',
  );
}

export async function publishReload(db: Kysely<GatewayDatabase>, payload: string): Promise<void> {
  await sql`SELECT device_gateway.bus_publish_reload(${payload})`.execute(db);
}

/**
 * The wake-up after a publish, in a statement of its own: PostgreSQL's NOTIFY queue is the whole cluster's, so
 * another database's session can fill it, and a NOTIFY then fails at commit. Sent here, that failure costs the
 * other replicas a timer's delay (ClusterBus reads on a timer too), not the publish.
 */
export async function wakeReplicas(db: Kysely<GatewayDatabase>): Promise<void> {
  await notifyChannel(db, BUS_CHANNEL, '');
}

/** A row of the bus (migration 0017) as a message to check (Replica.receive), with its change number. */
export interface Change {
  seq: number;
  message: { k: string; d?: string; v: number; o: string; s?: unknown };
}

interface ChangeRow {
  seq: string;
  k: string;
  d: string | null;
  v: string;
  o: string;
  s: unknown;
}

// A retained row with NULL settings is a cleared override (a tombstone, migration 0024).
const toChange = (row: ChangeRow): Change => ({
  seq: Number(row.seq),
  message:
    row.k !== 'override'
      ? { k: row.k, v: Number(row.v), o: row.o }
      : row.s === null
        ? { k: 'clear', d: row.d ?? '', v: Number(row.v), o: row.o }
        : { k: row.k, d: row.d ?? '', v: Number(row.v), o: row.o, s: row.s },
});

/**
 * Every retained override and cleared override (tombstone), as messages to check (Replica.resync): what a resync
 * starts from, with the change number topSeq read before it; later changes are read with readChanges from there.
 */
export async function readRetained(db: Kysely<GatewayDatabase>): Promise<RetainedMessage[]> {
  const rows = await sql<{ device_id: string; version: string; origin: string; settings: Settings | null }>`
    SELECT device_id, version::text AS version, origin, settings FROM device_gateway.bus_overrides`.execute(
    db,
  );
  return rows.rows.map((row) =>
    row.settings === null
      ? { k: 'clear', d: row.device_id, v: Number(row.version), o: row.origin }
      : { k: 'override', d: row.device_id, v: Number(row.version), o: row.origin, s: row.settings },
  );
}

/**
 * Clears the device's retained override (migration 0024: a tombstone under a new change number, its version above
 * the override's). `cleared`: a live override was retained; `version`: the tombstone's.
 */
export async function clearOverride(
  db: Kysely<GatewayDatabase>,
  deviceId: string,
  version: number,
  origin: string,
): Promise<{ cleared: boolean; version: number }> {
  const { rows } = await sql<{ r: { cleared: boolean; version: number } }>`
    SELECT device_gateway.bus_clear_override(${deviceId}, ${String(version)}, ${origin}) AS r`.execute(db);
  const r = rows[0]!.r;
  return { cleared: r.cleared, version: Number(r.version) };
}

/** The version of the device's retained row (override or clear), if it has one. */
export async function retainedVersion(
  db: Kysely<GatewayDatabase>,
  deviceId: string,
): Promise<number | undefined> {
  const { rows } = await sql<{ version: string }>`
    SELECT version::text AS version FROM device_gateway.bus_overrides WHERE device_id = ${deviceId}`.execute(
    db,
  );
  return rows[0] === undefined ? undefined : Number(rows[0].version);
}

/** A live retained override, as GET /api/overrides lists them. */
export interface RetainedOverride {
  device_id: string;
  version: string;
  origin: string;
  settings: Settings;
  published_at: Date;
}

/** Live retained overrides with a device id above `after`, by device id, at most `limit`. */
export async function listOverrides(
  db: Kysely<GatewayDatabase>,
  after: string | undefined,
  limit: number,
): Promise<RetainedOverride[]> {
  const { rows } = await sql<RetainedOverride>`
    SELECT device_id, version::text AS version, origin, settings, published_at
    FROM device_gateway.bus_overrides
    WHERE settings IS NOT NULL AND (${after ?? null}::text IS NULL OR device_id COLLATE "C" > ${after ?? null}::text)
    ORDER BY device_id COLLATE "C" LIMIT ${limit}`.execute(db);
  return rows;
}

/** The change number the bus stands at now (0 when nothing was ever published). */
export async function topSeq(db: Kysely<GatewayDatabase>): Promise<number> {
  const { rows } = await sql<{ top: string }>`
    SELECT greatest(coalesce((SELECT max(seq) FROM device_gateway.bus_overrides), 0),
                    coalesce((SELECT seq FROM device_gateway.bus_reload), 0))::text AS top`.execute(db);
  return Number(rows[0]?.top ?? 0);
}

/**
 * The overrides written and the reload asked for since change number `afterSeq`, in their order, at most
 * `limit`. Change numbers become visible in their order (0017's advisory lock), so reading on from the last one
 * read misses nothing.
 */
export async function readChanges(
  db: Kysely<GatewayDatabase>,
  afterSeq: number,
  limit: number,
): Promise<Change[]> {
  const rows = await sql<ChangeRow>`
    SELECT * FROM (
      SELECT seq::text AS seq, seq AS n, 'override' AS k, device_id AS d, version::text AS v, origin AS o,
             settings AS s
      FROM device_gateway.bus_overrides WHERE seq > ${afterSeq}
      UNION ALL
      SELECT seq::text, seq, 'reload', NULL, version::text, origin, NULL
      FROM device_gateway.bus_reload WHERE seq > ${afterSeq}
    ) c ORDER BY n LIMIT ${limit}`.execute(db);
  return rows.rows.map(toChange);
}

/**
 * Once per process, on a pooled connection (not the listener's, where it would wait behind whatever notifications
 * arrive first): when no other replica is up and synchronised, clears the retained overrides of a gateway that
 * stopped altogether; returns how many, and the highest version kept. A pooled session is never named
 * `device-gateway-bus ...`, and this replica's listener is still ` joining`, so neither counts as up.
 */
export async function join(
  db: Kysely<GatewayDatabase>,
): Promise<{ cleared: number; topVersion: number | undefined }> {
  const { rows } = await sql<{ cleared: number; top_version: string | null }>`
    SELECT cleared, top_version::text AS top_version FROM device_gateway.bus_join()`.execute(db);
  const result = rows[0];
  return {
    cleared: result?.cleared ?? 0,
    topVersion: result?.top_version == null ? undefined : Number(result.top_version),
  };
}

/** Renames the listener's session in pg_stat_activity (how bus_join tells replicas apart). */
export async function nameSession(client: pg.Client, name: string): Promise<void> {
  await client.query(`SELECT set_config('application_name', $1, false)`, [name]);
}
