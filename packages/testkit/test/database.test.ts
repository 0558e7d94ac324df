import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import pg from 'pg';
import type { MigrationSet } from '@platform/service-kit';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';

async function query<R extends pg.QueryResultRow>(url: string, text: string): Promise<R[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<R>(text)).rows;
  } finally {
    await client.end();
  }
}

async function tableExists(url: string, table: string): Promise<boolean> {
  const rows = await query<{ t: string | null }>(url, `SELECT to_regclass('public.${table}')::text AS t`);
  return rows[0]?.t !== null;
}

describe('createTestDatabase', () => {
  const created: TestDatabase[] = [];
  afterAll(async () => {
    await Promise.all(created.map((d) => d.drop()));
  });

  it('gives every caller its own empty database', async () => {
    const [a, b] = await Promise.all([createTestDatabase(), createTestDatabase()]);
    created.push(a, b);
    expect(a.name).not.toBe(b.name);
    await query(a.url, 'CREATE TABLE only_in_a (id int)');
    expect(await tableExists(a.url, 'only_in_a')).toBe(true);
    expect(await tableExists(b.url, 'only_in_a')).toBe(false);
  });

  it('migrates a template once and clones it, even when workers ask at the same time', async () => {
    // A set never seen before (its table name is in the fingerprint), so this run builds it.
    const table = `testkit_probe_${randomBytes(4).toString('hex')}`;
    let runs = 0;
    const set: MigrationSet = {
      name: 'probe',
      table,
      migrations: {
        '0001_things': {
          up: async (db) => {
            runs++;
            await sql`CREATE TABLE things (id int PRIMARY KEY, label text NOT NULL)`.execute(db);
            await sql`INSERT INTO things VALUES (1, 'seeded')`.execute(db);
          },
        },
      },
    };
    const dbs = await Promise.all([1, 2, 3, 4].map(() => createTestDatabase({ migrations: [set] })));
    created.push(...dbs);
    expect(runs).toBe(1);
    const more = await createTestDatabase({ migrations: [set] });
    created.push(more);
    expect(runs).toBe(1);

    for (const d of [...dbs, more]) {
      expect(await query(d.url, 'SELECT label FROM things')).toEqual([{ label: 'seeded' }]);
    }
    // Clones are independent of each other.
    const [first, second] = dbs as [TestDatabase, TestDatabase];
    await query(first.url, "INSERT INTO things VALUES (2, 'only in first')");
    expect(await query(second.url, 'SELECT count(*)::int AS n FROM things')).toEqual([{ n: 1 }]);

    const templates = await query<{ datname: string; datallowconn: boolean }>(
      process.env['TEST_DATABASE_URL'] ?? '',
      `SELECT datname, datallowconn FROM pg_database WHERE datistemplate AND datname LIKE 'testkit_tpl_%'`,
    );
    const clonedFrom = templates.filter((t) => first.name.includes(t.datname.replace('testkit_tpl_', '')));
    expect(clonedFrom).toHaveLength(1);
    expect(clonedFrom[0]?.datallowconn).toBe(false);
  });

  it('drop() removes the database even while a connection is open', async () => {
    const d = await createTestDatabase();
    const client = new pg.Client({ connectionString: d.url });
    client.on('error', () => undefined);
    await client.connect();
    await d.drop();
    const rows = await query<{ n: number }>(
      process.env['TEST_DATABASE_URL'] ?? '',
      `SELECT count(*)::int AS n FROM pg_database WHERE datname = '${d.name}'`,
    );
    expect(rows).toEqual([{ n: 0 }]);
    await client.end().catch(() => undefined);
  });

  it('explains what is missing without TEST_DATABASE_URL', async () => {
    await expect(createTestDatabase({ adminUrl: '' })).rejects.toThrow(/TEST_DATABASE_URL/);
  });
});
