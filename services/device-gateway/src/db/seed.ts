import type { Kysely } from 'kysely';
import type { GatewayDatabase } from './tables.js';

/**
 * Site ids of the demo data set: the portal's (packages/enterprise-db demo.ts `demoSites`), so one set of ids
 * works across the README, the banner, the portal and the gateway (issue 42 §1). Written out rather than
 * imported: the gateway does not depend on the enterprise schema's package; test/people-sites.test.ts checks
 * that they are the portal's. On a platform database a device at any other site is refused at load.
 */
export const demoSites = {
  acmeHq: '5e000000-0000-4000-8000-000000000a01',
  acmeWarehouse: '5e000000-0000-4000-8000-000000000a02',
  borealisTower: '5e000000-0000-4000-8000-000000000b01',
} as const;

const demoDevices = [
  {
    device_id: 'acme-hq-hvac-01',
    site_id: demoSites.acmeHq,
    name: 'Acme HQ rooftop HVAC unit 1',
    model: 'hvac-rtu-4000',
    enabled: true,
    desired_settings: {
      reporting_interval_s: 60,
      telemetry_enabled: true,
      thresholds: { supply_temp_c: { min: 12, max: 18 } },
    },
  },
  {
    device_id: 'acme-hq-meter-02',
    site_id: demoSites.acmeHq,
    name: 'Acme HQ main electricity meter',
    model: 'meter-em-210',
    enabled: false,
    desired_settings: { reporting_interval_s: 900 },
  },
  {
    device_id: 'acme-hq-lobby-sensor-03',
    site_id: demoSites.acmeHq,
    name: 'Acme HQ lobby air-quality sensor',
    model: 'aq-sense-2',
    enabled: true,
    desired_settings: { sampling_interval_s: 30, reporting_interval_s: 300, timezone: 'Europe/Berlin' },
  },
  {
    device_id: 'acme-wh-door-01',
    site_id: demoSites.acmeWarehouse,
    name: 'Acme warehouse loading dock door',
    model: 'door-ctl-7',
    enabled: true,
    desired_settings: {},
  },
  {
    device_id: 'acme-wh-freezer-02',
    site_id: demoSites.acmeWarehouse,
    name: 'Acme warehouse freezer monitor',
    model: 'cold-chain-3',
    enabled: true,
    desired_settings: {
      reporting_interval_s: 60,
      thresholds: { temp_c: { min: -25, max: -15 } },
      firmware_channel: 'stable',
    },
  },
  {
    device_id: 'borealis-tower-chiller-01',
    site_id: demoSites.borealisTower,
    name: 'Borealis Tower chiller',
    model: 'chiller-cx-900',
    enabled: true,
    desired_settings: { reporting_interval_s: 120, maintenance_mode: false, firmware_channel: 'beta' },
  },
  {
    device_id: 'borealis-tower-lift-02',
    site_id: demoSites.borealisTower,
    name: 'Borealis Tower lift controller',
    model: 'lift-ctl-5',
    enabled: true,
    desired_settings: { telemetry_enabled: true, timezone: 'Europe/Helsinki' },
  },
];

/**
 * Loads the demo devices. Idempotent: existing rows (possibly edited by an operator) are left alone.
 * Runs with the owner role (`npm run seed`), never with the gateway's read-only login.
 */
export async function seedDevices(db: Kysely<GatewayDatabase>): Promise<void> {
  await db
    .insertInto('device_gateway.device_registry')
    .values(demoDevices.map((d) => ({ ...d, desired_settings: JSON.stringify(d.desired_settings) })))
    .onConflict((oc) => oc.column('device_id').doNothing())
    .execute();
}
