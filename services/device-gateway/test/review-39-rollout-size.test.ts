// Issue 39 §2 (fifth item): a single creation of a 60,000-device rollout once answered 503. A creation is one
// statement writing a row per target; it ran on the gateway's pool, whose statement timeout (DB_STATEMENT_TIMEOUT_MS,
// 4 s) it outlived on a loaded machine (57014, 503). Now it runs on a connection of its own with a timeout of its own
// (GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS, 30 s), migration 0018 makes it cheaper (no foreign-key check per target row,
// the sort in memory, the overlap check from the open rollouts), and a selector matching more than
// GATEWAY_ROLLOUT_MAX_TARGETS devices is refused with 400 before any lock is taken or row written. The gateway here
// is built as run.ts builds it: its pool has the configured statement timeout, shortened to 300 ms.
import { createDb, createLogger } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import { buildApp, type GatewayApp } from '../src/app.js';
import { ApiKeys, loadGatewayConfig } from '../src/config.js';
import { gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { API_KEYS, loginUrl } from './support/gateway.js';

const key = `Bearer ${API_KEYS[0]}`;
const SITE = 'c3900000-0000-4000-8000-0000000000a1';
const plan = { first_wave_percent: 1, success_share: 0.9, abort_share: 0.1, deadline_s: 3600 };

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let pool: Kysely<GatewayDatabase>;
let app: GatewayApp;

const configFor = (env: Record<string, string>) =>
  loadGatewayConfig({
    DATABASE_URL: loginUrl(database.url),
    GATEWAY_API_KEYS: API_KEYS.join(','),
    GATEWAY_CLUSTER_BUS: 'false',
    ...env,
  });

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  // 60,001 devices of one model: one more than the bound.
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model, desired_settings)
    SELECT 'r39s-' || lpad(i::text, 6, '0'), ${SITE}::uuid, 'n' || i, 'r39-size', '{"reporting_interval_s": 60}'
    FROM generate_series(1, 60001) i`.execute(owner);
  await sql`ANALYZE device_gateway.device_registry`.execute(owner);
  const config = configFor({ GATEWAY_ROLLOUT_MAX_TARGETS: '60000', DB_STATEMENT_TIMEOUT_MS: '300' });
  const logger = createLogger({ service: 'review-39-rollout-size', level: 'error' });
  pool = createDb<GatewayDatabase>(config.database.url, {
    max: config.database.poolMax,
    statementTimeoutMs: config.database.statementTimeoutMs,
    queryTimeoutMs: config.database.queryTimeoutMs,
    connectionTimeoutMs: config.database.connectionTimeoutMs,
    logger,
  });
  const keys = new ApiKeys(API_KEYS);
  app = buildApp({ config, logger, db: pool, apiKeys: () => keys });
}, 60_000);

afterAll(async () => {
  await app.rollouts.driver.stop();
  app.rollouts.assignments.stop();
  await pool.destroy();
  await owner.destroy();
  await database.drop();
});

const rollouts = async (): Promise<number> =>
  Number(
    (await sql<{ n: string }>`SELECT count(*) AS n FROM device_gateway.rollouts`.execute(owner)).rows[0]!.n,
  );

describe('issue 39: a rollout creation is bounded', () => {
  it('a selector over GATEWAY_ROLLOUT_MAX_TARGETS devices is 400 naming the selector, and writes nothing', async () => {
    const before = await rollouts();
    const res = await request(app.http)
      .post('/api/rollouts')
      .set('Authorization', key)
      .send({ selector: { models: ['r39-size'] }, settings: { reporting_interval_s: 300 }, plan });
    // Before: a 60,001-target rollout, or (as here, its statement longer than the pool's timeout) 503.
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({
      code: 'invalid_body',
      errors: [
        { path: '/selector', message: 'matches 60001 enabled devices; a rollout here targets at most 60000' },
      ],
    });
    expect(await rollouts()).toBe(before);
  });

  it('60,000 devices are created though the pool statement timeout is far shorter (the time is printed)', async () => {
    await sql`UPDATE device_gateway.device_registry SET enabled = false WHERE device_id = 'r39s-060001'`.execute(
      owner,
    );
    const started = performance.now();
    const res = await request(app.http)
      .post('/api/rollouts')
      .set('Authorization', key)
      .send({ selector: { models: ['r39-size'] }, settings: { reporting_interval_s: 300 }, plan });
    const ms = performance.now() - started;
    process.stdout.write(`rollout creation, 60,000 targets: ${ms.toFixed(0)} ms\n`);
    // Before: 503 backend_unavailable (the statement cancelled at the pool's timeout).
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ targets: 60000 });
  }, 60_000);

  it('the bound follows the creation timeout: 100 µs a target of GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS', () => {
    const bound = (env: Record<string, string>) => configFor(env).rollouts.maxTargets;
    expect(bound({})).toBe(100_000);
    expect(bound({ GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS: '5000' })).toBe(50_000);
    expect(bound({ GATEWAY_ROLLOUT_MAX_TARGETS: '200000', GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS: '60000' })).toBe(
      200_000,
    );
  });
});
