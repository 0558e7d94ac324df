// Review of migration 0009 (delivery_record in device order). On main (01c9d5b) it fails.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';

jest.setTimeout(120_000);

const SITE = 'd0d0d0d0-0000-4000-8000-000000000008';
const DEVICES = Array.from({ length: 2000 }, (_, i) => `reap-${String(i).padStart(5, '0')}`);
const DEAD = 'deadbeefdeadbeef';

let database: TestDatabase;
let owner: Kysely<unknown>;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT d, ${SITE}::uuid, d, 'reap' FROM unnest(${DEVICES}::text[]) d`.execute(owner);
});

afterAll(async () => {
  await owner?.destroy();
  await database?.drop();
});

describe('review 0009: delivery_record and delivery_reap lock rows in one order', () => {
  // LOW. 0009 orders delivery_record's row locks by device id, but delivery_reap ("run by every replica now and
  // then", delivery-migration.ts:168-186) still updates every row that lists a dead replica in whatever order
  // its scan finds them (physical order). A reap running while a replica records a batch over the same rows
  // (every replica records every device, design §3.8) locks them in another order, and the pair deadlocks
  // (40P01, one of them ends after deadlock_timeout) exactly as 0009 set out to prevent. Here the rows lie in
  // the table in no particular order (a hash of the id: the order a recorder wrote them in before 0009, or
  // wherever non-HOT updates moved them).
  it('a reap running beside a batch over the same devices never deadlocks', async () => {
    const a = new pg.Client({ connectionString: gatewayLoginUrl(database.url) });
    const b = new pg.Client({ connectionString: gatewayLoginUrl(database.url) });
    await a.connect();
    await b.connect();
    const errors: string[] = [];
    try {
      for (let round = 1; round <= 8; round++) {
        await sql`DELETE FROM device_gateway.device_delivery`.execute(owner);
        await sql`VACUUM device_gateway.device_delivery`.execute(owner).catch(() => undefined);
        await sql`
          INSERT INTO device_gateway.device_delivery (device_id, site_id, desired_at, observed_by)
          SELECT d, ${SITE}::uuid, now(), ARRAY[${DEAD}::text]
          FROM unnest(${DEVICES}::text[]) d ORDER BY md5(d || ${round})`.execute(owner);
        const version = Date.now() * 1000 + round;
        const rows = JSON.stringify(
          DEVICES.map((d) => ({ d, dv: version, ds: 'registry', dc: '0123456789abcdef', da: Date.now() })),
        );
        const results = await Promise.allSettled([
          a.query(`SELECT device_gateway.delivery_record('aaaaaaaaaaaaaaaa', $1::json)`, [rows]),
          b.query(`SELECT device_gateway.delivery_reap('bbbbbbbbbbbbbbbb')`),
        ]);
        for (const r of results)
          if (r.status === 'rejected') errors.push((r.reason as { code?: string }).code ?? '?');
      }
    } finally {
      await a.end();
      await b.end();
    }
    // On main: several 40P01 (deadlock detected).
    expect(errors).toEqual([]);
  });
});
