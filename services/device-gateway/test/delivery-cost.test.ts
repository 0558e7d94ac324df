// Migration 0010 makes delivery_record cheaper for PostgreSQL without changing what it stores: the bounds
// computed once a call, the content check written as a length and a character class, and an update that would
// change nothing skipped. These check what could differ from 0009: the set of contents accepted, the rows a
// repeated batch writes (none), the row locks a skipped update still takes, and 0010's down migration.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayMigrations } from '../src/db/migrations.js';
import { deliveryCostMigration } from '../src/db/delivery-cost-migration.js';

jest.setTimeout(60_000);

const SITE = 'c0c0c0c0-0000-4000-8000-000000000010';
const A = 'aaaaaaaaaaaaaaaa';
const B = 'bbbbbbbbbbbbbbbb';

let database: TestDatabase;
let owner: Kysely<unknown>;
let login: pg.Client;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT 'cost-' || i, ${SITE}::uuid, 'cost ' || i, 'cost' FROM generate_series(0, 19) i`.execute(owner);
  // The owner's session: since 0029 the gateway's login may no longer call this superseded JSON function.
  login = new pg.Client({ connectionString: database.url });
  await login.connect();
});

afterAll(async () => {
  await login?.end();
  await owner?.destroy();
  await database?.drop();
});

const record = async (replica: string, rows: object[], client: pg.Client = login): Promise<number> => {
  const { rows: out } = await client.query<{ n: number }>(
    'SELECT device_gateway.delivery_record($1, $2::json) AS n',
    [replica, JSON.stringify(rows)],
  );
  return out[0]!.n;
};

const row = async (d: string) =>
  (
    await sql<{
      xmin: string;
      desired_content: string | null;
      acked_version: string | null;
      updated_at: Date;
    }>`SELECT xmin::text, desired_content, acked_version, updated_at FROM device_gateway.device_delivery
       WHERE device_id = ${d}`.execute(owner)
  ).rows[0];

describe('delivery_record after 0010', () => {
  it('accepts exactly 16 lowercase hex digits as a content, as 0009 did', async () => {
    const now = Date.now();
    const v = now * 1000;
    const cases: [string, boolean][] = [
      ['0123456789abcdef', true],
      ['ffffffffffffffff', true],
      ['0123456789ABCDEF', false],
      ['0123456789abcde', false],
      ['0123456789abcdef0', false],
      ['0123456789abcdeg', false],
      ['0123456789abcde\n', false],
      ['0123456789abcdé', false], // 16 bytes, 15 characters
      ['', false],
    ];
    for (const [i, [content, ok]] of cases.entries()) {
      const d = `cost-${i}`;
      const n = await record(A, [{ d, dv: v, ds: 'registry', dc: content, da: now }]);
      expect({ content, n }).toEqual({ content, n: ok ? 1 : 0 });
      expect((await row(d))?.desired_content ?? null).toBe(ok ? content : null);
    }
  });

  it('still bounds versions and times by the clock of the call', async () => {
    const now = Date.now();
    const d = 'cost-10';
    expect(
      await record(A, [
        { d, dv: (now + 2 * 86_400_000) * 1000, ds: 'registry', dc: '00000000000000aa', da: now },
      ]),
    ).toBe(0);
    expect(await record(A, [{ d, h: now + 2 * 86_400_000 }])).toBe(0);
    expect(await record(A, [{ d, h: 1_500_000_000_000 }])).toBe(0);
    expect(
      await record(A, [{ d, dv: now * 1000, ds: 'registry', dc: '00000000000000aa', da: now, h: now }]),
    ).toBe(1);
  });

  it('a batch written again changes no row (no new row version), and a newer part still moves it', async () => {
    const now = Date.now();
    const v = now * 1000;
    const d = 'cost-11';
    const full = {
      d,
      dv: v,
      ds: 'registry',
      dc: '00000000000000bb',
      da: now,
      sv: v,
      sc: '00000000000000bb',
      sa: now,
      st: 'plain',
      sk: true,
      av: v,
      ac: '00000000000000bb',
      aa: now,
      at: 'plain',
      h: now,
    };
    expect(await record(A, [full])).toBe(1);
    const first = await row(d);
    expect(await record(A, [full])).toBe(0);
    expect(
      await record(A, [{ d, av: v - 5, ac: '00000000000000cc', aa: now - 5, at: 'dtls', h: now - 5 }]),
    ).toBe(0);
    const again = await row(d);
    expect(again).toEqual(first);
    // The same acknowledgement through another replica is news (acked_by), as 0009 wrote it.
    expect(await record(B, [{ d, av: v, ac: '00000000000000bb', aa: now, at: 'plain' }])).toBe(1);
    // A later heard_at alone is news.
    expect(await record(A, [{ d, h: now + 1 }])).toBe(1);
    const later = await row(d);
    expect(later?.xmin).not.toBe(first?.xmin);
    expect(later?.acked_version).toBe(String(v));
  });

  it('a skipped update still locks the row until the batch commits', async () => {
    const now = Date.now();
    const d = 'cost-12';
    const rowA = { d, dv: now * 1000, ds: 'registry', dc: '00000000000000dd', da: now };
    expect(await record(A, [rowA])).toBe(1);
    const other = new pg.Client({ connectionString: database.url });
    await other.connect();
    try {
      await login.query('BEGIN');
      expect(await record(A, [rowA])).toBe(0); // nothing to change, but the row is locked
      await other.query(`SET lock_timeout = '200ms'`);
      const blocked = await other
        .query('SELECT device_gateway.delivery_record($1, $2::json)', [
          B,
          JSON.stringify([{ d, h: now + 7 }]),
        ])
        .then(
          () => 'written',
          (e: Error & { code?: string }) => e.code,
        );
      expect(blocked).toBe('55P03'); // lock_not_available
    } finally {
      await login.query('ROLLBACK');
      await other.end();
    }
  });

  it("0010's down migration restores 0009's function, and up applies again", async () => {
    const body = async (): Promise<string> =>
      (
        await sql<{ src: string }>`
          SELECT prosrc AS src FROM pg_catalog.pg_proc
          WHERE oid = 'device_gateway.delivery_record(text, json)'::regprocedure`.execute(owner)
      ).rows[0]!.src;
    const up = await body();
    await owner.transaction().execute(async (trx) => {
      await deliveryCostMigration.down!(trx);
    });
    const down = await body();
    expect(down).toContain("b.dc ~ '^[0-9a-f]{16}$'");
    expect(down).not.toContain('max_version');
    // 0009's function works as it is called.
    const now = Date.now();
    expect(
      await record(A, [{ d: 'cost-13', dv: now * 1000, ds: 'registry', dc: '00000000000000ee', da: now }]),
    ).toBe(1);
    const { rows } = await sql<{ config: string[] }>`
      SELECT proconfig AS config FROM pg_catalog.pg_proc
      WHERE oid = 'device_gateway.delivery_record(text, json)'::regprocedure`.execute(owner);
    expect(rows[0]!.config).toContain('search_path=pg_catalog, pg_temp');
    await owner.transaction().execute(async (trx) => {
      await deliveryCostMigration.up(trx);
    });
    expect(await body()).toBe(up);
  });
});
