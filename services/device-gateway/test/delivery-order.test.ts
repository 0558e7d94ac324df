// Every replica records the desired settings of every device (design §3.8), so after a reload all replicas
// upsert the same delivery rows at once. Batches that lock the same rows in different orders deadlock
// (40P01): PostgreSQL ends one after deadlock_timeout and the recorder must write its chunk again. Migration
// 0009 writes a batch's rows in device order, and has delivery_reap lock its rows in that order, so concurrent
// batches and reaps wait for each other instead. (The reap's test is a PoC of cold review 0008.)
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayMigrations } from '../src/db/migrations.js';

jest.setTimeout(120_000);

const SITE = 'd0d0d0d0-0000-4000-8000-000000000009';
const DEAD = 'deadbeefdeadbeef';
const DEVICES = Array.from({ length: 2000 }, (_, i) => `order-${String(i).padStart(5, '0')}`);

let database: TestDatabase;
let owner: Kysely<unknown>;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT d, ${SITE}::uuid, d, 'order' FROM unnest(${DEVICES}::text[]) d`.execute(owner);
});

afterAll(async () => {
  await owner?.destroy();
  await database?.drop();
});

/** A batch as a replica sends it: every device's desired version, in the order given. */
function batch(order: string[], version: number): string {
  return JSON.stringify(
    order.map((d) => ({ d, dv: version, ds: 'registry', dc: '0123456789abcdef', da: Date.now() })),
  );
}

describe('delivery_record under concurrent replicas', () => {
  it('two replicas writing the same devices in opposite orders never deadlock', async () => {
    // The owner's sessions: since 0029 the login may no longer call 0009's JSON function, which this tests.
    const a = new pg.Client({ connectionString: database.url });
    const b = new pg.Client({ connectionString: database.url });
    await a.connect();
    await b.connect();
    const forward = DEVICES;
    const backward = [...DEVICES].reverse();
    const errors: string[] = [];
    try {
      for (let round = 1; round <= 8; round++) {
        const version = Date.now() * 1000 + round;
        const results = await Promise.allSettled([
          a.query(`SELECT device_gateway.delivery_record('aaaaaaaaaaaaaaaa', $1::json)`, [
            batch(forward, version),
          ]),
          b.query(`SELECT device_gateway.delivery_record('bbbbbbbbbbbbbbbb', $1::json)`, [
            batch(backward, version + 1),
          ]),
        ]);
        for (const r of results)
          if (r.status === 'rejected') errors.push((r.reason as { code?: string }).code ?? '?');
      }
    } finally {
      await a.end();
      await b.end();
    }
    expect(errors).toEqual([]);
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM device_gateway.device_delivery WHERE site_id = ${SITE}::uuid`.execute(
      owner,
    );
    expect(rows[0]!.n).toBe(DEVICES.length);
  });

  // delivery_reap, run by every replica now and then, updates every row that lists a dead replica. Here the
  // rows lie in the table in no particular order (a hash of the id, as non-HOT updates leave them); before 0009
  // locked them in device order, a reap beside a batch over the same rows deadlocked in 8 of 8 rounds.
  it('a reap running beside a batch over the same devices never deadlocks', async () => {
    // The owner's sessions: since 0029 the login may no longer call 0009's JSON function, which this tests.
    const a = new pg.Client({ connectionString: database.url });
    const b = new pg.Client({ connectionString: database.url });
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
        const results = await Promise.allSettled([
          a.query(`SELECT device_gateway.delivery_record('aaaaaaaaaaaaaaaa', $1::json)`, [
            batch(DEVICES, Date.now() * 1000 + round),
          ]),
          b.query(`SELECT device_gateway.delivery_reap('bbbbbbbbbbbbbbbb')`),
        ]);
        for (const r of results)
          if (r.status === 'rejected') errors.push((r.reason as { code?: string }).code ?? '?');
      }
    } finally {
      await a.end();
      await b.end();
    }
    expect(errors).toEqual([]);
  });
});
