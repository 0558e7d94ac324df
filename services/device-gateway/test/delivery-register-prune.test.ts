// Migration 0015 (design §3.8): a registration that adds this replica to a device's observed_by leaves the
// replicas that are gone out of it in the same write, so after a replica died the devices that register again
// elsewhere are written once, and delivery_reap finds their rows clean.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { deliveryWriter } from '../src/delivery/sql.js';
import { recordRows } from './support/delivery.js';

const SITE = 'd0d0d0d0-0000-4000-8000-000000000015';
const DEAD = 'deadbeefdeadbeef';
const LIVE = 'a1a1a1a1a1a1a1a1';
const SELF = 'b2b2b2b2b2b2b2b2';
const DEVICES = ['rp-0', 'rp-1', 'rp-2', 'rp-3'];

let database: TestDatabase;
let owner: Kysely<unknown>;
let login: Kysely<GatewayDatabase>;
let liveBus: pg.Client;

async function observedBy(): Promise<Record<string, string[]>> {
  const { rows } = await sql<{ device_id: string; observed_by: string[] }>`
    SELECT device_id, observed_by FROM device_gateway.device_delivery ORDER BY device_id`.execute(owner);
  return Object.fromEntries(rows.map((r) => [r.device_id, r.observed_by]));
}

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
  login = createDb<GatewayDatabase>(gatewayLoginUrl(database.url), { max: 2 });
  // LIVE is a replica whose bus session is up; DEAD's is not.
  liveBus = new pg.Client({
    connectionString: gatewayLoginUrl(database.url),
    application_name: `device-gateway-bus ${LIVE}`,
  });
  await liveBus.connect();
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT d, ${SITE}::uuid, d, 'prune' FROM unnest(${DEVICES}::text[]) d`.execute(owner);
  await sql`
    INSERT INTO device_gateway.device_delivery (device_id, site_id, desired_at, observed_by) VALUES
      ('rp-0', ${SITE}::uuid, now(), ARRAY[${DEAD}]),
      ('rp-1', ${SITE}::uuid, now(), ARRAY[${LIVE}, ${DEAD}]),
      ('rp-2', ${SITE}::uuid, now(), ARRAY[${DEAD}, ${SELF}]),
      ('rp-3', ${SITE}::uuid, now(), ARRAY[${DEAD}])`.execute(owner);
});

afterAll(async () => {
  await liveBus?.end();
  await login?.destroy();
  await owner?.destroy();
  await database?.drop();
});

describe('a registration after a replica died', () => {
  it('keeps only live replicas and itself in the rows it adds itself to; the reap cleans the rest', async () => {
    const now = Date.now();
    // rp-0 and rp-1 register on SELF (a relation: r 1); rp-2 already lists SELF (a relation again);
    // rp-3 only heard from (no relation news).
    await recordRows(deliveryWriter(login), SELF, [
      { d: 'rp-0', sv: now * 1000, sc: '0123456789abcdef', sa: now, st: 'plain', sk: false, h: now, r: 1 },
      { d: 'rp-1', sv: now * 1000, sc: '0123456789abcdef', sa: now, st: 'plain', sk: false, h: now, r: 1 },
      { d: 'rp-2', h: now, r: 1 },
      { d: 'rp-3', h: now },
    ]);
    expect(await observedBy()).toEqual({
      'rp-0': [SELF],
      'rp-1': [LIVE, SELF],
      // Not a write that adds SELF: as 0011 wrote it; the reap's.
      'rp-2': [DEAD, SELF],
      'rp-3': [DEAD],
    });
    // The reap has only those two left.
    const { rows } = await sql<{ reaped: number }>`
      SELECT reaped FROM device_gateway.delivery_reap(${SELF}, NULL, 2000)`.execute(login);
    expect(rows[0]!.reaped).toBe(2);
    expect(await observedBy()).toEqual({
      'rp-0': [SELF],
      'rp-1': [LIVE, SELF],
      'rp-2': [SELF],
      'rp-3': [],
    });
  });
});

describe("a row outside the table's checks", () => {
  it('is skipped like any row outside the rules; the rest of the call is written', async () => {
    const now = Date.now();
    const before = await observedBy();
    await recordRows(deliveryWriter(login), SELF, [
      { d: 'rp-0', h: now + 1, st: 'pigeon' as 'plain', sv: now * 1000, sc: '0123456789abcdef', sa: now },
      { d: 'rp-1', av: now * 1000, ac: '0123456789abcdef', aa: now, at: 'carrier' as 'plain' },
      { d: 'rp-2', dv: now * 1000, ds: 'rumour', dc: '0123456789abcdef', da: now },
      { d: 'rp-3', h: now + 1 },
    ]);
    const { rows } = await sql<{ device_id: string; heard: boolean; sent_transport: string | null }>`
      SELECT device_id, heard_at >= to_timestamp(${now} / 1000.0) AS heard, sent_transport
      FROM device_gateway.device_delivery ORDER BY device_id`.execute(owner);
    expect(rows.map((r) => [r.device_id, r.heard])).toEqual([
      ['rp-0', false],
      ['rp-1', false],
      ['rp-2', false],
      ['rp-3', true],
    ]);
    expect(rows.every((r) => r.sent_transport !== 'pigeon')).toBe(true);
    expect(await observedBy()).toEqual(before);
  });
});
