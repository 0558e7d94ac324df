import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import { createDb } from '@platform/service-kit';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';

describe('createDb session settings', () => {
  let database: TestDatabase;

  beforeAll(async () => {
    database = await createTestDatabase();
  });
  afterAll(async () => {
    await database.drop();
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
