// `npm run bench:gateway -- --replicas N` (design §3.6): N gateway processes (the real dist/main.js) on
// one embedded PostgreSQL; one CoAP observer on replica A; notify-settings POSTed to replica B at a fixed
// rate; latency = notification received on the observer's socket − the moment the POST was sent, i.e.
// HTTP + publish transaction (commit) + NOTIFY delivery + apply + CoAP send. Not a pass/fail test.
import { spawn, type ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import { fileURLToPath } from 'node:url';
import { createDb, migrateToLatest } from '@platform/service-kit';
import {
  gatewayLoginUrl,
  gatewayMigrations,
  seedDevices,
  type GatewayDatabase,
} from '@platform/device-gateway';
import { freePort, startPostgres } from '@platform/testkit';
import { cpuDuring, processCpuSeconds, treeCpuSeconds } from './lib/cpu-usage.js';
import { openLoop } from './lib/open-loop.js';
import { RawHttpClient } from './lib/raw-http-client.js';
import { percentile as pct, waitReady } from './lib/wait.js';
import { benchNodeArgs } from './lib/node-args.js';

const RATE_PER_S = Number(process.env.BENCH_NOTIFY_RATE ?? 1000);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 5);
const DEVICE = 'acme-hq-hvac-01';
export const KEY = 'bench-key-0123456789';
const mainJs = fileURLToPath(new URL('./main.js', import.meta.resolve('@platform/device-gateway')));

export interface Replica {
  proc: ChildProcess;
  httpPort: number;
  coapPort: number;
}

export async function startReplica(databaseUrl: string, env: Record<string, string> = {}): Promise<Replica> {
  const httpPort = await freePort('tcp');
  const coapPort = await freePort('udp');
  // BENCH_PROFILE_DIR: a V8 CPU profile per replica, written when it exits.
  const profile = process.env.BENCH_PROFILE_DIR;
  const execArgv = profile === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${profile}`];
  execArgv.push(...benchNodeArgs());
  const proc = spawn(process.execPath, [...execArgv, mainJs], {
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: databaseUrl,
      GATEWAY_API_KEYS: KEY,
      GATEWAY_HTTP_PORT: String(httpPort),
      GATEWAY_COAP_PORT: String(coapPort),
      GATEWAY_COAP_HOST: '127.0.0.1',
      // Request log lines at 1,000/s would cost the replicas more than the work measured.
      LOG_LEVEL: 'error',
      ...env,
    },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  await waitReady(`http://127.0.0.1:${httpPort}/api/ready`, { timeoutMs: 20_000, intervalMs: 50 });
  return { proc, httpPort, coapPort };
}

/** Observe=0 on the device's settings; calls back with each notification's settings value and time. */
async function observe(port: number, onValue: (value: number, at: number) => void): Promise<dgram.Socket> {
  const socket = dgram.createSocket({ type: 'udp4', recvBufferSize: 8 << 20 });
  await new Promise<void>((r) => socket.bind(0, '127.0.0.1', r));
  socket.on('message', (buf) => {
    const at = performance.now();
    const type = (buf[0]! >> 4) & 3;
    if (type === 0) socket.send(Buffer.from([0x60, 0x00, buf[2]!, buf[3]!]), port, '127.0.0.1');
    const start = buf.indexOf('{"device_id"');
    if (start < 0) return;
    const doc = JSON.parse(buf.subarray(start).toString()) as { settings: { reporting_interval_s?: number } };
    if (doc.settings.reporting_interval_s !== undefined) onValue(doc.settings.reporting_interval_s, at);
  });
  const parts: number[] = [0x41, 0x01, 0x00, 0x01, 0x7b, 0x60];
  let prev = 6;
  for (const seg of ['devices', DEVICE, 'settings']) {
    const bytes = Buffer.from(seg);
    const delta = 11 - prev;
    if (bytes.length < 13) parts.push((delta << 4) | bytes.length);
    else parts.push((delta << 4) | 13, bytes.length - 13);
    parts.push(...bytes);
    prev = 11;
  }
  socket.send(Buffer.from(parts), port, '127.0.0.1');
  return socket;
}

type CpuReaders = Record<string, () => number>;

