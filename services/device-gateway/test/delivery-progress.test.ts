// How far each replica's delivery record is written (migration 0014, design §3.8/§3.9), on PostgreSQL: what the
// login may report and read, and the rollout driver waiting for a record that is behind instead of judging a
// device failed whose acknowledgement is still on its way to the database.
import { Writable } from 'node:stream';
import { createDb, createLogger, sqlState } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { DeliveryRecorder, type DeliveryWriter } from '../src/delivery/recorder.js';
import type { DeliveryBatch } from '../src/delivery/row-builder.js';
import { deliveryWriter } from '../src/delivery/sql.js';
import { prepareSettings, settingsDocument } from '../src/domain/documents.js';
import { RolloutDriver } from '../src/rollout/driver.js';
import { loginUrl } from './support/gateway.js';

const SITE = 'c4000000-0000-4000-8000-000000000001';
const A = 'aaaaaaaaaaaaaaaa';
const B = 'bbbbbbbbbbbbbbbb';
const DRIVER = 'dddddddddddddddd';
const SETTINGS = { reporting_interval_s: 300 };

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let login: Kysely<GatewayDatabase>;
const sessions: pg.Client[] = [];

/** A session of the login named as bus_join names a replica's: that replica is alive. */
async function alive(replica: string): Promise<pg.Client> {
  const c = new pg.Client({
    connectionString: loginUrl(database.url),
    application_name: `device-gateway-bus ${replica}`,
  });
  await c.connect();
  sessions.push(c);
  return c;
}

async function lagMs(): Promise<number> {
  const { rows } = await sql<{ ms: number }>`SELECT device_gateway.delivery_lag_ms() AS ms`.execute(login);
  return rows[0]!.ms;
}

async function report(
  replica: unknown,
  lag: unknown,
  validMs: unknown = 60_000,
  db = login,
): Promise<unknown> {
  return sql`SELECT device_gateway.delivery_report(${replica}, ${lag}::integer, ${validMs}::integer)`
    .execute(db)
    .then(
      () => undefined,
      (e: unknown) => e,
    );
}

const until = async (what: () => Promise<boolean>, ms: number): Promise<boolean> => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await what()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return what();
};

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  const quiet = { warn: () => undefined };
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: quiet });
  login = createDb<GatewayDatabase>(loginUrl(database.url), { max: 4, logger: quiet });
  await owner
    .insertInto('device_gateway.device_registry')
    .values(
      ['dp-0', 'dp-1'].map((device_id) => ({
        device_id,
        site_id: SITE,
        name: device_id,
        model: 'hvac',
        desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
      })),
    )
    .execute();
});

afterAll(async () => {
  for (const c of sessions) await c.end();
  await login.destroy();
  await owner.destroy();
  await database.drop();
});

