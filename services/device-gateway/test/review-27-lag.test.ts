// Review of issue 27: a real gateway process with its default delivery record interval (1 s), a real UDP
// observer that acknowledges every confirmable notification at once, a rollout with the smallest deadline the
// API accepts (1 s). Fails on the reviewed branch (7877106).
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import { gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { RawCoapClient, json, observe0, pathOptions } from './support/coap-client.js';
import { startReplica, type Replica } from './support/replicas.js';

jest.setTimeout(60_000);

const SITE = 'c2700000-0000-4000-8000-0000000000aa';
let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let gw: Replica;
let client: RawCoapClient;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await owner
    .insertInto('device_gateway.device_registry')
    .values({
      device_id: 'r27-lag',
      site_id: SITE,
      name: 'lag',
      model: 'r27',
      desired_settings: '{"reporting_interval_s":60}',
    })
    .execute();
  // The delivery record's interval, a documented setting (1 s by default: then this fails about one run in six).
  gw = await startReplica('lag', database.url, { GATEWAY_DELIVERY_FLUSH_MS: '3000' });
  await gw.waitReady();
  client = await RawCoapClient.connect(gw.coapPort);
});

afterAll(async () => {
  await client?.close();
  await gw?.stop();
  await owner?.destroy();
  await database?.drop();
});

// LOW/MEDIUM. Outcomes are read from the delivery record, which lags the device by up to two flush intervals
// plus a write (design §3.8: 2 s by default; a device whose settings just changed is held back one interval on
// purpose), but a device is judged failed as soon as notified_at + deadline_s has passed, and an outcome is
// final. With deadline_s = 1 (accepted) a device that acknowledged within milliseconds is "failed
// (no_relation)" (its relation was not recorded yet either), the wave trips the abort criterion and pauses. The repository's own rollouts test
// avoids this only by running replicas with GATEWAY_DELIVERY_FLUSH_MS=200; at the default 1 s it is a race (one run
// in six here), with GATEWAY_DELIVERY_FLUSH_MS=3000 (allowed up to 60000) it always happens.
it('a device that acknowledges at once is not judged failed because the record had not caught up', async () => {
  client.send({
    confirmable: true,
    code: 'GET',
    token: randomBytes(4),
    options: [observe0, ...pathOptions('/devices/r27-lag/settings')],
  });
  await client.waitFor((p) => p.code === '2.05', 10_000);
  // Adapted with the fix (rollout-fixes): a deadline shorter than the record's lag bound (2 x 3000 ms + 1 s
  // here) is refused, so the PoC uses the shortest one accepted; the rule it checks is unchanged.
  const short = await gw.post('/api/rollouts', {
    selector: { device_ids: ['r27-lag'] },
    settings: { reporting_interval_s: 700 },
    plan: { first_wave_count: 1, success_share: 1, abort_share: 1, deadline_s: 6 },
  });
  expect(short.status).toBe(400);
  expect(short.body).toMatchObject({ code: 'invalid_body', errors: [{ path: '/plan/deadline_s' }] });
  const created = await gw.post('/api/rollouts', {
    selector: { device_ids: ['r27-lag'] },
    settings: { reporting_interval_s: 700 },
    plan: { first_wave_count: 1, success_share: 1, abort_share: 1, deadline_s: 7 },
  });
  expect(created.status).toBe(201);
  const id = created.body.rollout_id as string;
  // The device gets the rollout's settings and acknowledges them (autoAck) well inside the deadline.
  const got = await client.waitFor(
    (p) => p.code === '2.05' && (json(p).settings as Record<string, unknown>).reporting_interval_s === 700,
    5000,
  );
  const { rows: n } = await sql<{ notified_ms: number }>`
    SELECT (extract(epoch FROM notified_at) * 1000)::float8 AS notified_ms FROM device_gateway.rollout_targets
    WHERE rollout_id = ${id}::uuid`.execute(owner);
  expect(got.at + performance.timeOrigin - n[0]!.notified_ms).toBeLessThan(1000);
  let row: { state: string; outcome: string | null; outcome_reason: string | null } | undefined;
  for (let i = 0; i < 200; i++) {
    const { rows } = await sql<{ state: string; outcome: string | null; outcome_reason: string | null }>`
      SELECT r.state, t.outcome, t.outcome_reason FROM device_gateway.rollouts r
      JOIN device_gateway.rollout_targets t USING (rollout_id) WHERE r.rollout_id = ${id}::uuid`.execute(
      owner,
    );
    row = rows[0];
    if (row?.state !== 'active') break;
    await new Promise((r) => setTimeout(r, 100));
  }
  // On the branch: { state: 'paused', outcome: 'failed', outcome_reason: 'no_relation' } (aborted), for a device
  // that observed and acknowledged within milliseconds.
  expect(row).toEqual({ state: 'completed', outcome: 'acknowledged', outcome_reason: 'acknowledged' });
});

// Added with the fix of finding 4 (rollout-fixes): a CHECK of rollout_create that the request schema does not
// express (here the selector's stored size, 64 KiB) is the caller's input: 400 problem+json, and the process's
// log holds neither the statement nor the row (the selector it refused).
it('a CHECK violation in rollout_create is a 400 and leaves no SQL or row in the log', async () => {
  const before = gw.logs().length;
  // 10,000 device ids of three characters: 60 KB as the request's compact JSON (under the 64 KiB body limit),
  // 70 KB as jsonb prints it (", " between items): over the selector's 64 KiB bound as stored.
  const abc = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
  const three = (i: number): string =>
    abc[i % 62]! + abc[Math.floor(i / 62) % 62]! + abc[Math.floor(i / 3844)]!;
  const ids = ['r27-lag', ...Array.from({ length: 9999 }, (_, i) => three(i))];
  const res = await gw.post('/api/rollouts', {
    selector: { device_ids: ids },
    settings: { reporting_interval_s: 61 },
    plan: { first_wave_count: 1, success_share: 1, abort_share: 1, deadline_s: 60 },
  });
  expect(res.status).toBe(400);
  expect(res.body).toMatchObject({ code: 'invalid_body', errors: [{ path: '/selector' }] });
  await new Promise((r) => setTimeout(r, 200));
  const logged = gw.logs().slice(before);
  expect(logged).toMatch(/invalid_body|400/);
  expect(logged).not.toMatch(/INSERT|rollout_create|device_gateway\.|"BAA"|"CAA"|\bat \w+ \(/);
});
