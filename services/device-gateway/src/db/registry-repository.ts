import type { Kysely } from 'kysely';
import type { DeviceRecord } from '../domain/documents.js';
import type { GatewayDatabase } from './tables.js';

/** Every registry row, as domain records (the gateway swaps its whole registry on each load). */
export async function loadRegistry(db: Kysely<GatewayDatabase>): Promise<DeviceRecord[]> {
  const rows = await db
    .selectFrom('device_gateway.device_registry')
    .select(['device_id', 'site_id', 'name', 'model', 'enabled', 'desired_settings'])
    .execute();
  return rows.map((row) => ({
    deviceId: row.device_id,
    siteId: row.site_id,
    name: row.name,
    model: row.model,
    enabled: row.enabled,
    desiredSettings: row.desired_settings,
  }));
}
