// Issue 39 §2 (fifth item): a single creation of a 60,000-device rollout once answered 503. A creation is one
// statement writing a row per target, so past what the statement timeout (DB_STATEMENT_TIMEOUT_MS, 4 s) allows it
// fails (57014, 503). Migration 0018 makes it cheaper (no foreign-key check per target row, the sort in memory,
// the overlap check from the open rollouts) and bounds it: a selector matching more than
// GATEWAY_ROLLOUT_MAX_TARGETS devices is refused with 400 before any lock is taken or row written.
import { sql } from 'kysely';
import request from 'supertest';
import { loadGatewayConfig } from '../src/config.js';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';

const key = `Bearer ${API_KEYS[0]}`;
const SITE = 'c3900000-0000-4000-8000-0000000000a1';
const plan = { first_wave_percent: 1, success_share: 0.9, abort_share: 0.1, deadline_s: 3600 };

let gw: GatewayFixture;

beforeAll(async () => {
  gw = await startGateway({ env: { GATEWAY_ROLLOUT_MAX_TARGETS: '60000' } });
  // 60,001 devices of one model: one more than the bound.
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model, desired_settings)
    SELECT 'r39s-' || lpad(i::text, 6, '0'), ${SITE}::uuid, 'n' || i, 'r39-size', '{"reporting_interval_s": 60}'
    FROM generate_series(1, 60001) i`.execute(gw.owner);
  await sql`ANALYZE device_gateway.device_registry`.execute(gw.owner);
  await gw.app.service.reload();
}, 60_000);

afterAll(async () => {
  await gw.close();
});

const rollouts = async (): Promise<number> =>
  Number(
    (await sql<{ n: string }>`SELECT count(*) AS n FROM device_gateway.rollouts`.execute(gw.owner)).rows[0]!
      .n,
  );

describe('issue 39: a rollout creation is bounded', () => {
  it('a selector over GATEWAY_ROLLOUT_MAX_TARGETS devices is 400 naming the selector, and writes nothing', async () => {
    const before = await rollouts();
    const res = await request(gw.app.http)
      .post('/api/rollouts')
      .set('Authorization', key)
      .send({ selector: { models: ['r39-size'] }, settings: { reporting_interval_s: 300 }, plan });
    // Before: 201, a 60,001-target rollout (or 503 when its one statement outlived the statement timeout).
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({
      code: 'invalid_body',
      errors: [
        { path: '/selector', message: 'matches 60001 enabled devices; a rollout here targets at most 60000' },
      ],
    });
    expect(await rollouts()).toBe(before);
  });

  it('60,000 devices: created within the statement timeout (the figure is printed)', async () => {
    await sql`UPDATE device_gateway.device_registry SET enabled = false WHERE device_id = 'r39s-060001'`.execute(
      gw.owner,
    );
    const started = performance.now();
    const res = await request(gw.app.http)
      .post('/api/rollouts')
      .set('Authorization', key)
      .send({ selector: { models: ['r39-size'] }, settings: { reporting_interval_s: 300 }, plan });
    const ms = performance.now() - started;
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ targets: 60000 });
    process.stdout.write(`rollout creation, 60,000 targets: ${ms.toFixed(0)} ms\n`);
    // The default DB_STATEMENT_TIMEOUT_MS: the statement itself would have been cancelled past it.
    expect(ms).toBeLessThan(4000);
  }, 30_000);

  it('the bound follows the statement timeout: 30 µs a target of DB_STATEMENT_TIMEOUT_MS', () => {
    const config = (env: Record<string, string>) =>
      loadGatewayConfig({ DATABASE_URL: loginUrl(gw.database.url), GATEWAY_API_KEYS: API_KEYS[0]!, ...env })
        .rollouts.maxTargets;
    expect(config({})).toBe(100_000);
    expect(config({ DB_STATEMENT_TIMEOUT_MS: '1500' })).toBe(50_000);
    expect(
      config({
        GATEWAY_ROLLOUT_MAX_TARGETS: '200000',
        DB_STATEMENT_TIMEOUT_MS: '10000',
        DB_QUERY_TIMEOUT_MS: '11000',
      }),
    ).toBe(200_000);
  });
});
