// A private PostgreSQL for the review-39 cases: the whole platform's migrations (enterprise + gateway) or the
// gateway's alone, the devices seeded, logins of no standing (a stranger with CONNECT only, a nobody with no
// grant at all), and the NOTIFY queue filler that pins the cluster's one queue full.
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll } from '@jest/globals';
import { enterpriseMigrations, seedEnterprise } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayMigrations } from '../../src/db/migrations.js';
import { seedDevices } from '../../src/db/seed.js';
import type { GatewayDatabase } from '../../src/db/tables.js';
import { startReplica, type Replica } from './replicas.js';

export const STRANGER_PASSWORD = 'stranger-password';
export const NOBODY_PASSWORD = 'nobody-password';

export interface PlatformDatabaseOptions {
  /** The gateway's migrations only, not the enterprise's as well. */
  gatewayOnly?: boolean;
  /** Restart the server with max_notify_queue_pages set to this, so the queue fills in a second. */
  notifyQueuePages?: number;
  /** Restart the server with these connection slots (`max_connections`, `reserved_connections`). */
  connections?: { max: number; reserved: number };
  /** Create `stranger`: a login granted CONNECT on the database and nothing else. */
  stranger?: boolean;
  /** Create `nobody`: a login without any grant (not even CONNECT on the database). */
  nobody?: boolean;
}

export interface PlatformDatabase {
  server: PostgresServer;
  database: TestDatabase;
  /** The database's owner, two connections. */
  owner: Kysely<GatewayDatabase>;
  /** The stranger's login name (created only when asked for). */
  stranger: string;
  /** The nobody's login name (created only when asked for). */
  nobody: string;
  /** A client of `user` on `base` (the database by default), ended by `close`. */
  connectAs(user: string, password: string, base?: string): Promise<pg.Client>;
  /** Ends the clients, the owner's pool, drops the database and stops the server. */
  close(): Promise<void>;
}

export async function startPlatformDatabase(
  options: PlatformDatabaseOptions = {},
): Promise<PlatformDatabase> {
  const server = await startPostgres(
    options.connections === undefined
      ? {}
      : {
          settings: {
            max_connections: options.connections.max,
            reserved_connections: options.connections.reserved,
          },
        },
  );
  const stranger = `stranger_${randomBytes(4).toString('hex')}`;
  const nobody = `nobody_${randomBytes(4).toString('hex')}`;
  if (options.notifyQueuePages !== undefined) {
    const admin = new pg.Client({ connectionString: server.url });
    await admin.connect();
    await admin.query(`ALTER SYSTEM SET max_notify_queue_pages = ${options.notifyQueuePages}`);
    await admin.end();
    await server.stop();
    await server.start();
  }
  const database = await createTestDatabase({
    migrations: options.gatewayOnly ? [gatewayMigrations] : [enterpriseMigrations, gatewayMigrations],
    adminUrl: server.url,
  });
  const owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  // The portal's sites first: on a platform database a device at a site it does not know is refused at load.
  if (!options.gatewayOnly) await seedEnterprise(owner);
  await seedDevices(owner);
  if (options.stranger)
    await sql
      .raw(
        `CREATE ROLE ${stranger} LOGIN PASSWORD '${STRANGER_PASSWORD}';
         GRANT CONNECT ON DATABASE "${database.name}" TO ${stranger};`,
      )
      .execute(owner);
  if (options.nobody)
    await sql.raw(`CREATE ROLE ${nobody} LOGIN PASSWORD '${NOBODY_PASSWORD}'`).execute(owner);

  const clients: pg.Client[] = [];
  return {
    server,
    database,
    owner,
    stranger,
    nobody,
    async connectAs(user, password, base = database.url) {
      const url = new URL(base);
      url.username = user;
      url.password = password;
      const c = new pg.Client({ connectionString: url.toString() });
      await c.connect();
      clients.push(c);
      return c;
    },
    async close() {
      for (const c of clients) await c.end().catch(() => undefined);
      await owner.destroy();
      await database.drop().catch(() => undefined);
      await server.stop();
    },
  };
}

/**
 * Pins the cluster's NOTIFY queue full from the `postgres` database, which keeps PostgreSQL's default (CONNECT
 * for PUBLIC), as `nobody`: one session LISTENs and stays in a transaction, so the queue's tail stays where it
 * is, and another fills it with 8 kB notifications until PostgreSQL refuses one. Returns the pinning session
 * (ROLLBACK releases it) and the refusal's message.
 */
export async function pinNotifyQueue(
  platform: PlatformDatabase,
): Promise<{ pin: pg.Client; stopped: string }> {
  const pin = await platform.connectAs(platform.nobody, NOBODY_PASSWORD, platform.server.url);
  await pin.query('LISTEN anything');
  await pin.query('BEGIN');
  await pin.query('SELECT 1');
  const filler = await platform.connectAs(platform.nobody, NOBODY_PASSWORD, platform.server.url);
  let sent = 0;
  let stopped = '';
  while (sent < 100_000) {
    try {
      await filler.query(`SELECT pg_notify('x', repeat('a', 7990)) FROM generate_series(1, 10)`);
      sent += 10;
    } catch (err) {
      stopped = (err as Error).message;
      break;
    }
  }
  console.log(`filler: ${sent} notifications of 8 kB, then: ${stopped}`);
  return { pin, stopped };
}

/**
 * The review-39 files' common ground, as jest hooks: before all, a platform database with the stranger and nobody
 * logins and replicas A and B of `env` on it, both ready; after all, both stopped and the database gone. The
 * returned object's fields are set once `beforeAll` has run.
 */
export function platformWithTwoReplicas(env: Record<string, string>): {
  platform: PlatformDatabase;
  owner: Kysely<GatewayDatabase>;
  replicas: Replica[];
} {
  const fixture = { replicas: [] } as unknown as ReturnType<typeof platformWithTwoReplicas>;
  beforeAll(async () => {
    fixture.platform = await startPlatformDatabase({ stranger: true, nobody: true });
    fixture.owner = fixture.platform.owner;
    fixture.replicas = await Promise.all([
      startReplica('A', fixture.platform.database.url, env),
      startReplica('B', fixture.platform.database.url, env),
    ]);
    await Promise.all(fixture.replicas.map((r) => r.waitReady()));
  });
  afterAll(async () => {
    for (const r of fixture.replicas) await r.stop();
    await (fixture.platform as PlatformDatabase | undefined)?.close();
  });
  return fixture;
}
