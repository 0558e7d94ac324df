// `npm run bench:rollout-handover`: what the driver's check for sites handed to another company (migration 0043,
// design §3.9) costs a tick, next to the tick's step, standalone on the embedded PostgreSQL the tests use. BENCH_DEVICES
// devices (100,000 by default, the default GATEWAY_ROLLOUT_MAX_TARGETS) over 20 portal sites: one active rollout of
// every device of 19 sites, and BENCH_SMALL rollouts of one device each at the 20th; the driver's login holds the
// lease under its session name. Prints the median and p90 (ms) over BENCH_ROUNDS ticks of `rollout_pause_handed_over`
// (nothing to pause: the common case), of `rollout_step` (assigning at most BENCH_STEP_MAX devices, and judging), their
// ratio, and of reading the big rollout's sites from its targets (`rollout_sites_of`, what the check does not do);
// then the check once a site has been handed over (the one that pauses). Not a pass/fail test.
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { sql } from 'kysely';
import { demoCompanies, enterpriseMigrations, seedEnterprise } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';
import { gatewayLoginUrl, gatewayMigrations, type GatewayDatabase } from '@platform/device-gateway';
import { createTestDatabase, startPostgres } from '@platform/testkit';
import { percentile } from './lib/wait.js';

const N = Number(process.env.BENCH_DEVICES ?? 100_000);
const SMALL = Number(process.env.BENCH_SMALL ?? 100);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 20);
const STEP_MAX = Number(process.env.BENCH_STEP_MAX ?? 5000);
const SITES = 20;
const REPLICA = '0123456789abcdef';
const site = (i: number): string => `5e000000-0000-4000-8000-${String(9000 + i).padStart(12, '0')}`;
const plan = {
  first_wave_percent: 10,
  growth_factor: 3,
  success_share: 0.5,
  abort_share: 0.9,
  deadline_s: 600,
};

/** Median and p90 of `xs` (ms), one decimal. */
function figures(xs: number[]): { median: number; p90: number; text: string } {
  const sorted = [...xs].sort((a, b) => a - b);
  const median = percentile(sorted, 50);
  const p90 = percentile(sorted, 90);
  return { median, p90, text: `median ${median.toFixed(1)} ms  p90 ${p90.toFixed(1)} ms` };
}

const server = await startPostgres();
try {
  const database = await createTestDatabase({
    migrations: [enterpriseMigrations, gatewayMigrations],
    adminUrl: server.url,
  });
  const owner = createDb<GatewayDatabase>(database.url, { max: 1 });
  const driver = new pg.Client({
    connectionString: gatewayLoginUrl(database.url),
    application_name: `device-gateway-driver ${REPLICA}`,
  });
  try {
    await seedEnterprise(owner);
    const ids = Array.from({ length: SITES }, (_, i) => site(i));
    await sql`INSERT INTO enterprise.sites (id, company_id, name, timezone)
      SELECT s, ${demoCompanies.acme.id}::uuid, 'Bench site ' || s, 'UTC' FROM unnest(${ids}::uuid[]) s`.execute(
      owner,
    );
    await sql`INSERT INTO device_gateway.device_registry (device_id, site_id, name, model, desired_settings)
      SELECT 'bench-' || lpad(i::text, 6, '0'), (${ids}::uuid[])[1 + i % ${SITES}], 'Bench device ' || i, 'bench',
             '{"reporting_interval_s": 60}'::jsonb
      FROM generate_series(0, ${N - 1}) AS i`.execute(owner);
    await sql`ANALYZE`.execute(owner);
    await driver.connect();
    const lease = await driver.query<{ ok: boolean }>(
      `SELECT device_gateway.rollout_lease($1, 60000) AS ok`,
      [REPLICA],
    );
    if (lease.rows[0]?.ok !== true) throw new Error('the bench driver did not get the lease');
    const create = async (selector: Record<string, unknown>): Promise<string> => {
      const { rows } = await driver.query<{ r: { rollout_id?: string } }>(
        `SELECT device_gateway.rollout_create($1::jsonb, $2::jsonb, $3, $4::jsonb, $5::integer) AS r`,
        [
          JSON.stringify(selector),
          '{"reporting_interval_s": 61}',
          '0000000000b00043',
          JSON.stringify(plan),
          N,
        ],
      );
      const id = rows[0]?.r.rollout_id;
      if (id === undefined) throw new Error(`a rollout was not created: ${JSON.stringify(rows[0]?.r)}`);
      return id;
    };
    const big = await create({ site_ids: ids.slice(0, SITES - 1) });
    // Device i is at site i % SITES: the last site's devices are SITES - 1, 2 * SITES - 1, …
    for (let k = 0; k < SMALL; k++)
      await create({
        site_ids: [ids[SITES - 1]],
        device_ids: [`bench-${String(k * SITES + SITES - 1).padStart(6, '0')}`],
      });

    const timed = async (text: string, params: unknown[]): Promise<[number, unknown]> => {
      const t0 = performance.now();
      const { rows } = await driver.query<{ r: unknown }>(text, params);
      return [performance.now() - t0, rows[0]?.r];
    };
    const check: number[] = [];
    const step: number[] = [];
    const sites: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      const [c, paused] = await timed(`SELECT device_gateway.rollout_pause_handed_over($1)::text[] AS r`, [
        REPLICA,
      ]);
      if ((paused as string[]).length !== 0)
        throw new Error('the check paused a rollout nothing was handed over for');
      check.push(c);
      step.push(
        (await timed(`SELECT device_gateway.rollout_step($1, $2, true, 0) AS r`, [REPLICA, STEP_MAX]))[0],
      );
      const t0 = performance.now();
      await sql`SELECT device_gateway.rollout_sites_of(${big}::uuid)`.execute(owner);
      sites.push(performance.now() - t0);
    }
    await sql`UPDATE enterprise.sites SET company_id = ${demoCompanies.borealis.id}::uuid
      WHERE id = ${ids[0]}::uuid`.execute(owner);
    const [pausing, paused] = await timed(
      `SELECT device_gateway.rollout_pause_handed_over($1)::text[] AS r`,
      [REPLICA],
    );
    if (JSON.stringify(paused) !== JSON.stringify([big]))
      throw new Error('the handed-over rollout was not paused');
    const c = figures(check);
    const s = figures(step);
    process.stdout.write(
      `${SMALL + 1} active rollouts: one of ${Math.ceil(((SITES - 1) * N) / SITES)} targets over ${SITES - 1} ` +
        `sites, ${SMALL} of one device; ${ROUNDS} ticks, a step assigning at most ${STEP_MAX}:\n` +
        `  handover check (0043)            ${c.text}\n` +
        `  step                             ${s.text}\n` +
        `  check / step                     ${(c.median / s.median).toFixed(3)} (medians)\n` +
        `  sites of the big rollout's targets (rollout_sites_of, not read by the check)  ${figures(sites).text}\n` +
        `  the check that pauses it after a handover: ${pausing.toFixed(1)} ms\n`,
    );
  } finally {
    await driver.end().catch(() => undefined);
    await owner.destroy();
    await database.drop();
  }
} finally {
  await server.destroy();
}
