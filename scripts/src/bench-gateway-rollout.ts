// BENCH_ONLY=rollout of `npm run bench:gateway` (design §3.9): one gateway child with its rollout driver, N CON
// observers. In order, on the same child and observers: the plain reload fan-out of a new registry setting to all
// N; a staged rollout of another setting to all N at an unlimited rate (three waves: 10 %, 30 %, 60 %), timed
// from its creation to `completed` (every device's acknowledgement read back from the delivery record); then
// notify → device p99 for device 0 (outside the rollout's site), open loop 1,000/s for 5 s, without a rollout,
// with one running at 1,000 devices a second, and without again (A B A).
import { readdirSync, readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import type { createDb } from '@platform/service-kit';
import type { GatewayDatabase } from '@platform/device-gateway';
import { sql } from 'kysely';
import { openLoop } from './lib/open-loop.js';
import { RawHttpClient } from './lib/raw-http-client.js';
import { percentile } from './lib/wait.js';

export interface RolloutBenchDeps {
  url: string;
  owner: ReturnType<typeof createDb<GatewayDatabase>>;
  pgPid: number | undefined;
  n: number;
  startChild: (
    mode: 'gateway',
    databaseUrl: string,
    env?: Record<string, string>,
  ) => Promise<{
    coapPort: number;
    httpPort: number;
    ask<T>(msg: unknown): Promise<T>;
    proc: { pid?: number | undefined };
  }>;
  stopChild: (child: never) => Promise<void>;
  observers: (
    port: number,
    n: number,
  ) => {
    open(): Promise<void>;
    registerAll(): Promise<number>;
    mark(value?: number): void;
    settle(idleMs?: number, tailMs?: number): Promise<void>;
    close(): void;
    deliveredCount: number;
    duplicates: number;
    firstAt: number;
    lastAt: number;
    onEveryNotification: ((payload: Buffer, at: number) => void) | undefined;
  };
}

const ROLLOUT_SITE = 'a1000000-0000-4000-8000-000000000001';
const OTHER_SITE = 'a1000000-0000-4000-8000-0000000000ff';

/**
 * CPU ms (user + system) of PostgreSQL's processes (children of the postmaster `pid`), from /proc: the backends
 * of the gateway's login, and the rest (autovacuum, WAL writer, checkpointer, the benchmark's owner session).
 */
function pgCpuMs(pid: number | undefined): { login: number; other: number } {
  if (pid === undefined) return { login: NaN, other: NaN };
  let login = 0;
  let other = 0;
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      // After the command: state(0) ppid(1) … utime(11) stime(12), in clock ticks (100 a second).
      if (Number(fields[1]) !== pid) continue;
      const ms = (Number(fields[11]) + Number(fields[12])) * 10;
      if (readFileSync(`/proc/${entry}/cmdline`, 'latin1').includes('device_gateway_login')) login += ms;
      else other += ms;
    } catch {
      // The process ended meanwhile.
    }
  }
  return { login, other };
}

const pgSince = (pid: number | undefined, p0: { login: number; other: number }) => {
  const p1 = pgCpuMs(pid);
  return { login: p1.login - p0.login, other: p1.other - p0.other };
};

