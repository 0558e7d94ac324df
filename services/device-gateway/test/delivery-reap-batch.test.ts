// The reap of a dead replica (design §3.8) updates every row that names it: after a replica with a fleet
// observed dies, every row. 0009's delivery_reap did it in one statement, its row locks held until the end, so a
// chunk of the recorder's that touched a row the reap had passed waited for the whole reap (the registration
// lag of the second child of `BENCH_ONLY=delivery`: a writer on Lock/transactionid behind the reap; docs/
// benchmarks.md, seventh pass). 0013 reaps in batches of REAP_BATCH rows, each call its own transaction, so
// such a chunk waits for one batch at most.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { deliveryWriter, REAP_BATCH } from '../src/delivery/sql.js';

jest.setTimeout(120_000);

const SITE = 'd0d0d0d0-0000-4000-8000-000000000013';
const DEAD = 'deadbeefdeadbeef';
const N = 3 * REAP_BATCH;
const DEVICES = Array.from({ length: N }, (_, i) => `reap-${String(i).padStart(6, '0')}`);
/** The row another transaction holds while the reap runs: in the reap's third batch. */
const HELD = DEVICES[2 * REAP_BATCH + REAP_BATCH / 2]!;
/** A row of the reap's first batch, as a writer's chunk would touch it meanwhile. */
const PASSED = DEVICES[10]!;

let database: TestDatabase;
let owner: Kysely<unknown>;
let login: Kysely<GatewayDatabase>;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
  login = createDb<GatewayDatabase>(gatewayLoginUrl(database.url), { max: 2 });
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT d, ${SITE}::uuid, d, 'reap' FROM unnest(${DEVICES}::text[]) d`.execute(owner);
  // In no particular order on the heap, as non-HOT updates leave them.
  await sql`
    INSERT INTO device_gateway.device_delivery (device_id, site_id, desired_at, observed_by)
    SELECT d, ${SITE}::uuid, now(), ARRAY[${DEAD}::text]
    FROM unnest(${DEVICES}::text[]) d ORDER BY md5(d)`.execute(owner);
});

afterAll(async () => {
  await login?.destroy();
  await owner?.destroy();
  await database?.drop();
});

async function client(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: database.url });
  await c.connect();
  return c;
}

describe('delivery_reap in batches (0013)', () => {
  it('a row the reap has passed is not locked while the reap waits further on', async () => {
    const holder = await client();
    const probe = await client();
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT 1 FROM device_gateway.device_delivery WHERE device_id = $1 FOR UPDATE', [
        HELD,
      ]);
      const reaping = deliveryWriter(login).reap('aaaaaaaaaaaaaaaa');
      // Until the reap waits for the held row.
      const deadline = Date.now() + 30_000;
      for (;;) {
        const { rows } = await probe.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE query LIKE '%delivery_reap(%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`,
        );
        if (rows[0]!.n > 0) break;
        if (Date.now() > deadline) throw new Error('the reap never waited for the held row');
        await new Promise((r) => setTimeout(r, 20));
      }
      // A writer's chunk over a row the reap has passed: not held for the rest of the reap.
      await probe.query(`SET lock_timeout = '1s'`);
      await probe.query('BEGIN');
      const locked = await probe
        .query('SELECT 1 FROM device_gateway.device_delivery WHERE device_id = $1 FOR UPDATE', [PASSED])
        .then(
          () => 'locked',
          (err: { code?: string }) => err.code ?? 'error',
        );
      await probe.query('ROLLBACK');
      expect(locked).toBe('locked');
      // The batches before the held row are committed: visible to anyone.
      const { rows } = await probe.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM device_gateway.device_delivery
         WHERE device_id < $1 AND $2 = ANY (observed_by)`,
        [DEVICES[2 * REAP_BATCH]!, DEAD],
      );
      expect(rows[0]!.n).toBe(0);
      await holder.query('COMMIT');
      await expect(reaping).resolves.toBe(N);
    } finally {
      await holder.end();
      await probe.end();
    }
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM device_gateway.device_delivery WHERE ${DEAD} = ANY (observed_by)`.execute(
      owner,
    );
    expect(rows[0]!.n).toBe(0);
  });

  it('reaps what names a dead replica and keeps the living, over several calls', async () => {
    await sql`
      UPDATE device_gateway.device_delivery
      SET observed_by = CASE WHEN right(device_id, 1) IN ('0', '5') THEN ARRAY['aaaaaaaaaaaaaaaa', ${DEAD}]
                             WHEN right(device_id, 1) = '7' THEN ARRAY['aaaaaaaaaaaaaaaa']
                             ELSE ARRAY[]::text[] END`.execute(owner);
    // Every fifth device names the dead replica: 1,200 rows, fewer than a batch; then all of them, three batches.
    await expect(deliveryWriter(login).reap('aaaaaaaaaaaaaaaa')).resolves.toBe(N / 5);
    const after = await sql<{ observed: string; n: number }>`
      SELECT array_to_string(observed_by, ',') AS observed, count(*)::int AS n FROM device_gateway.device_delivery
      GROUP BY 1 ORDER BY 1`.execute(owner);
    expect(after.rows).toEqual([
      { observed: '', n: N - N / 5 - N / 10 },
      { observed: 'aaaaaaaaaaaaaaaa', n: N / 5 + N / 10 },
    ]);
    await sql`UPDATE device_gateway.device_delivery SET observed_by = ARRAY[${DEAD}::text]`.execute(owner);
    await expect(deliveryWriter(login).reap(null)).resolves.toBe(N);
    await expect(deliveryWriter(login).reap(null)).resolves.toBe(0);
  });
});