async function run(
  label: string,
  publishTo: Replica,
  observeOn: Replica,
  base: number,
  cpu: CpuReaders,
  rate = RATE_PER_S,
) {
  const sentAt = new Map<number, number>();
  const latencies: number[] = [];
  const socket = await observe(observeOn.coapPort, (value, at) => {
    const t = sentAt.get(value);
    if (t !== undefined) {
      latencies.push(at - t);
      sentAt.delete(value);
    }
  });
  await new Promise((r) => setTimeout(r, 200));
  const client = new RawHttpClient(publishTo.httpPort, 16, { authorization: `Bearer ${KEY}` });
  const answers: number[] = [];
  let failed = 0;
  const post = async (value: number): Promise<void> => {
    const body = JSON.stringify({ device_id: DEVICE, settings: { reporting_interval_s: value } });
    const t0 = performance.now();
    const status = await client.post('/api/notify-settings', body);
    if (status !== 200) failed++;
    answers.push(performance.now() - t0);
  };
  const total = rate * SECONDS;
  const t0 = performance.now();
  const { cpuS } = await cpuDuring(cpu, () => drive());
  const elapsed = (performance.now() - t0) / 1000;
  await new Promise((r) => setTimeout(r, 500));
  socket.close();
  client.close();
  latencies.sort((x, y) => x - y);
  answers.sort((x, y) => x - y);
  console.log(
    `${label.padEnd(34)} notify→device p50 ${pct(latencies, 50).toFixed(2)} ms  p90 ${pct(latencies, 90).toFixed(2)} ms  ` +
      `p99 ${pct(latencies, 99).toFixed(2)} ms  ` +
      `max ${(latencies.at(-1) ?? NaN).toFixed(2)} ms | HTTP answer p50 ${pct(answers, 50).toFixed(2)} ms  ` +
      `p99 ${pct(answers, 99).toFixed(2)} ms | ${latencies.length}/${total} seen, ${failed} failed, ` +
      `${(total / elapsed).toFixed(0)} req/s`,
  );
  // Where each notify's CPU goes: what limits the latency when the cores are the bottleneck.
  const perNotify = Object.entries(cpuS)
    .map(([name, s]) => `${name} ${Math.round((s * 1e6) / total)}`)
    .join(', ');
  console.log(`${''.padEnd(34)} CPU µs per notify: ${perNotify}`);

  async function drive(): Promise<void> {
    // Distinct values (within the schema's 10..86400) so every notification is matched to its request.
    await openLoop(rate, total, (i) => {
      const value = base + i;
      sentAt.set(value, performance.now());
      return post(value);
    });
  }
}

export async function benchReplicas(argv: readonly string[]): Promise<void> {
  const flag = argv.indexOf('--replicas');
  const count = Math.max(2, Number(argv[flag + 1] ?? 2) || 2);
  const durable = !argv.includes('--no-fsync');
  console.log(
    `bench:gateway --replicas ${count}: cross-replica notify → device latency, ${RATE_PER_S} notifies/s for ${SECONDS} s ` +
      `(PostgreSQL ${durable ? 'durable: fsync on; the gateway commits bus messages with synchronous_commit off' : 'fsync off'})`,
  );
  const pg = await startPostgres({ durable });
  const replicas: Replica[] = [];
  try {
    const owner = createDb<GatewayDatabase>(pg.url, { max: 1 });
    await migrateToLatest(owner, [gatewayMigrations]);
    await seedDevices(owner);
    await owner.destroy();
    for (let i = 0; i < count; i++) replicas.push(await startReplica(gatewayLoginUrl(pg.url)));
    const [a, b] = replicas as [Replica, Replica];
    const cpu: CpuReaders = {
      'replica A': () => processCpuSeconds(a.proc.pid ?? 0),
      'replica B': () => processCpuSeconds(b.proc.pid ?? 0),
      postgres: () => treeCpuSeconds(pg.pid ?? 0),
      'load generator': () => processCpuSeconds(process.pid),
    };
    // Warm-up (JIT, connection pools), not counted: first at a quarter of the rate, so cold code does not
    // build a queue that the measured runs would inherit, then at the full rate.
    await run('warm-up (quarter rate)', b, a, 10, cpu, RATE_PER_S / 4);
    await run('warm-up', b, a, 6000, cpu);
    await run('same replica (B → observer on B)', b, b, 20_000, cpu);
    await run('cross replica (B → observer on A)', b, a, 40_000, cpu);
  } finally {
    for (const r of replicas) r.proc.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 300));
    await pg.destroy();
  }
}
