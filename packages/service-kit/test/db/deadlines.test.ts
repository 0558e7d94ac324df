// Client-side deadlines of createDb: a statement past `queryTimeoutMs` fails, its connection is discarded
// (never handed to the next caller with the statement still in flight), and a server that stopped answering
// costs each caller one deadline, not as long as it stalls.
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import { createDb, mapDbError } from '@platform/service-kit';
import { createTestDatabase, startPostgres } from '@platform/testkit';
import type { PostgresServer, TestDatabase } from '@platform/testkit';

const quiet = { warn: () => undefined };

async function timed(promise: Promise<unknown>): Promise<{ error: unknown; ms: number }> {
  const t0 = performance.now();
  try {
    await promise;
  } catch (error) {
    return { error, ms: performance.now() - t0 };
  }
  throw new Error('expected a failure');
}

describe('a statement past its client-side deadline', () => {
  let database: TestDatabase;
  let db: Kysely<unknown>;

  beforeAll(async () => {
    database = await createTestDatabase();
    // One connection: a poisoned connection handed back to the pool would make the next statement wait.
    db = createDb<unknown>(database.url, { max: 1, queryTimeoutMs: 300, logger: quiet });
    await sql`CREATE TABLE t (v int)`.execute(db);
  });
  afterAll(async () => {
    await db.destroy();
    await database.drop();
  });

  it('fails at the deadline as 503, and the next statement does not wait behind it', async () => {
    const { error, ms } = await timed(sql`SELECT pg_sleep(3)`.execute(db));
    expect(ms).toBeGreaterThanOrEqual(250);
    expect(ms).toBeLessThan(1500);
    const mapped = mapDbError(error);
    expect(mapped).toMatchObject({
      code: 'backend_unavailable',
      status: 503,
    });
    expect(mapped.detail).toBe('The database did not answer in time; retry later.');

    const t0 = performance.now();
    await sql`SELECT 1`.execute(db);
    // The sleeping statement has 2.7 s left; a reused connection would have waited for it.
    expect(performance.now() - t0).toBeLessThan(1500);
  });

  it('ends a transaction at one deadline (no second wait for ROLLBACK) and commits nothing', async () => {
    const { error, ms } = await timed(
      db.transaction().execute(async (trx) => {
        await sql`INSERT INTO t VALUES (1)`.execute(trx);
        await sql`SELECT pg_sleep(3)`.execute(trx);
        await sql`INSERT INTO t VALUES (2)`.execute(trx);
      }),
    );
    expect(mapDbError(error).code).toBe('backend_unavailable');
    expect(ms).toBeLessThan(1500);
    // The connection was closed with the transaction open: the server rolls it back.
    const rows = await sql<{ n: number }>`SELECT count(*)::int AS n FROM t`.execute(db);
    expect(rows.rows[0]?.n).toBe(0);
  });
});

describe('a frozen server (its processes SIGSTOPped)', () => {
  let server: PostgresServer;
  let db: Kysely<unknown>;

  beforeAll(async () => {
    server = await startPostgres();
    db = createDb<unknown>(server.url, {
      max: 2,
      statementTimeoutMs: 200,
      queryTimeoutMs: 400,
      connectionTimeoutMs: 400,
      logger: quiet,
    });
    await sql`SELECT 1`.execute(db);
  });
  afterAll(async () => {
    await db.destroy();
    await server.destroy();
  });

  it('costs each caller one deadline while it stalls, and serves again after it resumes', async () => {
    await server.freeze();
    try {
      // The pool's open connection (statement deadline), then new ones (connect deadline), concurrently.
      const results = await Promise.all([1, 2, 3, 4].map(() => timed(sql`SELECT 1`.execute(db))));
      for (const { error, ms } of results) {
        expect(ms).toBeLessThan(1500);
        expect(mapDbError(error)).toMatchObject({ code: 'backend_unavailable', status: 503 });
      }
    } finally {
      await server.thaw();
    }
    // Same pool, no restart.
    const rows = await sql<{ one: number }>`SELECT 1 AS one`.execute(db);
    expect(rows.rows).toEqual([{ one: 1 }]);
  });
});