describe('migration 0014: delivery_report and delivery_lag_ms', () => {
  it('the login reports through the function only, with a replica id, a lag and a validity in range', async () => {
    const direct = await sql`INSERT INTO device_gateway.delivery_progress VALUES (${A}, now(), now(), now())`
      .execute(login)
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(sqlState(direct)).toBe('42501');
    for (const [replica, lag, valid] of [
      ['not-a-replica', 0, 5000],
      [A.toUpperCase(), 0, 5000],
      [null, 0, 5000],
      [A, -1, 5000],
      [A, 86_400_001, 5000],
      [A, null, 5000],
      [A, 0, 999],
      [A, 0, 600_001],
      [A, 0, null],
    ] as const)
      expect(sqlState(await report(replica, lag, valid))).toBe('22023');
    expect(await report(A, 0)).toBeUndefined();
  });

  it('counts the replicas whose bus session is up or whose last report stands, on the database clock', async () => {
    await sql`DELETE FROM device_gateway.delivery_progress`.execute(owner);
    expect(await lagMs()).toBe(0);
    // Not alive (no bus session: reconnecting, or GATEWAY_CLUSTER_BUS=false), but its report stands: waited for.
    await report(B, 600_000, 1000);
    expect(await lagMs()).toBeGreaterThanOrEqual(600_000);
    // Its report lapsed (a replica that died): no longer.
    expect(await until(async () => (await lagMs()) === 0, 3000)).toBe(true);
    await alive(A);
    // Alive, but never reported (the record off, or the previous release): not waited for either.
    expect(await lagMs()).toBe(0);
    await report(A, 5000, 1000);
    const behind = await lagMs();
    expect(behind).toBeGreaterThanOrEqual(5000);
    expect(behind).toBeLessThan(6000);
    // The report ages, and lapses, but A's bus session is up: what was unwritten then may still be.
    await new Promise((r) => setTimeout(r, 1200));
    expect(await lagMs()).toBeGreaterThanOrEqual(6200);
    await report(A, 0);
    expect(await lagMs()).toBeLessThan(1000);
    // B comes up: its lapsed report counts again.
    await alive(B);
    expect(await lagMs()).toBeGreaterThanOrEqual(600_000);
    // Both gone and lapsed... A's report still stands (60 s): A is waited for, B is not.
    for (const c of sessions.splice(0)) await c.end();
    expect(await until(async () => (await lagMs()) < 1000, 3000)).toBe(true);
    await report(A, 0, 1000);
    expect(await until(async () => (await lagMs()) === 0, 3000)).toBe(true);
  });

  it("a session holding a replica's row makes its report fail within a second, not wait; day-old rows go when a replica is added", async () => {
    await sql`DELETE FROM device_gateway.delivery_progress`.execute(owner);
    await report(A, 0);
    const holder = new pg.Client({ connectionString: loginUrl(database.url) });
    await holder.connect();
    try {
      await holder.query('BEGIN');
      await holder.query('SELECT device_gateway.delivery_report($1, 0, 60000)', [A]);
      const started = Date.now();
      expect(sqlState(await report(A, 0))).toBe('55P03');
      expect(Date.now() - started).toBeLessThan(5000);
    } finally {
      await holder.query('ROLLBACK');
      await holder.end();
    }
    await sql`INSERT INTO device_gateway.delivery_progress VALUES
      ('0000000000000001', now() - interval '2 days', now() - interval '2 days', now() - interval '2 days')`.execute(
      owner,
    );
    const left = async () =>
      (
        await sql<{
          replica: string;
        }>`SELECT replica FROM device_gateway.delivery_progress ORDER BY replica`.execute(owner)
      ).rows.map((r) => r.replica);
    // An update of a known replica's row does not scan for old rows.
    await report(A, 0);
    expect(await left()).toEqual(['0000000000000001', A]);
    await report(B, 0);
    expect(await left()).toEqual([A, B]);
  });

  it('the writer reads the lag once it holds its connection, not while it waits for one', async () => {
    const one = createDb<GatewayDatabase>(loginUrl(database.url), {
      max: 1,
      logger: { warn: () => undefined },
    });
    try {
      const busy = sql`SELECT pg_sleep(0.8)`.execute(one);
      await new Promise((r) => setTimeout(r, 100));
      const asked = Date.now();
      let readAt = 0;
      await deliveryWriter(one).report!(
        A,
        () => {
          readAt = Date.now();
          return 0;
        },
        5000,
      );
      await busy;
      // The pool's one connection was busy for about 0.7 s more: the lag was read after that.
      expect(readAt - asked).toBeGreaterThanOrEqual(500);
    } finally {
      await one.destroy();
    }
  });
});

/** deliveryWriter, with every write held until `open()`: a replica whose record is behind. */
class HeldWriter implements DeliveryWriter {
  private readonly inner: DeliveryWriter;
  private gate: Promise<void>;
  private release!: () => void;
  constructor(db: Kysely<GatewayDatabase>) {
    this.inner = deliveryWriter(db);
    this.gate = new Promise((r) => (this.release = r));
  }
  open(): void {
    this.release();
  }
  async record(replica: string, batch: DeliveryBatch): Promise<void> {
    await this.gate;
    return this.inner.record(replica, batch);
  }
  reap(self: string | null): Promise<number> {
    return this.inner.reap(self);
  }
  report(replica: string, lag: () => number, validMs: number): Promise<void> {
    return this.inner.report!(replica, lag, validMs);
  }
}

