import { sql, type Kysely } from 'kysely';
import type { DeviceRecord, Settings } from '../domain/documents.js';
import type { GatewayDatabase } from './tables.js';

/**
 * Every registry row, as domain records (the gateway swaps its whole registry on each load).
 *
 * Settings are read as JSON text and parsed once per distinct text: devices configured alike (a fleet on
 * one template) share one settings object, which GatewayState validates and canonicalises once per reload.
 * Reading text also spares node-postgres a JSON.parse per row of a jsonb column.
 */
export async function loadRegistry(db: Kysely<GatewayDatabase>): Promise<DeviceRecord[]> {
  const rows = await db
    .selectFrom('device_gateway.device_registry')
    .select(['device_id', 'site_id', 'name', 'model', 'enabled'])
    .select(sql<string>`desired_settings::text`.as('settings_json'))
    .execute();
  const parsed = new Map<string, Settings>();
  return rows.map((row) => {
    let settings = parsed.get(row.settings_json);
    if (settings === undefined) {
      settings = JSON.parse(row.settings_json) as Settings;
      parsed.set(row.settings_json, settings);
    }
    return {
      deviceId: row.device_id,
      siteId: row.site_id,
      name: row.name,
      model: row.model,
      enabled: row.enabled,
      desiredSettings: settings,
    };
  });
}
