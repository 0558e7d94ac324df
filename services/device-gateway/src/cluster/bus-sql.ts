// The replica bus's SQL (design §3.6): the functions of migration 0003 and the retained table, nothing else.
import { sql, type Kysely } from 'kysely';
import type pg from 'pg';
import type { GatewayDatabase } from '../db/tables.js';
import type { Settings } from '../domain/documents.js';
import type { OverrideMessage } from './messages.js';

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

/** Every retained override, as messages (to be checked like any message from the channel). */
export async function readRetained(db: Kysely<GatewayDatabase>): Promise<OverrideMessage[]> {
  const rows = await sql<{ device_id: string; version: string; origin: string; settings: Settings }>`
    SELECT device_id, version::text AS version, origin, settings FROM device_gateway.bus_overrides`.execute(
    db,
  );
  return rows.rows.map((row) => ({
    k: 'override',
    d: row.device_id,
    v: Number(row.version),
    o: row.origin,
    s: row.settings,
  }));
}

/**
 * Once per process, on the listener's connection: when no other replica is up and synchronised, clears the
 * retained overrides of a gateway that stopped altogether; returns how many, and the highest version kept.
 */
export async function join(client: pg.Client): Promise<{ cleared: number; topVersion: number | undefined }> {
  const { rows } = await client.query<{ cleared: number; top_version: string | null }>(
    'SELECT cleared, top_version::text AS top_version FROM device_gateway.bus_join()',
  );
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
