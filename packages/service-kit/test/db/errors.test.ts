import { jest } from '@jest/globals';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import pg from 'pg';
import {
  createDb,
  DomainError,
  isConnectionError,
  isRetryableTransactionError,
  mapDbError,
} from '@platform/service-kit';
import { createTestDatabase, freePort, startPostgres } from '@platform/testkit';
import type { PostgresServer, TestDatabase } from '@platform/testkit';

function caught(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => {
      throw new Error('expected a failure');
    },
    (err: unknown) => err,
  );
}

describe('database errors on a shared test database', () => {
  let database: TestDatabase;
  let db: Kysely<unknown>;

  beforeAll(async () => {
    database = await createTestDatabase();
    db = createDb<unknown>(database.url, { max: 3 });
    await sql`CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL)`.execute(db);
  });
  afterAll(async () => {
    await db.destroy();
    await database.drop();
  });

  it('maps a unique violation to conflict (409) without leaking SQL or constraint names', async () => {
    await sql`INSERT INTO items VALUES (1, 1)`.execute(db);
    const err = await caught(sql`INSERT INTO items VALUES (1, 2)`.execute(db));
    expect(isConnectionError(err)).toBe(false);
    const mapped = mapDbError(err);
    expect(mapped).toBeInstanceOf(DomainError);
    expect(mapped.code).toBe('conflict');
    expect(mapped.status).toBe(409);
    expect(mapped.detail).not.toMatch(/items|pkey|INSERT/);
  });

  it('maps a statement timeout (57014) to backend_unavailable with Retry-After', async () => {
    const slow = createDb<unknown>(database.url, { max: 1, statementTimeoutMs: 50 });
    try {
      const err = await caught(sql`SELECT pg_sleep(2)`.execute(slow));
      const mapped = mapDbError(err);
      expect(mapped.code).toBe('backend_unavailable');
      expect(mapped.status).toBe(503);
      expect(mapped.retryAfterS).toBeUndefined(); // the HTTP edge sends the default (design §2)
    } finally {
      await slow.destroy();
    }
  });

  it('recognises a serialization failure as retryable and maps it to concurrent_change', async () => {
    // Write skew between two SERIALIZABLE transactions: the second commit fails with 40001.
    const a = new pg.Client({ connectionString: database.url });
    const b = new pg.Client({ connectionString: database.url });
    await Promise.all([a.connect(), b.connect()]);
    try {
      await a.query('BEGIN ISOLATION LEVEL SERIALIZABLE');
      await b.query('BEGIN ISOLATION LEVEL SERIALIZABLE');
      await a.query('SELECT sum(v) FROM items');
      await b.query('SELECT sum(v) FROM items');
      await a.query('INSERT INTO items VALUES (10, 1)');
      await b.query('INSERT INTO items VALUES (11, 1)');
      await a.query('COMMIT');
      const err = await caught(b.query('COMMIT'));
      expect(isRetryableTransactionError(err)).toBe(true);
      expect(mapDbError(err).code).toBe('concurrent_change');
    } finally {
      await Promise.all([a.end(), b.end()]);
    }
  });

  it('rethrows errors that are bugs, and passes DomainErrors through', async () => {
    const err = await caught(sql`SELEC 1`.execute(db));
    expect(() => mapDbError(err)).toThrow(err as Error);
    expect(() => mapDbError(new Error('plain'))).toThrow('plain');
    const domain = new DomainError('not_found');
    expect(mapDbError(domain)).toBe(domain);
  });

  it('survives a server-side kill of an idle pooled connection and logs it', async () => {
    const warn = jest.fn();
    const pooled = createDb<unknown>(database.url, { max: 1, logger: { warn } });
    try {
      const { rows } = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(pooled);
      await sql`SELECT pg_terminate_backend(${rows[0]?.pid})`.execute(db);
      // The idle client's 'error' arrives asynchronously; without a listener the process would crash.
      for (let i = 0; i < 50 && warn.mock.calls.length === 0; i++)
        await new Promise((r) => setTimeout(r, 20));
      expect(warn).toHaveBeenCalledTimes(1);
      expect(warn.mock.calls[0]?.[1]).toMatchObject({ code: '57P01' });
      const again = await sql<{ one: number }>`SELECT 1 AS one`.execute(pooled);
      expect(again.rows).toEqual([{ one: 1 }]);
    } finally {
      await pooled.destroy();
    }
  });
});

describe('database errors when the server goes away', () => {
  let server: PostgresServer;

  beforeAll(async () => {
    server = await startPostgres();
  });
  afterAll(async () => {
    await server.destroy();
  });

  it('refused connections are connection errors mapped to 503 with Retry-After: 5', async () => {
    const nobody = await freePort('tcp');
    const db = createDb<unknown>(`postgres://postgres:postgres@127.0.0.1:${nobody}/postgres`, { max: 1 });
    try {
      const err = await caught(sql`SELECT 1`.execute(db));
      expect(isConnectionError(err)).toBe(true);
      const mapped = mapDbError(err);
      expect(mapped.code).toBe('backend_unavailable');
      expect(mapped.retryAfterS).toBeUndefined(); // the HTTP edge sends the default (design §2)
    } finally {
      await db.destroy();
    }
  });

  it('an outage fails queries with backend_unavailable, and the pool recovers after restart', async () => {
    const warn = jest.fn();
    const db = createDb<unknown>(server.url, { max: 2, logger: { warn } });
    try {
      expect((await sql<{ one: number }>`SELECT 1 AS one`.execute(db)).rows).toEqual([{ one: 1 }]);
      await server.stop();
      const err = await caught(sql`SELECT 1`.execute(db));
      expect(isConnectionError(err)).toBe(true);
      expect(mapDbError(err).status).toBe(503);
      await server.start();
      expect((await sql<{ one: number }>`SELECT 1 AS one`.execute(db)).rows).toEqual([{ one: 1 }]);
    } finally {
      await db.destroy();
    }
  });
});
