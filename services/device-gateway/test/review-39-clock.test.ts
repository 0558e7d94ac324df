// Issue 39 §2 (second item): rollout verdicts and the delivery record trusted each replica's wall clock. A replica
// ten minutes ahead recorded its acknowledgements ten minutes late, so every device it served was judged failed,
// and its versions (ten minutes ahead too) outranked a correct replica's later acknowledgements of those devices,
// which were dropped. Now each replica dates its events on the database's clock as it measures it
// (delivery/db-clock.ts), the record stores no time after the call that reports it and lets a part from a clock in
// step replace one from a clock ahead (migration 0020), and a replica out of step is not ready, with a log line.
// The replica here has its clock injected ten minutes ahead.
import { Writable } from 'node:stream';
import { jest } from '@jest/globals';
import { createDb, createLogger } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import request from 'supertest';
import { buildApp, type GatewayApp } from '../src/app.js';
import { ApiKeys, loadGatewayConfig } from '../src/config.js';
import { gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { DatabaseClock } from '../src/delivery/db-clock.js';
import { DeliveryRecorder } from '../src/delivery/recorder.js';
import { deliveryWriter } from '../src/delivery/sql.js';
import { prepareSettings, settingsDocument } from '../src/domain/documents.js';
import { VersionClock } from '../src/domain/version-clock.js';
import { recordRows } from './support/delivery.js';
import { API_KEYS, loginUrl } from './support/gateway.js';

const SITE = 'c3900000-0000-4000-8000-0000000000c1';
const FAST = 'fa57fa57fa57fa57';
const RIGHT = 'c0ffeec0ffeec0ff';
const DRIVER = 'd1d1d1d1d1d1d1d1';
const AHEAD_MS = 600_000;
const SETTINGS = { reporting_interval_s: 300 };

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let login: Kysely<GatewayDatabase>;
const logLines: string[] = [];
const logger = createLogger({
  service: 'review-39-clock',
  level: 'info',
  stream: new Writable({
    write(chunk: Buffer, _enc, cb) {
      logLines.push(chunk.toString());
      cb();
    },
  }),
});

const fastWall = (): number => Date.now() + AHEAD_MS;
const doc = (deviceId: string, versionMs: number) =>
  settingsDocument(deviceId, versionMs * 1000, 'rollout', SETTINGS, prepareSettings(SETTINGS));

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  const quiet = { warn: () => undefined };
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: quiet });
  login = createDb<GatewayDatabase>(loginUrl(database.url), { max: 4, logger: quiet });
  await owner
    .insertInto('device_gateway.device_registry')
    .values(
      ['clk-1', 'clk-2', 'clk-3'].map((device_id) => ({
        device_id,
        site_id: SITE,
        name: device_id,
        model: 'clk',
        desired_settings: JSON.stringify({ reporting_interval_s: 60 }),
      })),
    )
    .execute();
});

afterAll(async () => {
  await login.destroy();
  await owner.destroy();
  await database.drop();
});

async function row(deviceId: string) {
  const { rows } = await sql<{
    acked_by: string | null;
    acked_version: string | null;
    acked_at: Date | null;
    heard_at: Date | null;
    db_now: Date;
  }>`SELECT acked_by, acked_version, acked_at, heard_at, clock_timestamp() AS db_now
     FROM device_gateway.device_delivery WHERE device_id = ${deviceId}`.execute(owner);
  return rows[0];
}

const until = async (what: () => Promise<boolean>, ms: number): Promise<boolean> => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await what()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return what();
};

describe('issue 39: the delivery record on the database clock (migration 0020)', () => {
  it('a replica ahead that does not correct its times: no time after the report, and a replica in step replaces its part', async () => {
    const writer = deliveryWriter(login);
    const ahead = fastWall();
    await recordRows(writer, FAST, [
      {
        d: 'clk-1',
        av: ahead * 1000,
        ac: doc('clk-1', ahead).contentDigest,
        aa: ahead,
        at: 'plain',
        h: ahead,
        r: 1,
      },
    ]);
    const first = (await row('clk-1'))!;
    // Before: acked_at and heard_at ten minutes ahead of the database.
    expect(first.acked_at!.getTime()).toBeLessThanOrEqual(first.db_now.getTime());
    expect(first.heard_at!.getTime()).toBeLessThanOrEqual(first.db_now.getTime());
    const now = Date.now();
    await recordRows(writer, RIGHT, [
      { d: 'clk-1', av: now * 1000, ac: doc('clk-1', now).contentDigest, aa: now, at: 'plain', h: now, r: 1 },
    ]);
    const second = (await row('clk-1'))!;
    // Before: FAST's acknowledgement stayed (its version is higher) and RIGHT's was dropped.
    expect(second.acked_by).toBe(RIGHT);
    expect(Number(second.acked_version)).toBe(now * 1000);
  });
});

