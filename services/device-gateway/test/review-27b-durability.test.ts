// Cold review 27b of the staged rollouts: an operator's rollback answered 200 must survive a PostgreSQL crash.
// A real gateway process (dist/main.js, the pool exactly as run.ts builds it) on a private, durable PostgreSQL
// that is crashed (immediate shutdown: SIGQUIT to the postmaster) right after the answer.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { startReplica, type Replica } from './support/replicas.js';

jest.setTimeout(120_000);

const SITE = 'c27b0000-0000-4000-8000-0000000000d1';
let server: PostgresServer;
let database: TestDatabase;
let replica: Replica | undefined;

async function admin<T extends pg.QueryResultRow>(text: string): Promise<T[]> {
  const c = new pg.Client({ connectionString: server.url });
  await c.connect();
  try {
    return (await c.query<T>(text)).rows;
  } finally {
    await c.end();
  }
}

async function ownerQuery<T>(f: (db: Kysely<GatewayDatabase>) => Promise<T>): Promise<T> {
  const db = createDb<GatewayDatabase>(database.url, { max: 1, logger: { warn: () => undefined } });
  try {
    return await f(db);
  } finally {
    await db.destroy();
  }
}

beforeAll(async () => {
  // Durable (fsync, synchronous_commit on by default, as a production server). The WAL writer's round is made
  // long (10 s) so that the window in which an asynchronous commit is only in shared memory, normally up to
  // 3 x 200 ms, is wide enough to hit deterministically; nothing else about commit durability changes.
  server = await startPostgres({ durable: true });
  await admin(`ALTER SYSTEM SET wal_writer_delay = '10s'`);
  await admin(`ALTER SYSTEM SET wal_writer_flush_after = '1GB'`);
  await admin(`ALTER SYSTEM SET bgwriter_lru_maxpages = 0`);
  await admin(`SELECT pg_reload_conf()`);
  database = await createTestDatabase({ adminUrl: server.url, migrations: [gatewayMigrations] });
  await ownerQuery((db) =>
    db
      .insertInto('device_gateway.device_registry')
      .values({
        device_id: 'r27b-dur',
        site_id: SITE,
        name: 'r27b-dur',
        model: 'r27b',
        desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
      })
      .execute(),
  );
});

afterAll(async () => {
  await replica?.stop();
  await database?.drop().catch(() => undefined);
  await server?.destroy();
});

describe('review 27b: rollout writes are durable when answered', () => {
  // MEDIUM. run.ts opens the gateway's only pool with synchronous_commit=off ("the login's only writes are
  // replica-bus messages", run.ts:58-66, no longer true), and the rollout functions run on it: rollout_create,
  // rollout_control (pause/resume/cancel/rollback) and every driver step commit asynchronously. A crash or
  // failover of PostgreSQL within the WAL writer's window (up to 3 x wal_writer_delay) after the 200 loses the
  // rollback: the API said rolled_back, replicas that read it serve the previous settings, and after the restart
  // the database (and every replica that starts) says the rollout is still cancelled with its settings assigned.
  // A lost step whose nextval took a new batch of the assignment sequence also rewinds it below seqs replicas
  // have already read, so those replicas skip the reissued ones.
  it('a rollback answered 200 is still rolled back after a PostgreSQL crash', async () => {
    replica = await startReplica('dur', database.url, { GATEWAY_CLUSTER_BUS: 'false' });
    await replica.waitReady();
    const created = await replica.post('/api/rollouts', {
      selector: { device_ids: ['r27b-dur'] },
      settings: { reporting_interval_s: 777 },
      plan: { first_wave_count: 1, success_share: 0, abort_share: 1, deadline_s: 3600 },
    });
    expect(created.status).toBe(201);
    const id = created.body.rollout_id as string;
    const deadline = Date.now() + 15_000;
    for (;;) {
      const rows = await ownerQuery((db) =>
        sql<{ settings: unknown }>`SELECT settings FROM device_gateway.rollout_assignments
          WHERE device_id = 'r27b-dur'`.execute(db),
      );
      if (rows.rows.length > 0) break;
      if (Date.now() > deadline) throw new Error(`the driver assigned nothing:\n${replica.logs()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect((await replica.post(`/api/rollouts/${id}/cancel`)).status).toBe(200);
    // Everything so far on disk.
    await admin('CHECKPOINT');
    const rolledBack = await replica.post(`/api/rollouts/${id}/rollback`);
    expect(rolledBack.status).toBe(200);
    expect(rolledBack.body).toMatchObject({ state: 'rolled_back', devices_returned: 1 });
    // PostgreSQL crashes right after the answer (immediate shutdown: no checkpoint, no WAL written on the way).
    const pid = server.pid!;
    process.kill(pid, 'SIGQUIT');
    for (let i = 0; i < 100; i++) {
      try {
        process.kill(pid, 0);
      } catch {
        break;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    await server.stop();
    await server.start();
    const after = await ownerQuery(async (db) => ({
      state: (
        await sql<{ state: string }>`SELECT state FROM device_gateway.rollouts
          WHERE rollout_id = ${id}::uuid`.execute(db)
      ).rows[0]?.state,
      assignment: (
        await sql<{ settings: unknown }>`SELECT settings FROM device_gateway.rollout_assignments
          WHERE device_id = 'r27b-dur'`.execute(db)
      ).rows[0]?.settings,
    }));
    // On main: { state: 'cancelled', assignment: { reporting_interval_s: 777 } }: the answered rollback is gone.
    expect(after).toEqual({ state: 'rolled_back', assignment: null });
  });
});
