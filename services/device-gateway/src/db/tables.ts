import type { ColumnType, Generated } from 'kysely';

/** `device_gateway.device_registry` (DESIGN 3.2). The gateway reads it; operators and seeds write it. */
export interface DeviceRegistryTable {
  device_id: string;
  site_id: string;
  name: string;
  model: string;
  enabled: Generated<boolean>;
  /** Device Settings v1, or `{}`; pg returns jsonb parsed. */
  desired_settings: ColumnType<Record<string, unknown>, string | undefined, string>;
  updated_at: ColumnType<Date, Date | string | undefined, Date | string>;
}

export interface GatewayDatabase {
  'device_gateway.device_registry': DeviceRegistryTable;
}
