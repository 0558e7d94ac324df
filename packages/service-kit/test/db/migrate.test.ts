import { randomBytes } from 'node:crypto';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import { createDb, migrateToLatest, MigrationError } from '@platform/service-kit';
import type { MigrationSet } from '@platform/service-kit';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';

const gatewaySet: MigrationSet = {
  name: 'gateway',
  table: 'gateway_migrations',
  migrations: {
    '0001_registry': {
      up: async (db) => {
        await sql`CREATE TABLE registry (device_id text PRIMARY KEY)`.execute(db);
      },
    },
  },
};

const enterpriseSet: MigrationSet = {
  name: 'enterprise',
  table: 'enterprise_migrations',
  migrations: {
    '0001_sites': {
      up: async (db) => {
        await sql`CREATE TABLE sites (id int PRIMARY KEY)`.execute(db);
      },
    },
    '0002_site_names': {
      up: async (db) => {
        await sql`ALTER TABLE sites ADD COLUMN name text`.execute(db);
      },
    },
  },
};

describe('migrateToLatest', () => {
  let database: TestDatabase;
  let db: Kysely<unknown>;

  beforeAll(async () => {
    database = await createTestDatabase();
    db = createDb<unknown>(database.url, { max: 2 });
  });
  afterAll(async () => {
    await db.destroy();
    await database.drop();
  });

  async function appliedNames(table: string): Promise<string[]> {
    const { rows } = await sql<{ name: string }>`SELECT name FROM ${sql.table(table)} ORDER BY name`.execute(
      db,
    );
    return rows.map((r) => r.name);
  }

  it('applies each set into its own migration table and is idempotent', async () => {
    const first = await migrateToLatest(db, [gatewaySet, enterpriseSet]);
    expect(first).toEqual([
      { set: 'gateway', migration: '0001_registry' },
      { set: 'enterprise', migration: '0001_sites' },
      { set: 'enterprise', migration: '0002_site_names' },
    ]);
    expect(await appliedNames('gateway_migrations')).toEqual(['0001_registry']);
    expect(await appliedNames('enterprise_migrations')).toEqual(['0001_sites', '0002_site_names']);

    const second = await migrateToLatest(db, [gatewaySet, enterpriseSet]);
    expect(second).toEqual([]);
    // Both lock tables exist, one per set.
    const { rows } = await sql<{ table_name: string }>`
      SELECT table_name FROM information_schema.tables
      WHERE table_name LIKE '%migrations_lock' ORDER BY table_name`.execute(db);
    expect(rows.map((r) => r.table_name)).toEqual(['enterprise_migrations_lock', 'gateway_migrations_lock']);
  });

  it('applies only what is new when a set grows', async () => {
    const grown: MigrationSet = {
      ...gatewaySet,
      migrations: {
        ...gatewaySet.migrations,
        '0002_registry_name': {
          up: async (tx) => {
            await sql`ALTER TABLE registry ADD COLUMN name text`.execute(tx);
          },
        },
      },
    };
    expect(await migrateToLatest(db, [grown, enterpriseSet])).toEqual([
      { set: 'gateway', migration: '0002_registry_name' },
    ]);
  });

  it('names the set and the migration that failed, and rolls the set back', async () => {
    const broken: MigrationSet = {
      name: 'broken',
      table: 'broken_migrations',
      migrations: {
        '0001_fine': {
          up: async (tx) => {
            await sql`CREATE TABLE broken_fine (id int)`.execute(tx);
          },
        },
        '0002_bad': {
          up: async (tx) => {
            await sql`ALTER TABLE does_not_exist ADD COLUMN x int`.execute(tx);
          },
        },
      },
    };
    const failure = migrateToLatest(db, [broken]);
    await expect(failure).rejects.toBeInstanceOf(MigrationError);
    await expect(migrateToLatest(db, [broken])).rejects.toThrow(
      /migration set "broken" failed at migration "0002_bad": relation "does_not_exist" does not exist/,
    );
    // Kysely runs a set's pending migrations in one transaction on PostgreSQL.
    const { rows } = await sql<{
      t: string | null;
    }>`SELECT to_regclass('public.broken_fine')::text AS t`.execute(db);
    expect(rows[0]?.t).toBeNull();
  });

  it('serialises concurrent runners: each migration runs once', async () => {
    let runs = 0;
    const counted: MigrationSet = {
      name: 'counted',
      table: 'counted_migrations',
      migrations: {
        '0001_once': {
          up: async (tx) => {
            runs++;
            await sql`CREATE TABLE counted (id int)`.execute(tx);
          },
        },
      },
    };
    const others = [1, 2, 3].map(() => createDb<unknown>(database.url, { max: 1 }));
    try {
      const results = await Promise.all(others.map((o) => migrateToLatest(o, [counted])));
      expect(runs).toBe(1);
      expect(results.flat()).toEqual([{ set: 'counted', migration: '0001_once' }]);
    } finally {
      await Promise.all(others.map((o) => o.destroy()));
    }
  });

  describe('the lock no other login can hold', () => {
    // Kysely's PostgreSQL adapter locks with this fixed advisory key (kysely/dist/esm/dialect/postgres).
    const KYSELY_ADVISORY_KEY = '3853314791062309107';
    const stranger = `migrate_stranger_${randomBytes(4).toString('hex')}`;
    const password = randomBytes(12).toString('hex');
    let client: pg.Client;

    beforeAll(async () => {
      await sql.raw(`CREATE ROLE ${stranger} LOGIN PASSWORD '${password}'`).execute(db);
      const url = new URL(database.url);
      url.username = stranger;
      url.password = password;
      client = new pg.Client({ connectionString: url.toString() });
      await client.connect();
    });
    afterAll(async () => {
      await client.end();
      await sql.raw(`DROP ROLE ${stranger}`).execute(db);
    });

    const held: MigrationSet = {
      name: 'held',
      table: 'held_migrations',
      migrations: {
        '0001_held': {
          up: async (tx) => {
            await sql`CREATE TABLE held (id int)`.execute(tx);
          },
        },
      },
    };

    it('migrates while a stranger holds the advisory key Kysely would wait for', async () => {
      await client.query(`SELECT pg_advisory_lock(${KYSELY_ADVISORY_KEY})`);
      let timer: NodeJS.Timeout | undefined;
      const stalled = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('migrateToLatest waited for the stranger')), 15_000);
      });
      try {
        await expect(Promise.race([migrateToLatest(db, [held]), stalled])).resolves.toEqual([
          { set: 'held', migration: '0001_held' },
        ]);
      } finally {
        clearTimeout(timer);
        await client.query(`SELECT pg_advisory_unlock(${KYSELY_ADVISORY_KEY})`);
      }
    });

    it('leaves the stranger no way to lock or read the lock table', async () => {
      await migrateToLatest(db, [held]);
      await client.query('BEGIN');
      await expect(client.query('LOCK TABLE held_migrations_lock IN ACCESS SHARE MODE')).rejects.toThrow(
        /permission denied/,
      );
      await client.query('ROLLBACK');
      await expect(client.query('SELECT * FROM held_migrations_lock')).rejects.toThrow(/permission denied/);
    });

    it('refuses a handle whose dialect would lock with the advisory key', async () => {
      const plain = new Kysely<unknown>({
        dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: database.url, max: 1 }) }),
      });
      try {
        await expect(migrateToLatest(plain, [held])).rejects.toThrow(/createDb/);
      } finally {
        await plain.destroy();
      }
    });
  });
});
