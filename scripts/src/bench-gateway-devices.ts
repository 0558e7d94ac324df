// Part of `npm run bench:gateway` (design §3.8): on-call's reads at fleet size, on the database the fan-out runs
// left behind (every bench device has a delivery record). Two real gateway processes (dist/main.js); the fleet
// list's page p99 per filter, and the device view's p99 (which waits for the other replica's live part over the
// bus), both through replica B, one request at a time (the latency of one on-call read, no queueing).
import { loadavg } from 'node:os';
import type { GatewayDatabase } from '@platform/device-gateway';
import { sql, type Kysely } from 'kysely';
import { KEY, startReplica, type Replica } from './bench-gateway-replicas.js';
import { RawHttpClient } from './lib/raw-http-client.js';
import { percentile } from './lib/wait.js';

const REQUESTS = Number(process.env.BENCH_DEVICE_READS ?? 300);
/** Device views at most 25/s: each replica answers at most 50 view requests a second (design §3.8). */
const VIEW_GAP_MS = 40;

/** One request at a time, at most one per `gapMs` (the device view: answers are rate-limited per replica). */
async function timed(
  client: RawHttpClient,
  paths: readonly string[],
  gapMs = 0,
): Promise<{ p50: number; p99: number; failed: number }> {
  const ms: number[] = [];
  let failed = 0;
  for (const path of paths) {
    const t0 = performance.now();
    const status = await client.get(path);
    const took = performance.now() - t0;
    ms.push(took);
    if (status !== 200) failed++;
    if (gapMs > took) await new Promise((r) => setTimeout(r, gapMs - took));
  }
  ms.sort((x, y) => x - y);
  return { p50: percentile(ms, 50), p99: percentile(ms, 99), failed };
}

export async function benchDeviceReads(
  databaseUrl: string,
  owner: Kysely<GatewayDatabase>,
  deviceId: (i: number) => string,
  devices: number,
): Promise<void> {
  const replicas: Replica[] = [];
  try {
    // The view's deadline far above any answer time: the figure is the gathering's, not a timeout's.
    // A fleet in every state: 70 % acknowledged, 10 % each pending, stale, unobserved (every 10th device in
    // order of desired_at is in the same state, so each filter's page is spread over the whole index).
    await sql`
      UPDATE device_gateway.device_delivery SET
        acked_content = CASE WHEN n % 10 IN (1, 2, 3) THEN NULL ELSE desired_content END,
        sent_content = CASE WHEN n % 10 = 2 THEN 'older' ELSE desired_content END,
        observed_by = CASE WHEN n % 10 = 3 THEN '{}'::text[] ELSE ARRAY['ffffffffffffffff'] END
      FROM (SELECT device_id AS id, row_number() OVER (ORDER BY desired_at, device_id) AS n
            FROM device_gateway.device_delivery) o
      WHERE device_id = o.id`.execute(owner);
    await sql`VACUUM ANALYZE device_gateway.device_delivery`.execute(owner);
    const counts = await sql<{ state: string; n: string }>`
      SELECT state, count(*) AS n FROM device_gateway.device_delivery GROUP BY state ORDER BY state`.execute(
      owner,
    );
    // The reading replicas record nothing: reaping would rewrite the states set above.
    for (let i = 0; i < 2; i++)
      replicas.push(
        await startReplica(databaseUrl, {
          GATEWAY_DEVICE_VIEW_DEADLINE_MS: '5000',
          GATEWAY_DELIVERY_RECORD: 'false',
        }),
      );
    const b = replicas[1]!;
    const client = new RawHttpClient(b.httpPort, 1, { authorization: `Bearer ${KEY}` });
    console.log(`\n== on-call reads through replica B of 2 — load average ${loadavg()[0]!.toFixed(2)} ==`);
    console.log(`delivery states: ${counts.rows.map((r) => `${r.state} ${r.n}`).join(', ')}`);
    // Warm-up (JIT, pools), not counted.
    await timed(
      client,
      Array.from({ length: 50 }, (_, i) => `/api/devices/${deviceId(i)}`),
      VIEW_GAP_MS,
    );
    await timed(
      client,
      Array.from({ length: 50 }, () => '/api/devices?limit=100'),
    );
    const filters = [
      '',
      '&delivery=acknowledged',
      '&delivery=pending',
      '&delivery=unobserved',
      '&delivery=stale',
    ];
    for (const filter of filters) {
      const r = await timed(
        client,
        Array.from({ length: REQUESTS }, () => `/api/devices?limit=100${filter}`),
      );
      console.log(
        `GET /api/devices?limit=100${filter.padEnd(24)} p50 ${r.p50.toFixed(2)} ms   p99 ${r.p99.toFixed(2)} ms   (${REQUESTS} requests, ${r.failed} not 200)`,
      );
    }
    const view = await timed(
      client,
      Array.from({ length: REQUESTS }, (_, i) => `/api/devices/${deviceId((i * 7919) % devices)}`),
      VIEW_GAP_MS,
    );
    console.log(
      `GET /api/devices/{id} (both replicas answer)   p50 ${view.p50.toFixed(2)} ms   p99 ${view.p99.toFixed(2)} ms   (${REQUESTS} requests, ${view.failed} not 200)`,
    );
    client.close();
  } finally {
    for (const r of replicas) r.proc.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 500));
  }
}