export async function benchRollout(deps: RolloutBenchDeps): Promise<void> {
  const { url, owner, n } = deps;
  // Device 0 outside the rollout's site: its notify latency is measured while the others roll.
  await sql`UPDATE device_gateway.device_registry SET site_id = ${OTHER_SITE}::uuid
            WHERE device_id = 'bench-000000'`.execute(owner);
  const child = await deps.startChild('gateway', url, { BENCH_ROLLOUT: 'true' });
  const obs = deps.observers(child.coapPort, n);
  await obs.open();
  await obs.registerAll();
  await child.ask({ cmd: 'flush' });
  const cpu = async (): Promise<number> => (await child.ask<{ cpuMs: number }>({ cmd: 'cpu' })).cpuMs;

  // 1. The plain reload fan-out.
  obs.mark(200);
  await sql`UPDATE device_gateway.device_registry SET desired_settings = '{"reporting_interval_s": 200}'::jsonb`.execute(
    owner,
  );
  let c0 = await cpu();
  let p0 = pgCpuMs(deps.pgPid);
  let t0 = performance.now();
  await child.ask({ cmd: 'reload' });
  await obs.settle();
  const reload = {
    seconds: (obs.lastAt - t0) / 1000,
    cpuMs: (await cpu()) - c0,
    pg: pgSince(deps.pgPid, p0),
    got: obs.deliveredCount,
    dup: obs.duplicates,
  };

  // 2. A rollout to all of them (device 0 aside) at an unlimited rate.
  const http = new RawHttpClient(child.httpPort, 8, { authorization: 'Bearer bench-key' });
  const api = async (method: string, path: string, body?: unknown): Promise<Record<string, unknown>> => {
    const res = await fetch(`http://127.0.0.1:${child.httpPort}${path}`, {
      method,
      headers: { authorization: 'Bearer bench-key', 'content-type': 'application/json' },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    return (await res.json()) as Record<string, unknown>;
  };
  obs.mark(300);
  c0 = await cpu();
  p0 = pgCpuMs(deps.pgPid);
  t0 = performance.now();
  const created = await api('POST', '/api/rollouts', {
    selector: { site_ids: [ROLLOUT_SITE] },
    settings: { reporting_interval_s: 300 },
    plan: {
      first_wave_percent: 10,
      growth_factor: 3,
      success_share: 0.99,
      abort_share: 0.01,
      deadline_s: 120,
    },
  });
  const id = created.rollout_id as string;
  // Polled through the list (one row, no counts): the full view counts every target, which at 10 polls a
  // second would be most of PostgreSQL's work here, not the rollout's.
  for (;;) {
    const page = await api('GET', '/api/rollouts?limit=1');
    const state = (page.items as { rollout_id: string; state: string }[])[0]?.state;
    if (state !== 'active' || performance.now() - t0 > 600_000) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  const doneAt = performance.now();
  const rolloutCpuMs = (await cpu()) - c0;
  const rolloutPg = pgSince(deps.pgPid, p0);
  const view = await api('GET', `/api/rollouts/${id}`);
  await obs.settle(1000, 3500);
  const rollout = {
    state: view.state as string,
    targets: created.targets as number,
    waves: created.waves as number,
    seconds: (doneAt - t0) / 1000,
    sendSeconds: (obs.lastAt - t0) / 1000,
    cpuMs: rolloutCpuMs,
    pg: rolloutPg,
    got: obs.deliveredCount,
    dup: obs.duplicates,
    totals: view.totals as Record<string, number>,
  };

  // 3. notify p99 for device 0 with and without a running rollout (A B A).
  let value = 10_000;
  const notifyRun = async (): Promise<{ p50: number; p99: number; seen: number }> => {
    const sentAt = new Map<number, number>();
    const samples: number[] = [];
    obs.mark();
    obs.onEveryNotification = (payload, at) => {
      if (!payload.includes('"bench-000000"')) return;
      const v = (JSON.parse(payload.toString()) as { settings: { reporting_interval_s: number } }).settings
        .reporting_interval_s;
      const t = sentAt.get(v);
      if (t === undefined) return;
      sentAt.delete(v);
      samples.push(at - t);
    };
    const post = async (v: number): Promise<void> => {
      sentAt.set(v, performance.now());
      await http.post(
        '/api/notify-settings',
        JSON.stringify({ device_id: 'bench-000000', settings: { reporting_interval_s: v } }),
      );
    };
    await openLoop(1000, 1000, (i) => post(value + i)); // warm-up, not counted
    value += 1000;
    await new Promise((r) => setTimeout(r, 200));
    samples.length = 0;
    await openLoop(1000, 5000, (i) => post(value + i));
    value += 5000;
    await new Promise((r) => setTimeout(r, 500));
    obs.onEveryNotification = undefined;
    samples.sort((a, b) => a - b);
    return { p50: percentile(samples, 50), p99: percentile(samples, 99), seen: samples.length };
  };
  const before = await notifyRun();
  const running = await api('POST', '/api/rollouts', {
    selector: { site_ids: [ROLLOUT_SITE] },
    settings: { reporting_interval_s: 400 },
    plan: {
      first_wave_percent: 100,
      max_per_minute: 60_000,
      success_share: 0,
      abort_share: 1,
      deadline_s: 600,
    },
  });
  await new Promise((r) => setTimeout(r, 1500));
  const during = await notifyRun();
  const progressed = (await api('GET', `/api/rollouts/${running.rollout_id as string}`)).totals as Record<
    string,
    number
  >;
  await api('POST', `/api/rollouts/${running.rollout_id as string}/cancel`, {});
  await new Promise((r) => setTimeout(r, 2000));
  const after = await notifyRun();
  http.close();
  obs.close();
  await deps.stopChild(child as never);

  const f = (x: number, d = 0): string => x.toFixed(d);
  console.log(
    `\n== staged rollout to ${n} CON observers (design §3.9) — load average ${loadavg()[0]!.toFixed(2)} ==`,
  );
  console.log(
    `plain reload fan-out: ${f(reload.got)} delivered (${reload.dup} duplicated) in ${f(reload.seconds, 2)} s; gateway CPU ${f(reload.cpuMs)} ms, PostgreSQL CPU ${f(reload.pg.login)} ms in the gateway's sessions + ${f(reload.pg.other)} ms other (autovacuum, WAL, checkpoints)`,
  );
  console.log(
    `rollout, unlimited rate, ${rollout.waves} waves (10 % ×3): ${rollout.state} in ${f(rollout.seconds, 2)} s (last notification at ${f(rollout.sendSeconds, 2)} s); ${f(rollout.got)} delivered (${rollout.dup} duplicated), totals ${JSON.stringify(rollout.totals)}`,
  );
  console.log(
    `  gateway CPU ${f(rollout.cpuMs)} ms (${(rollout.cpuMs / reload.cpuMs).toFixed(2)}x the reload fan-out's), PostgreSQL CPU ${f(rollout.pg.login)} ms in the gateway's sessions (${(rollout.pg.login / Math.max(1, reload.pg.login)).toFixed(2)}x) + ${f(rollout.pg.other)} ms other`,
  );
  console.log(
    `notify → device 0, open loop 1,000/s for 5 s: p99 ${f(before.p99, 3)} ms without a rollout, ${f(during.p99, 3)} ms with one running at 1,000 devices/s (${progressed.notified ?? 0} notified by then), ${f(after.p99, 3)} ms after; p50 ${f(before.p50, 3)} / ${f(during.p50, 3)} / ${f(after.p50, 3)} ms; samples ${before.seen}/${during.seen}/${after.seen}`,
  );
}