describe('issue 39: verdicts when a replica is ten minutes ahead', () => {
  it('its acknowledgement in time counts, and a replica in step is recorded after it', async () => {
    const driverSession = new pg.Client({
      connectionString: loginUrl(database.url),
      application_name: `device-gateway-bus ${DRIVER}`,
    });
    await driverSession.connect();
    const right = new DeliveryRecorder({
      replica: RIGHT,
      writer: deliveryWriter(login),
      logger,
      flushMs: 100,
      relationsOf: () => 1,
    });
    right.start();
    const step = async (): Promise<unknown> =>
      (
        await driverSession.query<{ r: unknown }>(
          'SELECT device_gateway.rollout_step($1, 100, true, 0) AS r',
          [DRIVER],
        )
      ).rows[0]!.r;
    try {
      const content = doc('clk-2', Date.now()).contentDigest;
      const { rows } = await sql<{ r: { rollout_id: string } }>`
        SELECT device_gateway.rollout_create('{"device_ids": ["clk-2"]}'::jsonb, ${JSON.stringify(SETTINGS)}::jsonb,
          ${content}, '{"first_wave_count": 1, "growth_factor": 2, "success_share": 1, "abort_share": 1,
          "deadline_s": 2}'::jsonb, 100) AS r`.execute(login);
      const id = rows[0]!.r.rollout_id;
      await driverSession.query('SELECT device_gateway.rollout_lease($1, 10000)', [DRIVER]);
      expect(await step()).toMatchObject({ driver: true, assigned: 1 });
      // The device is served by a replica whose clock is ten minutes ahead (this process's Date.now, for as long
      // as that replica runs): it acknowledges at once, a document versioned on that clock.
      const real = Date.now.bind(Date);
      const ahead = jest.spyOn(Date, 'now').mockImplementation(() => real() + AHEAD_MS);
      try {
        const clock = new DatabaseClock({ db: login, logger, maxSkewMs: 2000 });
        // Its record is behind: its writes wait 2.5 s, past the deadline, so the time the record stores is the
        // time the replica saw the acknowledgement, not the time it wrote it.
        let open = (): void => undefined;
        const gate = new Promise<void>((r) => (open = r));
        const base = deliveryWriter(login);
        const fast = new DeliveryRecorder({
          replica: FAST,
          writer: {
            ...base,
            record: async (replica, batch) => {
              await gate;
              await base.record(replica, batch);
            },
          },
          logger,
          flushMs: 100,
          relationsOf: () => 1,
          clock,
        });
        fast.start();
        await clock.check();
        expect(clock.measurement!.offsetMs).toBeLessThan(-AHEAD_MS + 1000);
        const fastDoc = doc('clk-2', Date.now());
        fast.registered('clk-2', fastDoc, 'plain');
        fast.acknowledged('clk-2', fastDoc, 'plain');
        await new Promise((r) => setTimeout(r, 2500));
        open();
        // Its clean stop writes what is left.
        await fast.stop();
      } finally {
        ahead.mockRestore();
      }
      expect((await row('clk-2'))?.acked_by).toBe(FAST);
      // Past the deadline (2 s), with no allowance for the record's lag: judged.
      await step();
      const { rows: outcome } = await sql<{ outcome: string | null; outcome_reason: string | null }>`
        SELECT outcome, outcome_reason FROM device_gateway.rollout_targets WHERE rollout_id = ${id}::uuid`.execute(
        owner,
      );
      // Before: failed / not_acknowledged (acknowledged "ten minutes after" its notification; with the record's
      // times only kept from running ahead of the database, 0020 alone, it is dated when it was written: late).
      expect(outcome[0]).toEqual({ outcome: 'acknowledged', outcome_reason: 'acknowledged' });
      // The device moves to the replica in step and acknowledges there: recorded (before: dropped, as FAST's
      // version was ten minutes ahead).
      const rightDoc = doc('clk-2', Date.now());
      right.registered('clk-2', rightDoc, 'plain');
      right.acknowledged('clk-2', rightDoc, 'plain');
      expect(await until(async () => (await row('clk-2'))?.acked_by === RIGHT, 5000)).toBe(true);
    } finally {
      await right.stop();
      await driverSession.end();
    }
  });
});

describe('issue 39: a replica whose clock is out of step is not ready', () => {
  async function replica(wallClock?: () => number): Promise<GatewayApp> {
    const config = loadGatewayConfig({
      DATABASE_URL: loginUrl(database.url),
      GATEWAY_API_KEYS: API_KEYS.join(','),
      GATEWAY_CLUSTER_BUS: 'false',
    });
    const keys = new ApiKeys(API_KEYS);
    const app = buildApp({
      config,
      logger,
      db: login,
      apiKeys: () => keys,
      clock: new VersionClock(() => (wallClock ?? Date.now)() * 1000),
      ...(wallClock === undefined ? {} : { wallClock }),
    });
    await app.coap.listen(0, '127.0.0.1');
    await app.service.reload();
    return app;
  }

  it('ten minutes ahead: /api/ready is 503 saying so, with a log line; in step: ready', async () => {
    logLines.length = 0;
    const fast = await replica(fastWall);
    const right = await replica();
    try {
      fast.delivery!.start();
      right.delivery!.start();
      await fast.dbClock!.check();
      await right.dbClock!.check();
      const res = await request(fast.http).get('/api/ready');
      // Before: 200 (readiness knew nothing of the clock).
      expect(res.status).toBe(503);
      expect(res.body.detail).toMatch(
        /clock (599\d{3}|600\d{3}) ms ahead of the database's \(GATEWAY_CLOCK_MAX_SKEW_MS allows 2000 ms\)/,
      );
      const said = logLines.filter((l) => l.includes('clock out of step'));
      expect(said).toHaveLength(1);
      expect(JSON.parse(said[0]!)).toMatchObject({ level: 'error', max_skew_ms: 2000 });
      expect(JSON.parse(said[0]!).ahead_ms).toBeGreaterThan(AHEAD_MS - 1000);
      expect((await request(right.http).get('/api/ready')).status).toBe(200);
    } finally {
      await fast.delivery!.stop();
      await right.delivery!.stop();
      await fast.coap.close(100);
      await right.coap.close(100);
    }
  });
});
