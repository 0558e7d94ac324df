import type { ColumnType, Generated } from 'kysely';

/** `device_gateway.device_registry` (design §3.2). The gateway reads it; operators and seeds write it. */
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

/**
 * `device_gateway.device_credentials` (design §3.5): DTLS pre-shared keys. The gateway's login may
 * only read it; the operator command (`npm run device-key`, an owner login) writes it.
 */
export interface DeviceCredentialsTable {
  /** bigint identity; pg returns int8 as a string. */
  credential_id: Generated<string>;
  psk_identity: string;
  /** The raw key bytes (the UTF-8 bytes of the printable key text). */
  psk_key: Buffer;
  device_id: string;
  not_before: ColumnType<Date, Date | string | undefined, Date | string>;
  not_after: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  revoked_at: ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
  created_at: ColumnType<Date, Date | string | undefined, never>;
}

/**
 * `device_gateway.device_delivery` (design §3.8): one device's delivery record, written by the replicas through
 * `delivery_record` (migration 0005); the login reads it.
 */
export interface DeviceDeliveryTable {
  device_id: string;
  site_id: string | null;
  /** bigint: pg returns int8 as a string. */
  desired_version: string | null;
  desired_source: 'registry' | 'override' | 'rollout' | null;
  desired_content: string | null;
  desired_at: Date;
  sent_version: string | null;
  sent_content: string | null;
  sent_at: Date | null;
  sent_by: string | null;
  sent_transport: 'plain' | 'dtls' | null;
  sent_confirmable: boolean | null;
  acked_version: string | null;
  acked_content: string | null;
  acked_at: Date | null;
  acked_by: string | null;
  acked_transport: 'plain' | 'dtls' | null;
  heard_at: Date | null;
  observed_by: string[];
  /** Replicas whose relations to the device's settings include none that speaks for it, but one (migration 0042). */
  observed_unauthenticated_by: string[];
  /** The device's own word (migration 0023): what it did with `reported_version`. */
  reported_version: string | null;
  reported_content: string | null;
  reported_outcome: 'applied' | 'rejected' | null;
  reported_reason: string | null;
  reported_settings: Record<string, unknown> | null;
  reported_at: Date | null;
  reported_by: string | null;
  reported_transport: 'plain' | 'dtls' | null;
  state: DeliveryState;
  updated_at: Date;
}

/** Where a device's delivery stands (migrations 0023 and 0042 derive it in the row; design §3.8). */
export type DeliveryState =
  | 'applied'
  | 'rejected'
  | 'acknowledged'
  | 'pending'
  | 'sent_unconfirmed'
  | 'observed_unauthenticated'
  | 'unobserved'
  | 'stale';

export interface GatewayDatabase {
  'device_gateway.device_delivery': DeviceDeliveryTable;
  'device_gateway.device_registry': DeviceRegistryTable;
  'device_gateway.device_credentials': DeviceCredentialsTable;
}
