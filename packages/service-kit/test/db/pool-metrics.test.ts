import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import { createDb, createMetrics } from '@platform/service-kit';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';

describe('createDb: pool metrics and session settings', () => {
  let database: TestDatabase;

  beforeAll(async () => {
    database = await createTestDatabase();
  });
  afterAll(async () => {
    await database.drop();
  });

  it('reports open, idle and waiting connections per pool at scrape time', async () => {
    const registry = createMetrics({ service: 'pool-test', defaultMetrics: false });
    const db = createDb<unknown>(database.url, { max: 1, applicationName: 'orders', metrics: registry });
    try {
      const hold = db.transaction().execute(async (trx) => {
        await sql`SELECT pg_sleep(0.3)`.execute(trx);
      });
      // A second query while the only connection is held must wait for it.
      const queued = sql`SELECT 1`.execute(db);
      await new Promise((r) => setTimeout(r, 100));
      const busy = await registry.getSingleMetricAsString('db_pool_connections');
      expect(busy).toContain('db_pool_connections{pool="orders",state="total",service="pool-test"} 1');
      expect(busy).toContain('db_pool_connections{pool="orders",state="idle",service="pool-test"} 0');
      expect(busy).toContain('db_pool_connections{pool="orders",state="waiting",service="pool-test"} 1');
      await Promise.all([hold, queued]);
      const idle = await registry.getSingleMetricAsString('db_pool_connections');
      expect(idle).toContain('db_pool_connections{pool="orders",state="idle",service="pool-test"} 1');
      expect(idle).toContain('db_pool_connections{pool="orders",state="waiting",service="pool-test"} 0');
    } finally {
      await db.destroy();
    }
  });

  const synchronousCommit = async (db: Kysely<unknown>): Promise<string | undefined> => {
    const { rows } = await sql<{
      value: string;
    }>`SELECT current_setting('synchronous_commit') AS value`.execute(db);
    return rows[0]?.value;
  };

  // Both values are asked for: whatever the test server's own default is, one of them differs from it.
  it.each(['on', 'off'] as const)(
    'synchronousCommit %s applies to every connection of the pool',
    async (value) => {
      const db = createDb<unknown>(database.url, { max: 2, synchronousCommit: value });
      try {
        // Two connections at once: the setting is per connection (a startup parameter), not per query.
        const seen = await Promise.all([
          db.transaction().execute((trx) => synchronousCommit(trx)),
          db.transaction().execute((trx) => synchronousCommit(trx)),
        ]);
        expect(seen).toEqual([value, value]);
      } finally {
        await db.destroy();
      }
    },
  );
});