describe('the rollout driver and a record that is behind', () => {
  const logLines: string[] = [];
  const logger = createLogger({
    service: 'delivery-progress-test',
    level: 'info',
    stream: new Writable({
      write(chunk: Buffer, _enc, done) {
        logLines.push(chunk.toString('utf8'));
        done();
      },
    }),
  });
  const doc = (deviceId: string) =>
    settingsDocument(deviceId, Date.now() * 1000, 'rollout', SETTINGS, prepareSettings(SETTINGS));

  async function outcomes(id: string): Promise<(string | null)[]> {
    const { rows } = await sql<{ outcome: string | null }>`
      SELECT outcome FROM device_gateway.rollout_targets WHERE rollout_id = ${id}::uuid ORDER BY position`.execute(
      owner,
    );
    return rows.map((r) => r.outcome);
  }

  async function scenario(recordWaitMaxMs: number, bus = true) {
    await sql`DELETE FROM device_gateway.delivery_progress`.execute(owner);
    await sql`DELETE FROM device_gateway.device_delivery`.execute(owner);
    if (bus) await alive(A);
    // The driver's replica is up (its lease needs a live session named after it, 0019).
    await alive(DRIVER);
    const content = doc('dp-0').contentDigest;
    const { rows } = await sql<{ r: { rollout_id: string } }>`
      SELECT device_gateway.rollout_create(${JSON.stringify({ site_ids: [SITE] })}::jsonb,
        ${JSON.stringify(SETTINGS)}::jsonb, ${content},
        '{"first_wave_percent": 100, "growth_factor": 2, "success_share": 1, "abort_share": 1, "deadline_s": 1}'::jsonb,
        100000) AS r`.execute(login);
    const id = rows[0]!.r.rollout_id;
    const writer = new HeldWriter(login);
    const recorder = new DeliveryRecorder({
      replica: A,
      writer,
      logger,
      flushMs: 100,
      relationsOf: () => 1,
    });
    recorder.start();
    const driver = new RolloutDriver({
      db: login,
      replica: DRIVER,
      logger,
      leaseMs: 3000,
      stepMs: 100,
      maxAssign: 100,
      recordLagMs: 300,
      recordWaitMaxMs,
    });
    driver.start();
    // Both devices notified; both acknowledge on replica A at once, well within the deadline, and A's writes
    // are held: its record is behind.
    expect(
      await until(async () => (await outcomes(id)).length === 2 && driver.stats.assigned === 2, 5000),
    ).toBe(true);
    for (const d of ['dp-0', 'dp-1']) {
      recorder.registered(d, doc(d), 'plain');
      recorder.acknowledged(d, doc(d), 'plain');
    }
    const done = async () => {
      writer.open();
      await driver.stop();
      await recorder.stop();
      await sql`SELECT device_gateway.rollout_control(${id}::uuid, 'cancel')`
        .execute(login)
        .catch(() => undefined);
      for (const c of sessions.splice(0)) await c.end();
    };
    return { id, writer, done };
  }

  it.each([
    ['with its bus session up', true],
    ['with no bus session (reconnecting, or GATEWAY_CLUSTER_BUS=false) but reports that stand', false],
  ])(
    'waits past the deadline and its allowance while a replica %s is behind, then counts the acknowledgements',
    async (_name, bus) => {
      const { id, writer, done } = await scenario(60_000, bus);
      try {
        // Deadline 1 s plus the 0.3 s allowance, and more: without the replica's report the driver judged both
        // devices failed here (no acknowledgement in the record yet).
        await new Promise((r) => setTimeout(r, 2500));
        expect(await lagMs()).toBeGreaterThanOrEqual(2000);
        expect(await outcomes(id)).toEqual([null, null]);
        // The record catches up: both were acknowledged within their deadline.
        writer.open();
        expect(await until(async () => (await outcomes(id)).every((o) => o === 'acknowledged'), 5000)).toBe(
          true,
        );
      } finally {
        await done();
      }
    },
  );

  it('when it cannot tell how far behind the record is (no delivery_lag_ms: the code rolled before 0014) it waits the longest, and still steps', async () => {
    logLines.length = 0;
    await sql`ALTER FUNCTION device_gateway.delivery_lag_ms() RENAME TO delivery_lag_ms_gone`.execute(owner);
    try {
      // scenario() waits for both devices to be assigned: the steps go on.
      const { id, done } = await scenario(2000);
      try {
        // Past the deadline and the configured allowance (0.3 s), not past the longest wait (2 s): unjudged.
        await new Promise((r) => setTimeout(r, 1800));
        expect(await outcomes(id)).toEqual([null, null]);
        expect(await until(async () => (await outcomes(id)).every((o) => o === 'failed'), 5000)).toBe(true);
        const warned = logLines.filter((l) =>
          l.includes('reading how far the delivery record is behind failed'),
        );
        expect(warned).toHaveLength(1);
        expect(JSON.parse(warned[0]!)).toMatchObject({ level: 'warn', wait_max_ms: 2000 });
        expect(logLines.filter((l) => l.includes('step failed'))).toEqual([]);
      } finally {
        await done();
      }
    } finally {
      await sql`ALTER FUNCTION device_gateway.delivery_lag_ms_gone() RENAME TO delivery_lag_ms`.execute(
        owner,
      );
    }
  });

  it('past GATEWAY_ROLLOUT_RECORD_WAIT_MS it judges on the record as it stands, and says so', async () => {
    logLines.length = 0;
    const { id, done } = await scenario(1500);
    try {
      expect(await until(async () => (await outcomes(id)).every((o) => o === 'failed'), 6000)).toBe(true);
      const warned = logLines.filter((l) => l.includes('further behind than the wait allows'));
      expect(warned).toHaveLength(1);
      expect(JSON.parse(warned[0]!)).toMatchObject({ level: 'warn', wait_max_ms: 1500 });
    } finally {
      await done();
    }
  });
});
