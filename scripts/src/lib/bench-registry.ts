// The registry the gateway benchmarks run against: `bench-000000` … on one site, each with the same settings.
import { sql, type Kysely } from 'kysely';
import type { GatewayDatabase } from '@platform/device-gateway';

/** Device i of the benchmarks' registry. */
export const benchDeviceId = (i: number): string => `bench-${String(i).padStart(6, '0')}`;

/** Inserts `n` enabled devices `bench-000000` … (benchDeviceId) with a reporting interval of 60 s. */
export async function seedBenchRegistry(owner: Kysely<GatewayDatabase>, n: number): Promise<void> {
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model, desired_settings)
    SELECT 'bench-' || lpad(i::text, 6, '0'), 'a1000000-0000-4000-8000-000000000001', 'Bench device ' || i, 'bench',
           '{"reporting_interval_s": 60}'::jsonb
    FROM generate_series(0, ${n - 1}) AS i`.execute(owner);
}
