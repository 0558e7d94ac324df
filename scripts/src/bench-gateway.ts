// `npm run bench:gateway`: the device gateway against a plain node-coap 1.5.0 server, in one run, on
// loopback with real sockets (design §3.4). Prints figures and ratios; it is not a pass/fail test.
import { execFileSync, fork, type ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { gatewayLoginUrl, gatewayMigrations, type GatewayDatabase } from '@platform/device-gateway';
import { startPostgres } from '@platform/testkit';
import { sql } from 'kysely';
import { dtlsFanout, dtlsLatency, issueBenchKeys, openDtlsObserver } from './bench-gateway-dtls.js';
import { runDtlsBench } from './bench-dtls.js';
import { benchDeviceReads } from './bench-gateway-devices.js';
import { benchRollout } from './bench-gateway-rollout.js';
import { REPORT_DTLS, REPORT_PLAIN, benchReports } from './bench-gateway-reports.js';
import { allowedCpus, cpuList, pinTree } from './lib/cpu-pinning.js';
import { benchDeviceId as deviceId, seedBenchRegistry } from './lib/bench-registry.js';
import { benchNodeArgs } from './lib/node-args.js';
import { openLoop } from './lib/open-loop.js';
import { RawHttpClient } from './lib/raw-http-client.js';
import { percentile } from './lib/wait.js';

const SIZES = (process.env.BENCH_SIZES ?? '10000,100000').split(',').map(Number);
// BENCH_ONLY=notify: only notify-settings over HTTP → device and its floors (the fan-out sizes and DTLS are
// skipped), BENCH_ROUNDS times (default 1), gateway and floor alternating so each ratio comes from one round.
const ONLY_NOTIFY = process.env.BENCH_ONLY === 'notify';
// BENCH_ONLY=delivery: only the delivery record's figures (design §3.8): the largest fan-out with recording on
// and off in ABBA order (on, off, off, on), then on-call's reads; the node-coap, notify and DTLS parts skipped.
const ONLY_DELIVERY = process.env.BENCH_ONLY === 'delivery';
// BENCH_ONLY=rollout: staged rollouts (design §3.9, bench-gateway-rollout.ts): the largest size's reload fan-out,
// a rollout to the same observers at an unlimited rate, and notify p99 with and without a running rollout.
const ONLY_ROLLOUT = process.env.BENCH_ONLY === 'rollout';
// BENCH_ONLY=reports: devices' reports (issue 40; bench-gateway-reports.ts): BENCH_REPORT_DTLS (10,000) DTLS and
// BENCH_REPORT_PLAIN (100,000) plain devices, a reload without reports and one after which every device reports,
// BENCH_ROUNDS times (ABBA): CPU per report against per notification, fan-out with and without, the record's lag.
const ONLY_REPORTS = process.env.BENCH_ONLY === 'reports';
// BENCH_ONLY=dtls: only the DTLS capacity figures (design §3.5): per round, the plain fan-out to
// BENCH_DTLS_OBSERVERS (10,000) observers and the DTLS fan-out to as many, with each of the two DTLS clients
// (bench-gateway-dtls.ts), each on a fresh gateway child, in an order that alternates from round to round;
// BENCH_ROUNDS rounds, pooled at the end.
const ONLY_DTLS = process.env.BENCH_ONLY === 'dtls';
// BENCH_DTLS_FANOUT=false: those rounds without the fan-outs (latency only).
const FANOUTS = process.env.BENCH_DTLS_FANOUT !== 'false';
// BENCH_DTLS_NON=true: those rounds' latency devices register NON (no ACK round trip to wait for).
const NON_LATENCY = process.env.BENCH_DTLS_NON === 'true';
// BENCH_DTLS_LATENCY=sequential: those rounds measure plain and DTLS latency one after the other (the sixth pass),
// not taking turns every 100 ms (pairedLatency).
const SEQUENTIAL_LATENCY = process.env.BENCH_DTLS_LATENCY === 'sequential';
// BENCH_WARM_S: seconds each side of the paired latency is warmed up before its 5 s are counted (default 4: with
// 1, the first scavenge inside the window, 10-33 ms, still carried the start-up garbage of both children).
const WARM_S = Number(process.env.BENCH_WARM_S ?? 4);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 1);
const ROWS = ONLY_NOTIFY ? 1000 : ONLY_REPORTS ? REPORT_DTLS + REPORT_PLAIN : Math.max(...SIZES);
// Many sockets: real devices are one endpoint each, and the gateway caps relations per endpoint (256).
const CLIENT_SOCKETS = Number(process.env.BENCH_CLIENT_SOCKETS ?? 1024);
const serverJs = fileURLToPath(new URL('./bench-gateway-server.js', import.meta.url));

export interface Child {
  proc: ChildProcess;
  coapPort: number;
  /** The coaps port, when the child serves DTLS (BENCH_COAP_SECURITY=both). */
  coapsPort?: number;
  httpPort: number;
  ask<T>(msg: unknown): Promise<T>;
}

type ChildMode = 'gateway' | 'nodecoap' | 'floor-http' | 'floor-express';

export async function startChild(
  mode: ChildMode,
  databaseUrl: string,
  env: Record<string, string> = {},
): Promise<Child> {
  const proc = fork(serverJs, [mode], {
    // BENCH_PROFILE=<dir> writes a CPU profile per server child (node --cpu-prof) for the report.
    execArgv: [
      '--expose-gc',
      ...(process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE}`] : []),
      ...benchNodeArgs(),
    ],
    env: { ...process.env, BENCH_DATABASE_URL: databaseUrl, ...env },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  if (process.env.BENCH_GATEWAY_CPUS && proc.pid !== undefined)
    console.log(`  ${mode} child on CPUs ${allowedCpus(proc.pid)}`);
  const first = await new Promise<{ coapPort: number; coapsPort?: number; httpPort: number }>(
    (resolve, reject) => {
      proc.once('message', (m) => resolve(m as { coapPort: number; coapsPort?: number; httpPort: number }));
      proc.once('exit', (code) => reject(new Error(`${mode} server exited with ${code}`)));
    },
  );
  return {
    proc,
    coapPort: first.coapPort,
    ...(first.coapsPort === undefined ? {} : { coapsPort: first.coapsPort }),
    httpPort: first.httpPort,
    ask: <T>(msg: unknown) =>
      new Promise<T>((resolve) => {
        proc.once('message', (m) => resolve(m as T));
        proc.send(msg as object);
      }),
  };
}

/** Asks the child to exit (so a CPU profile is written), killing it if it does not within 5 s. */
export async function stopChild(child: Child): Promise<void> {
  const exited = new Promise<void>((resolve) => child.proc.once('exit', () => resolve()));
  child.proc.send({ cmd: 'exit' });
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(timer);
}

/**
 * Raw CoAP observers: N relations over CLIENT_SOCKETS sockets, token = relation index (4 bytes). Each socket is
 * connected to the server (no per-send address resolution) with large buffers, and the per-datagram work is a
 * few byte reads, so the client is not what limits the figures; its CPU time is reported beside the server's.
 * Counting is exact: a notification counts for the round when its payload carries the round's value; per
 * relation, the first such notification is delivered and every further one is a duplicate (a retransmission
 * or a re-send), whatever its message id.
 */
class Observers {
  readonly sockets: dgram.Socket[] = [];
  registered = 0;
  answered = new Uint8Array(0);
  /** Per relation: notifications carrying the current round's value. */
  delivered = new Uint16Array(0);
  deliveredCount = 0;
  duplicates = 0;
  /** Notifications of the round's resources that did not carry its value (older states). */
  stale = 0;
  lastAt = 0;
  firstAt = 0;
  private marker = Buffer.alloc(0);
  /** Called for every 2.05 notification of the round, duplicates included (the latency runs dedupe by value). */
  onEveryNotification: ((payload: Buffer, at: number) => void) | undefined;

  constructor(
    readonly port: number,
    readonly n: number,
    readonly confirmable = true,
  ) {
    this.answered = new Uint8Array(n);
    this.delivered = new Uint16Array(n);
  }

  async open(): Promise<void> {
    const count = Math.min(CLIENT_SOCKETS, this.n);
    for (let i = 0; i < count; i++) {
      const s = dgram.createSocket({ type: 'udp4', recvBufferSize: 8 << 20, sendBufferSize: 8 << 20 });
      s.on('message', (buf) => this.onMessage(s, buf));
      await new Promise<void>((r) => s.bind(0, '127.0.0.1', r));
      await new Promise<void>((r) => s.connect(this.port, '127.0.0.1', r));
      this.sockets.push(s);
    }
  }

  private onMessage(s: dgram.Socket, buf: Buffer): void {
    if (buf.length < 8) return;
    const type = (buf[0]! >> 4) & 3;
    const tkl = buf[0]! & 15;
    if (type === 0) s.send(Buffer.from([0x60, 0x00, buf[2]!, buf[3]!]));
    if (tkl !== 4) return;
    const index = buf.readUInt32BE(4);
    if (index >= this.n) return;
    if (type === (this.confirmable ? 2 : 1) && this.answered[index] === 0) {
      // The registration's response (piggybacked ACK for CON, a NON for NON).
      this.answered[index] = 1;
      this.registered++;
      return;
    }
    if (buf[1] !== 0x45 || this.marker.length === 0) return; // 2.05 notifications of a round only
    const at = performance.now();
    if (buf.indexOf(this.marker, 8) === -1) {
      this.stale++;
      return;
    }
    // The payload is the JSON document (an ETag byte may be 0xff, so do not search for the marker).
    if (this.onEveryNotification !== undefined) {
      this.onEveryNotification(buf.subarray(buf.indexOf('{"device_id"')), at);
    }
    const seen = this.delivered[index]!;
    if (seen < 0xffff) this.delivered[index] = seen + 1;
    if (seen > 0) {
      this.duplicates++;
      return;
    }
    this.deliveredCount++;
    this.lastAt = at;
    if (this.firstAt === 0) this.firstAt = at;
  }

  /** A GET (with Observe=0 when `observe`), token = index; encoded directly into one Buffer. */
  request(index: number, path: string, observe: boolean): Buffer {
    const segments = path.split('/').filter(Boolean);
    let size = 8 + (observe ? 1 : 0);
    for (const seg of segments) size += 1 + (seg.length < 13 ? 0 : 1) + Buffer.byteLength(seg);
    const out = Buffer.allocUnsafe(size);
    out[0] = this.confirmable ? 0x44 : 0x54;
    out[1] = 0x01;
    out.writeUInt16BE(index & 0xffff, 2);
    out.writeUInt32BE(index, 4);
    let pos = 8;
    let prev = 0;
    if (observe) {
      out[pos++] = 0x60; // Observe (6), length 0 → value 0
      prev = 6;
    }
    for (const seg of segments) {
      const len = Buffer.byteLength(seg);
      const delta = 11 - prev;
      if (len < 13) out[pos++] = (delta << 4) | len;
      else {
        out[pos++] = (delta << 4) | 13;
        out[pos++] = len - 13;
      }
      pos += out.write(seg, pos);
      prev = 11;
    }
    return out;
  }

  /**
   * Registers all N relations, keeping at most `window` outstanding and retransmitting unanswered ones after
   * 500 ms (as a CON client would); returns registrations per second.
   */
  async registerAll(window = 1000): Promise<number> {
    const t0 = performance.now();
    let sent = 0;
    let lastProgress = performance.now();
    let seen = 0;
    while (this.registered < this.n) {
      while (sent < this.n && sent - this.registered < window) {
        this.sendRegistration(sent);
        sent++;
      }
      await new Promise((r) => setImmediate(r));
      const now = performance.now();
      if (this.registered !== seen) {
        seen = this.registered;
        lastProgress = now;
      } else if (now - lastProgress > 500) {
        for (let i = 0; i < sent; i++) if (this.answered[i] === 0) this.sendRegistration(i);
        lastProgress = now;
      }
      if (now - t0 > 60_000) break;
    }
    return this.registered / ((performance.now() - t0) / 1000);
  }

  private sendRegistration(i: number): void {
    this.sockets[i % this.sockets.length]!.send(this.request(i, `/devices/${deviceId(i)}/settings`, true));
  }

  /**
   * Starts a round: from now on, notifications carrying `"reporting_interval_s":<value>` count; without a
   * value, every notification of the settings does (the latency runs).
   */
  mark(value?: number): void {
    this.marker = Buffer.from(`"reporting_interval_s":${value ?? ''}`);
    this.delivered.fill(0);
    this.deliveredCount = 0;
    this.duplicates = 0;
    this.stale = 0;
    this.firstAt = 0;
    this.lastAt = 0;
  }

  /**
   * Waits until every relation got the round's notification (or nothing new arrived for `idleMs`), then
   * `tailMs` more so that retransmissions (due after ACK_TIMEOUT × up to 1.5 = 3 s) are counted as duplicates.
   */
  async settle(idleMs = 5000, tailMs = 3500): Promise<void> {
    let last = -1;
    let lastChange = performance.now();
    for (;;) {
      await new Promise((r) => setTimeout(r, 50));
      if (this.deliveredCount === this.n) break;
      if (this.deliveredCount !== last) {
        last = this.deliveredCount;
        lastChange = performance.now();
      } else if (performance.now() - lastChange > idleMs) break;
    }
    await new Promise((r) => setTimeout(r, tailMs));
  }

  close(): void {
    for (const s of this.sockets) s.close();
  }
}

/** The notify-settings body of the latency runs: device 0, the value to recognise at the observer. */
const notifyBody = (value: number): string =>
  JSON.stringify({ device_id: deviceId(0), settings: { reporting_interval_s: value } });
const kb = (bytes: number): string => `${(bytes / 1024).toFixed(2)} KB`;
const ratio = (a: number, b: number): string => `${(a / b).toFixed(2)}x`;

const cpuMs = (u: NodeJS.CpuUsage): number => (u.user + u.system) / 1000;

interface DeliveryStats {
  rows: number;
  flushes: number;
  failures: number;
  totalFlushMs: number;
  maxFlushMs: number;
  /** Since the fifth pass (absent in an older build's child). */
  earlyFlushes?: number;
  chunks?: number;
}

/** The delivery record's lag over a window (the child samples `lagSeconds()` every 50 ms), and its longest flush. */
interface LagWindow {
  samples: number;
  maxS: number;
  p99S: number;
  /** From the window's start until everything was written (without an explicit flush). */
  windowMs: number;
  maxFlushMs: number;
}

async function measure(
  mode: 'gateway' | 'nodecoap',
  n: number,
  databaseUrl: string,
  owner: ReturnType<typeof createDb<GatewayDatabase>>,
  round: number,
  env: Record<string, string> = {},
) {
  const child = await startChild(mode, databaseUrl, env);
  const base = await child.ask<{ heap: number; rss: number }>({ cmd: 'heap' });
  const obs = new Observers(child.coapPort, n);
  await obs.open();
  // The record's lag while the registrations arrive and until they are written, unasked (gateway only).
  const lagged = mode === 'gateway';
  const lagWindow = async (): Promise<LagWindow> => {
    await child.ask({ cmd: 'lag-wait' });
    return child.ask<LagWindow>({ cmd: 'lag-stop' });
  };
  const regServerCpu0 = await child.ask<{ cpuMs: number }>({ cmd: 'cpu' });
  const regClientCpu0 = process.cpuUsage();
  if (lagged) await child.ask({ cmd: 'lag-start' });
  const regPerS = await obs.registerAll();
  const regClientCpuMs = cpuMs(process.cpuUsage(regClientCpu0));
  const regServerCpuMs = (await child.ask<{ cpuMs: number }>({ cmd: 'cpu' })).cpuMs - regServerCpu0.cpuMs;
  const regLag = lagged ? await lagWindow() : undefined;
  await new Promise((r) => setTimeout(r, 500));
  // The delivery record's registrations written first: memory per relation is what stays.
  await child.ask({ cmd: 'flush' });
  const after = await child.ask<{ heap: number; rss: number; observers: number }>({ cmd: 'heap' });
  const value = 100 + round;
  obs.mark(value);
  let reloadMs = 0;
  if (mode === 'gateway') {
    // Every device's settings change; the reload swaps the registry and notifies every observer.
    await sql`UPDATE device_gateway.device_registry SET desired_settings = jsonb_build_object('reporting_interval_s', ${value}::int)`.execute(
      owner,
    );
  }
  const delivery0 = (await child.ask<{ delivery?: DeliveryStats }>({ cmd: 'stats' })).delivery;
  const serverCpu0 = await child.ask<{ cpuMs: number; systemMs?: number }>({ cmd: 'cpu' });
  const clientCpu0 = process.cpuUsage();
  if (lagged) await child.ask({ cmd: 'lag-start' });
  const t0 = performance.now();
  if (mode === 'gateway') reloadMs = (await child.ask<{ ms: number }>({ cmd: 'reload' })).ms;
  else await child.ask({ cmd: 'fanout', value });
  await obs.settle();
  const clientCpuMs = cpuMs(process.cpuUsage(clientCpu0));
  const serverCpu1 = await child.ask<{ cpuMs: number; systemMs?: number }>({ cmd: 'cpu' });
  // The fan-out's window ends when its events are written without an explicit flush.
  const fanLag = lagged ? await lagWindow() : undefined;
  const serverCpuMs = serverCpu1.cpuMs - serverCpu0.cpuMs;
  const serverSystemMs = (serverCpu1.systemMs ?? NaN) - (serverCpu0.systemMs ?? NaN);
  const stats = await child.ask<Record<string, number>>({ cmd: 'stats' });
  const got = obs.deliveredCount;
  // Every delivery event of the fan-out written (sent at the reload, acknowledged at each ACK).
  await child.ask({ cmd: 'flush' });
  const writtenAt = performance.now();
  const delivery1 = (await child.ask<{ delivery?: DeliveryStats }>({ cmd: 'stats' })).delivery;
  const delivery =
    delivery0 === undefined || delivery1 === undefined
      ? undefined
      : {
          rows: delivery1.rows - delivery0.rows,
          flushes: delivery1.flushes - delivery0.flushes,
          failures: delivery1.failures - delivery0.failures,
          rowsPerS: (delivery1.rows - delivery0.rows) / ((writtenAt - t0) / 1000),
          msPerFlush:
            (delivery1.totalFlushMs - delivery0.totalFlushMs) /
            Math.max(1, delivery1.flushes - delivery0.flushes),
          earlyFlushes: (delivery1.earlyFlushes ?? NaN) - (delivery0.earlyFlushes ?? NaN),
          chunks: (delivery1.chunks ?? NaN) - (delivery0.chunks ?? NaN),
          regLag,
          fanLag,
        };
  // Rate from the first to the last distinct notification received; end to end from the reload command
  // (gateway: includes the database read) or the fan-out command (node-coap).
  const seconds = (obs.lastAt - obs.firstAt) / 1000;
  const result = {
    heapPerRelation: (after.heap - base.heap) / n,
    rssPerRelation: (after.rss - base.rss) / n,
    observers: after.observers,
    regPerS,
    regClientCpuMs,
    regServerCpuMs,
    fanoutPerS: got / seconds,
    lost: n - got,
    duplicates: obs.duplicates,
    stale: obs.stale,
    reloadMs,
    endToEnd: (obs.lastAt - t0) / 1000,
    clientCpuMs,
    serverCpuMs,
    serverSystemMs,
    stats,
    delivery,
  };
  obs.close();
  await stopChild(child);
  return result;
}

/**
 * notify-settings over HTTP → the observing device. First closed loop (one request at a time: the latency of a
 * single notify with no queueing), then, after the same 1 s warm-up as the floors get, open loop at `rate`/s
 * for 5 s with each send time taken when the
 * request is written, and with enough sockets that the client never queues requests. The observer registered
 * with CON, so it gets CON notifications and ACKs each; a value superseded while a notification awaits its ACK
 * is replaced by the newer one (RFC 7641 4.5.2), so "matched" can be below "sent" without anything being lost.
 * With `confirmable` false the observer registers with NON and gets NON notifications, one datagram per value
 * like the floors: the like-for-like comparison of what the gateway adds.
 */
async function latency(databaseUrl: string, rate = 1000, confirmable = true) {
  const child = await startChild('gateway', databaseUrl);
  const obs = new Observers(child.coapPort, 1, confirmable);
  await obs.open();
  await obs.registerAll();
  obs.mark();
  const sentAt = new Map<number, number>();
  const samples: number[] = [];
  // Every value is a sample when its first notification arrives, so two requests sent in the same tick of
  // the pacing timer count twice, as they do against the floors (a per-round "delivered" flag would keep
  // only the first of the two, and with it the shorter wait).
  obs.onEveryNotification = (payload, at) => {
    const doc = JSON.parse(payload.toString()) as { settings: { reporting_interval_s: number } };
    const value = doc.settings.reporting_interval_s;
    const t = sentAt.get(value);
    if (t === undefined) return;
    sentAt.delete(value);
    samples.push(at - t);
    if (value === awaited) notified?.();
  };
  let notified: (() => void) | undefined;
  let awaited = -1;
  // Raw keep-alive sockets: node:http's client costs about 1 ms of CPU per request, which at 1,000/s would
  // take most of a core from the gateway on this 2-core machine. 64 sockets: the client never queues.
  const client = new RawHttpClient(child.httpPort, 64, { authorization: 'Bearer bench-key' });
  let failed = 0;
  const post = async (value: number): Promise<void> => {
    const body = notifyBody(value);
    sentAt.set(value, performance.now());
    if ((await client.post('/api/notify-settings', body)) !== 200) failed++;
  };
  // Closed loop: 500 single requests, each waiting for its notification.
  let value = 10;
  for (let i = 0; i < 500; i++) {
    awaited = value;
    const delivered = new Promise<void>((resolve) => {
      notified = resolve;
      setTimeout(resolve, 2000);
    });
    await post(value++);
    await delivered;
  }
  notified = undefined;
  const single = [...samples].sort((a, b) => a - b);
  // The floors' warm-up: 1 s of the open loop, not counted (the JIT and the heap settle as they do there).
  await openLoop(rate, rate, (i) => post(value + i));
  value += rate;
  await new Promise((r) => setTimeout(r, 100));
  samples.length = 0;
  // Open loop at `rate`/s for 5 s.
  const total = rate * 5;
  const serverCpu0 = await child.ask<{ cpuMs: number }>({ cmd: 'cpu' });
  const clientCpu0 = process.cpuUsage();
  const t0 = performance.now();
  // Timer-paced (see openLoop): a busy-wait pacing loop took a whole core from the gateway.
  await openLoop(rate, total, (i) => post(value + i));
  const elapsed = (performance.now() - t0) / 1000;
  await new Promise((r) => setTimeout(r, 500));
  const clientCpuMs = cpuMs(process.cpuUsage(clientCpu0));
  const serverCpuMs = (await child.ask<{ cpuMs: number }>({ cmd: 'cpu' })).cpuMs - serverCpu0.cpuMs;
  samples.sort((a, b) => a - b);
  client.close();
  obs.close();
  await stopChild(child);
  return {
    single: { p50: percentile(single, 50), p99: percentile(single, 99), n: single.length },
    samples,
    serverCpuMs,
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    sent: total,
    seen: samples.length,
    failed,
    achievedRate: total / elapsed,
    clientCpuPct: (100 * clientCpuMs) / (elapsed * 1000),
    serverCpuPct: (100 * serverCpuMs) / (elapsed * 1000),
    serverCpuUsPerNotify: (1000 * serverCpuMs) / total,
  };
}

/**
 * The same open loop (1,000/s for 5 s after a 1 s warm-up) against a floor server (bench-gateway-server.ts):
 * node:http alone, or express with its JSON parser alone, turning each POST into one datagram. What this
 * machine charges between a notify request and its datagram before the gateway does any work of its own.
 */
async function floorLatency(mode: 'floor-http' | 'floor-express', rate = 1000) {
  const observer = dgram.createSocket('udp4');
  await new Promise<void>((r) => observer.bind(0, '127.0.0.1', r));
  const sentAt = new Map<number, number>();
  const samples: number[] = [];
  observer.on('message', (m) => {
    const doc = JSON.parse(m.toString()) as { settings: { reporting_interval_s: number } };
    const t = sentAt.get(doc.settings.reporting_interval_s);
    if (t !== undefined) samples.push(performance.now() - t);
  });
  const child = await startChild(mode, '', { BENCH_OBSERVER_PORT: String(observer.address().port) });
  const client = new RawHttpClient(child.httpPort, 64);
  const post = (value: number): Promise<number> => {
    sentAt.set(value, performance.now());
    return client.post('/api/notify-settings', notifyBody(value));
  };
  await openLoop(rate, rate, (i) => post(10 + i));
  samples.length = 0;
  const serverCpu0 = await child.ask<{ cpuMs: number }>({ cmd: 'cpu' });
  await openLoop(rate, rate * 5, (i) => post(10 + rate + i));
  await new Promise((r) => setTimeout(r, 300));
  const serverCpuMs = (await child.ask<{ cpuMs: number }>({ cmd: 'cpu' })).cpuMs - serverCpu0.cpuMs;
  samples.sort((a, b) => a - b);
  client.close();
  observer.close();
  await stopChild(child);
  return {
    samples,
    serverCpuMs,
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    seen: samples.length,
    cpuUsPerRequest: (1000 * serverCpuMs) / (rate * 5),
  };
}

type GatewayLatency = Awaited<ReturnType<typeof latency>>;
type FloorLatency = Awaited<ReturnType<typeof floorLatency>>;

interface NotifyRound {
  con: GatewayLatency;
  non: GatewayLatency;
  floorHttp: FloorLatency;
  floorExpress: FloorLatency;
}

/**
 * notify-settings over HTTP → device (CON and NON observers) and the floors under it; prints the four and the
 * ratios to the express floor. `floorsFirst` reverses the order, so that rounds alternate (ABBA) and a drift of
 * the machine's speed during a round does not favour whichever runs first.
 */
async function notifyRound(url: string, label: string, floorsFirst = false): Promise<NotifyRound> {
  const gateway = async () => ({ con: await latency(url), non: await latency(url, 1000, false) });
  const floors = async () => ({
    floorHttp: await floorLatency('floor-http'),
    floorExpress: await floorLatency('floor-express'),
  });
  let round: NotifyRound;
  if (floorsFirst) {
    const f = await floors();
    round = { ...(await gateway()), ...f };
  } else {
    const g = await gateway();
    round = { ...g, ...(await floors()) };
  }
  const { con: lat, non, floorHttp, floorExpress } = round;
  console.log(
    `\n== notify-settings over HTTP → device${label === '' ? '' : ` (${label}${floorsFirst ? ', floors first' : ''})`} — load average ${loadavg()[0]!.toFixed(2)} ==`,
  );
  console.log(
    `one at a time (closed loop, ${lat.single.n}): p50 ${lat.single.p50.toFixed(3)} ms   p99 ${lat.single.p99.toFixed(3)} ms`,
  );
  console.log(
    `open loop ${lat.achievedRate.toFixed(0)}/s for 5 s: p50 ${lat.p50.toFixed(3)} ms   p99 ${lat.p99.toFixed(3)} ms   (${lat.seen}/${lat.sent} values delivered, the rest superseded per RFC 7641 4.5.2; ${lat.failed} non-200)`,
  );
  console.log(
    `  CPU: gateway ${lat.serverCpuPct.toFixed(0)} % of a core (${lat.serverCpuUsPerNotify.toFixed(0)} µs per notify), client ${lat.clientCpuPct.toFixed(0)} % of a core`,
  );
  console.log(
    `NON observer, open loop ${non.achievedRate.toFixed(0)}/s: p50 ${non.p50.toFixed(3)} ms   p99 ${non.p99.toFixed(3)} ms   (${non.seen}/${non.sent} delivered; ${non.serverCpuUsPerNotify.toFixed(0)} µs CPU per notify)`,
  );
  // The floor under that figure on this machine: the same load against servers that only parse and send.
  for (const [f, name] of [
    [floorHttp, 'node:http alone'],
    [floorExpress, 'express + express.json alone'],
  ] as const) {
    console.log(
      `  floor, ${name.padEnd(29)} p50 ${f.p50.toFixed(3)} ms   p99 ${f.p99.toFixed(3)} ms   (${f.seen} of 5000; ${f.cpuUsPerRequest.toFixed(0)} µs CPU each)${f === floorExpress ? `   gateway/floor p99 ${ratio(lat.p99, f.p99)} (CON), ${ratio(non.p99, f.p99)} (NON)` : ''}`,
    );
  }
  return round;
}

/**
 * The rounds together: each system's samples pooled over all rounds (5,000 per round), so the p99 rests on
 * 50 samples per round instead of 50 in all; a round's p99 moves by half whenever the machine happens to
 * stall a few more times in those 5 s (the stalls are the host's: docs/benchmarks.md).
 */
function printPooled(rounds: readonly NotifyRound[]): void {
  const pool = (pick: (r: NotifyRound) => { samples: number[] }): number[] =>
    rounds.flatMap((r) => pick(r).samples).sort((a, b) => a - b);
  const cpu = (pick: (r: NotifyRound) => { serverCpuMs: number }): number =>
    (1000 * rounds.reduce((sum, r) => sum + pick(r).serverCpuMs, 0)) / (rounds.length * 5000);
  const con = pool((r) => r.con);
  const non = pool((r) => r.non);
  const http = pool((r) => r.floorHttp);
  const exp = pool((r) => r.floorExpress);
  const median = (values: number[]): number => {
    const sorted = [...values].sort((a, b) => a - b);
    const mid = Math.floor(sorted.length / 2);
    return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
  };
  const perRound = (pick: (r: NotifyRound) => { p99: number }): string =>
    `median of rounds ${median(rounds.map((r) => pick(r).p99 / r.floorExpress.p99)).toFixed(2)}x`;
  console.log(
    `\n== notify-settings, ${rounds.length} rounds pooled (${con.length} CON, ${non.length} NON samples) ==`,
  );
  const line = (name: string, sorted: number[], cpuUs: number, extra = ''): void =>
    console.log(
      `${name.padEnd(32)} p50 ${percentile(sorted, 50).toFixed(3)} ms   p99 ${percentile(sorted, 99).toFixed(3)} ms   ${cpuUs.toFixed(0)} µs CPU each${extra}`,
    );
  line(
    'gateway, CON observer',
    con,
    cpu((r) => r.con),
    `   p99/floor ${ratio(percentile(con, 99), percentile(exp, 99))} (${perRound((r) => r.con)})`,
  );
  line(
    'gateway, NON observer',
    non,
    cpu((r) => r.non),
    `   p99/floor ${ratio(percentile(non, 99), percentile(exp, 99))} (${perRound((r) => r.non)})`,
  );
  line(
    'floor, node:http alone',
    http,
    cpu((r) => r.floorHttp),
  );
  line(
    'floor, express + express.json',
    exp,
    cpu((r) => r.floorExpress),
  );
  console.log(
    `CPU per notify, gateway/express floor: ${ratio(
      cpu((r) => r.con),
      cpu((r) => r.floorExpress),
    )} (CON), ${ratio(
      cpu((r) => r.non),
      cpu((r) => r.floorExpress),
    )} (NON)`,
  );
}

/**
 * How a fan-out ran: the delivery record on (written to PostgreSQL), on with its batches built and discarded
 * (BENCH_DELIVERY=discard: the gateway's own cost, without the database's upserts on the same two cores), off.
 */
type DeliveryMode = 'on' | 'discard' | 'off';

/** The delivery record's cost: fan-out rate per mode against off (pooled over the runs given), what was written. */
function printDelivery(
  n: number,
  runs: readonly { mode: DeliveryMode; r: Awaited<ReturnType<typeof measure>> }[],
): void {
  const of = (mode: DeliveryMode) => runs.filter((x) => x.mode === mode).map((x) => x.r);
  const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
  const off = of('off');
  console.log(
    `\n== delivery record at ${n} CON observers (${runs.map((x) => x.mode).join(', ')}) — load average ${loadavg()[0]!.toFixed(2)} ==`,
  );
  for (const mode of ['on', 'discard', 'off'] as const) {
    const rs = of(mode);
    if (rs.length === 0) continue;
    const rates = rs.map((r) => r.fanoutPerS.toFixed(0)).join(', ');
    const cpu = rs.map((r) => r.serverCpuMs.toFixed(0)).join(', ');
    const vsOff =
      mode === 'off'
        ? ''
        : `   ${mode}/off: rate ${ratio(mean(rs.map((r) => r.fanoutPerS)), mean(off.map((r) => r.fanoutPerS)))}, server CPU ${ratio(mean(rs.map((r) => r.serverCpuMs)), mean(off.map((r) => r.serverCpuMs)))}`;
    console.log(`fan-out notifications/s ${mode.padEnd(7)} ${rates}   server CPU ${cpu} ms${vsOff}`);
  }
  for (const x of runs)
    console.log(
      `  ${x.mode.padEnd(7)}: lost ${x.r.lost}, duplicated ${x.r.duplicates}, retransmissions ${x.r.stats.retransmissions ?? 0}, server CPU ${x.r.serverCpuMs.toFixed(0)} ms, end to end ${x.r.endToEnd.toFixed(2)} s, heap/RSS per relation ${kb(x.r.heapPerRelation)}/${kb(x.r.rssPerRelation)}`,
    );
  const lag = (w: LagWindow | undefined): string =>
    w === undefined
      ? '-'
      : `max ${w.maxS.toFixed(2)} s, p99 ${w.p99S.toFixed(2)} s (${w.samples} samples over ${(w.windowMs / 1000).toFixed(1)} s), longest flush ${w.maxFlushMs.toFixed(0)} ms`;
  for (const r of of('on')) {
    const d = r.delivery;
    if (d !== undefined) {
      // The fan-out's flushes only (stats.maxFlushMs since the child's start would include the registrations').
      console.log(
        `  PostgreSQL: ${d.rows} rows in ${d.flushes} flushes (${Number.isNaN(d.earlyFlushes) ? '-' : d.earlyFlushes} early, ${Number.isNaN(d.chunks) ? '-' : d.chunks} calls, ${d.failures} failed), ${d.rowsPerS.toFixed(0)} rows/s over the fan-out (${((1000 * d.rows) / Math.max(1, d.msPerFlush * d.flushes)).toFixed(0)} rows/s while writing), ${d.msPerFlush.toFixed(0)} ms per flush (max ${(d.fanLag?.maxFlushMs ?? NaN).toFixed(0)} ms)`,
      );
      console.log(`    record lag, fan-out:       ${lag(d.fanLag)}`);
      console.log(`    record lag, registrations: ${lag(d.regLag)}`);
    }
  }
}

/**
 * notify → device over plain CoAP and over DTLS in the same seconds: two fresh gateway children, one plain and
 * one serving coaps as well, each with device 0 observed from this process by a client that answers at once
 * (the raw observer; the testkit's PSK client, whose device is `dtlsDevice`). One open loop at `rate`/s takes
 * turns: 100 ms to one gateway, 100 ms to the other, BENCH_WARM_S (4) s each not counted, then 5 s each. Whatever else the machine does in those seconds (another process, a slow second)
 * falls on both sets of samples alike: with one window after the other (BENCH_DTLS_LATENCY=sequential), the
 * difference between two windows' tails was as large as the one between the transports. Each sample runs from
 * its own request's write to its own notification's arrival. Returns the samples, sorted.
 */
/** A gateway child's event loop over a window (bench-gateway-server.ts `loopMonitor`, BENCH_LOOP=true). */
interface LoopFigures {
  delayP99Ms: number;
  delayMaxMs: number;
  gcs: number;
  gcMs: number;
  gcMaxMs: number;
  /** Pauses (ms) of minor (scavenge) and major (mark-compact) collections. */
  minor: number[];
  major: number[];
}

const loopText = (l: LoopFigures | undefined): string =>
  l === undefined
    ? ''
    : `loop delay p99/max ${l.delayP99Ms.toFixed(2)}/${l.delayMaxMs.toFixed(2)} ms, ${l.gcs} GCs ${l.gcMs.toFixed(1)} ms ` +
      `(minor ${l.minor.map((x) => x.toFixed(1)).join(' ')}; major ${l.major.map((x) => x.toFixed(1)).join(' ')})`;

async function pairedLatency(
  url: string,
  dtlsDevice: string,
  rate: number,
  confirmable: boolean,
): Promise<{
  plain: number[];
  dtls: number[];
  answers: { plain: number[]; dtls: number[] };
  gaps: { plain: number[]; dtls: number[] };
  loops: { plain?: LoopFigures; dtls?: LoopFigures };
}> {
  const plainChild = await startChild('gateway', url);
  const dtlsChild = await startChild('gateway', url, { BENCH_COAP_SECURITY: 'both' });
  const observers = new Observers(plainChild.coapPort, 1, confirmable);
  await observers.open();
  await observers.registerAll();
  observers.mark();
  const device = await openDtlsObserver(dtlsChild.coapsPort!, dtlsDevice, confirmable);
  const side = (child: Child, device: string) => {
    const sentAt = new Map<number, number>();
    // When the value's notification, and its request's 200, arrived (whichever came first waits for the other).
    const notifiedAt = new Map<number, number>();
    const answeredAt = new Map<number, number>();
    const samples: number[] = [];
    /** Request written → its 200 read: the HTTP path into the gateway (the handler answers once it has sent). */
    const answers: number[] = [];
    /** Notification arrived − its request's 200 arrived: what the CoAP (or DTLS) path adds after the send. */
    const gaps: number[] = [];
    const pair = (value: number, mine: Map<number, number>, other: Map<number, number>, at: number): void => {
      const t = other.get(value);
      if (t === undefined) mine.set(value, at);
      else {
        other.delete(value);
        gaps.push(mine === notifiedAt ? at - t : t - at);
      }
    };
    return {
      device,
      samples,
      answers,
      gaps,
      sentAt,
      client: new RawHttpClient(child.httpPort, 64, { authorization: 'Bearer bench-key' }),
      arrived(value: number, at: number): void {
        const t = sentAt.get(value);
        if (t === undefined) return;
        sentAt.delete(value);
        samples.push(at - t);
        pair(value, notifiedAt, answeredAt, at);
      },
      answered(value: number, sent: number): void {
        const at = performance.now();
        answers.push(at - sent);
        pair(value, answeredAt, notifiedAt, at);
      },
      reset(): void {
        for (const x of [samples, answers, gaps]) x.length = 0;
        notifiedAt.clear();
        answeredAt.clear();
      },
    };
  };
  const p = side(plainChild, deviceId(0));
  const d = side(dtlsChild, dtlsDevice);
  const sides = [p, d];
  observers.onEveryNotification = (payload, at) => {
    const doc = JSON.parse(payload.toString()) as { settings: { reporting_interval_s: number } };
    p.arrived(doc.settings.reporting_interval_s, at);
  };
  device.onValue = (value, at) => d.arrived(value, at);
  const post = async (side: typeof p, value: number): Promise<void> => {
    const t = performance.now();
    side.sentAt.set(value, t);
    await side.client.post(
      '/api/notify-settings',
      JSON.stringify({ device_id: side.device, settings: { reporting_interval_s: value } }),
    );
    side.answered(value, t);
  };
  // Request i of the loop goes to one side for 100 ms (`slice` requests), then to the other, so each gateway sees
  // `rate`/s while it is measured and the machine carries one stream of notifies, as in the sequential design.
  const slice = Math.max(1, Math.round(rate / 10));
  const to = (i: number): typeof p => (Math.floor(i / slice) % 2 === 0 ? p : d);
  await openLoop(rate, 2 * WARM_S * rate, (i) => post(to(i), 10 + i));
  await new Promise((r) => setTimeout(r, 100));
  for (const side of sides) side.reset();
  const children = [plainChild, dtlsChild];
  for (const c of children) await c.ask({ cmd: 'loop', reset: true });
  await openLoop(rate, 2 * 5 * rate, (i) => post(to(i), 10 + 2 * WARM_S * rate + i));
  const loops = await Promise.all(children.map((c) => c.ask<{ loop?: LoopFigures }>({ cmd: 'loop' })));
  await new Promise((r) => setTimeout(r, 500));
  for (const side of sides) side.client.close();
  observers.close();
  device.close();
  await stopChild(plainChild);
  await stopChild(dtlsChild);
  const sorted = (x: number[]): number[] => x.sort((a, b) => a - b);
  return {
    plain: sorted(p.samples),
    dtls: sorted(d.samples),
    answers: { plain: sorted(p.answers), dtls: sorted(d.answers) },
    gaps: { plain: sorted(p.gaps), dtls: sorted(d.gaps) },
    loops: { plain: loops[0]!.loop, dtls: loops[1]!.loop },
  };
}

/**
 * BENCH_ONLY=dtls: the plain fan-out and the DTLS fan-out with each client, BENCH_ROUNDS rounds, the order
 * rotating so that no kind always runs first (or last) in a round; each on a fresh gateway child, all reading the
 * same registry and credentials. Capacity is plain ÷ DTLS server CPU per notification, its ACK included.
 */
async function dtlsCapacityRounds(
  url: string,
  owner: ReturnType<typeof createDb<GatewayDatabase>>,
  ids: string[],
): Promise<void> {
  const n = ids.length;
  type Kind = 'plain' | 'independent' | 'node-dtls-client';
  const orders: Kind[][] = [
    ['plain', 'independent', 'node-dtls-client'],
    ['node-dtls-client', 'independent', 'plain'],
    ['independent', 'plain', 'node-dtls-client'],
    ['node-dtls-client', 'plain', 'independent'],
  ];
  const total = { plain: 0, independent: 0, 'node-dtls-client': 0 };
  const usPer = (cpuMs: number): string => `${((1000 * cpuMs) / n).toFixed(1)} µs`;
  const p99Ratios: string[] = [];
  const allPlain: number[] = [];
  const allDtls: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const cpu = { plain: 0, independent: 0, 'node-dtls-client': 0 };
    const notes: string[] = [];
    for (const kind of FANOUTS ? orders[r % orders.length]! : []) {
      if (kind === 'plain') {
        const g = await measure('gateway', n, url, owner, 100 + r);
        cpu.plain = g.serverCpuMs;
        notes.push(`plain lost ${g.lost} dup ${g.duplicates} client ${usPer(g.clientCpuMs)}`);
      } else {
        const child = await startChild('gateway', url, { BENCH_COAP_SECURITY: 'both' });
        const f = await dtlsFanout(child, owner, ids, 5000 + 10 * r + (kind === 'independent' ? 1 : 2), kind);
        await stopChild(child);
        cpu[kind] = f.serverCpuMs;
        notes.push(`${kind} lost ${f.lost} dup ${f.duplicates} client ${usPer(f.clientCpuMs)}`);
      }
    }
    for (const k of Object.keys(total) as Kind[]) total[k] += cpu[k];
    // notify → device at 1,000/s, both devices in this process answering at once (the plain raw observer, the
    // testkit PSK client): taking turns every 100 ms (pairedLatency) unless BENCH_DTLS_LATENCY=sequential
    // (the sixth pass's design: each on a fresh child, one after the other, the order alternating).
    let plain: number[];
    let dtls: number[];
    let answers = '';
    const shape2 = (x: number[]): string => [50, 99].map((q) => percentile(x, q).toFixed(2)).join('/');
    if (!SEQUENTIAL_LATENCY) {
      const paired = await pairedLatency(url, ids[0]!, 1000, !NON_LATENCY);
      ({ plain, dtls } = paired);
      answers =
        `; HTTP answer p50/p99 plain ${shape2(paired.answers.plain)}, dtls ${shape2(paired.answers.dtls)} ms ` +
        `(${ratio(percentile(paired.answers.dtls, 99), percentile(paired.answers.plain, 99))}); ` +
        `notification − answer p50/p99 plain ${shape2(paired.gaps.plain)}, dtls ${shape2(paired.gaps.dtls)} ms` +
        (paired.loops.plain === undefined
          ? ''
          : `; children: plain ${loopText(paired.loops.plain)}; dtls ${loopText(paired.loops.dtls)}`);
    } else {
      const plainSamples = async () => (await latency(url, 1000, !NON_LATENCY)).samples;
      const dtlsSamples = async () => {
        const child = await startChild('gateway', url, { BENCH_COAP_SECURITY: 'both' });
        const l = await dtlsLatency(child, ids[0]!, 1000, 'in-process', 'independent', !NON_LATENCY);
        await stopChild(child);
        return l.samples;
      };
      if (r % 2 === 0) {
        plain = await plainSamples();
        dtls = await dtlsSamples();
      } else {
        dtls = await dtlsSamples();
        plain = await plainSamples();
      }
    }
    allPlain.push(...plain);
    allDtls.push(...dtls);
    const p99Ratio = ratio(percentile(dtls, 99), percentile(plain, 99));
    p99Ratios.push(p99Ratio);
    const shape = (x: number[]): string =>
      [50, 90, 99, 99.9].map((q) => percentile(x, q).toFixed(2)).join('/');
    const capacity = FANOUTS
      ? `server CPU per notification plain ${usPer(cpu.plain)}, dtls answering at once ${usPer(cpu.independent)} ` +
        `(capacity ${ratio(cpu.plain, cpu.independent)}), dtls node-dtls-client ${usPer(cpu['node-dtls-client'])} ` +
        `(capacity ${ratio(cpu.plain, cpu['node-dtls-client'])}); ${notes.join(', ')}; `
      : '';
    console.log(
      `round ${r + 1} of ${ROUNDS} (${FANOUTS ? `${orders[r % orders.length]!.join(', ')}; ` : ''}load ${loadavg()[0]!.toFixed(2)}): ` +
        `${capacity}notify → device at 1,000/s p50/p90/p99/p99.9 plain ${shape(plain)} ms, dtls ${shape(dtls)} ms, p99 dtls/plain ${p99Ratio}${answers}`,
    );
  }
  if (ROUNDS <= 1) return;
  allPlain.sort((a, b) => a - b);
  allDtls.sort((a, b) => a - b);
  if (FANOUTS)
    console.log(
      `pooled over ${ROUNDS} rounds: plain ${usPer(total.plain / ROUNDS)}, dtls answering at once ${usPer(total.independent / ROUNDS)} ` +
        `(capacity ${ratio(total.plain, total.independent)}), dtls node-dtls-client ${usPer(total['node-dtls-client'] / ROUNDS)} ` +
        `(capacity ${ratio(total.plain, total['node-dtls-client'])})`,
    );
  console.log(
    `notify → device p99 dtls/plain per round ${p99Ratios.join(', ')}; all rounds' samples pooled: ` +
      `p99 plain ${percentile(allPlain, 99).toFixed(2)} ms, dtls ${percentile(allDtls, 99).toFixed(2)} ms (${ratio(percentile(allDtls, 99), percentile(allPlain, 99))})`,
  );
}

async function main(): Promise<void> {
  console.log(`bench:gateway — loopback, ${ROWS} registry rows, sizes ${SIZES.join(', ')}`);
  const pg = await startPostgres();
  // BENCH_PG_NICE=19: PostgreSQL (the postmaster, so every backend it forks) at that nice level. In production the
  // database is another machine; here it shares two cores with the gateway and the load generator, and the
  // delivery record's writes (design §3.8) would otherwise take the CPU the fan-out under test needs.
  const pgNice = process.env.BENCH_PG_NICE;
  if (pgNice !== undefined && pg.pid !== undefined) {
    execFileSync('renice', ['-n', pgNice, '-p', String(pg.pid)]);
    console.log(`PostgreSQL at nice ${pgNice} (BENCH_PG_NICE)`);
  }
  // BENCH_PG_CPUS=0 BENCH_GATEWAY_CPUS=1: PostgreSQL (the postmaster and the processes it has started; the
  // backends it forks later inherit it) on those CPUs, and this process (the load generator) on the others, with
  // every gateway child it forks from here on (they inherit it): "the database on another host" on a small
  // machine, the same in every mode, so the on/off ratios compare like with like.
  const pgCpus = cpuList('BENCH_PG_CPUS', process.env.BENCH_PG_CPUS);
  const gatewayCpus = cpuList('BENCH_GATEWAY_CPUS', process.env.BENCH_GATEWAY_CPUS);
  if (pgCpus !== undefined && pg.pid !== undefined)
    console.log(`PostgreSQL on CPUs ${pgCpus} (BENCH_PG_CPUS): ${pinTree(pg.pid, pgCpus)} processes pinned`);
  if (gatewayCpus !== undefined)
    console.log(
      // This process alone: PostgreSQL, which it started, is one of its children.
      `load generator and gateway children on CPUs ${gatewayCpus} (BENCH_GATEWAY_CPUS): ${pinTree(process.pid, gatewayCpus, false)} process pinned`,
    );
  try {
    const owner = createDb<GatewayDatabase>(pg.url, { max: 2 });
    if (pgCpus !== undefined || gatewayCpus !== undefined) {
      // What the kernel says, for the record: the postmaster, a backend forked after the pinning, and this process
      // (a first run pinned PostgreSQL's tree again with this process's children, so it is checked).
      const { rows } = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(owner);
      console.log(
        `CPUs allowed: postmaster ${allowedCpus(pg.pid ?? 0)}, a new backend ${allowedCpus(rows[0]!.pid)}, load generator ${allowedCpus(process.pid)}`,
      );
    }
    await migrateToLatest(owner, [gatewayMigrations]);
    await seedBenchRegistry(owner, ROWS);
    const url = gatewayLoginUrl(pg.url);

    console.log(
      `load average at start: ${loadavg()
        .map((l) => l.toFixed(2))
        .join(' ')} on ${cpus().length} cores`,
    );
    if (ONLY_DELIVERY) {
      const n = Math.max(...SIZES);
      const runs: { mode: DeliveryMode; r: Awaited<ReturnType<typeof measure>> }[] = [];
      // BENCH_DELIVERY_MODES: the children's modes in order (e.g. `discard,off` for a profile); the default
      // sequence pairs each mode with the others within the run.
      const modes = (process.env.BENCH_DELIVERY_MODES ?? 'on,discard,off,off,discard,on')
        .split(',')
        .filter((m): m is DeliveryMode => m === 'on' || m === 'discard' || m === 'off');
      for (const mode of modes)
        runs.push({
          mode,
          r: await measure('gateway', n, url, owner, runs.length, {
            ...(mode === 'on' ? {} : { BENCH_DELIVERY: mode === 'off' ? 'false' : 'discard' }),
          }),
        });
      printDelivery(n, runs);
      await benchDeviceReads(url, owner, deviceId, ROWS);
      await owner.destroy();
      return;
    }
    if (ONLY_ROLLOUT) {
      await benchRollout({
        url,
        owner,
        pgPid: pg.pid,
        n: Math.max(...SIZES),
        startChild,
        stopChild,
        observers: (port, n) => new Observers(port, n),
      });
      await owner.destroy();
      return;
    }
    if (ONLY_REPORTS) {
      await benchReports({
        url,
        owner,
        rounds: ROUNDS,
        startChild: (env) => startChild('gateway', url, env),
        stopChild: (child) => stopChild(child as Child),
      });
      await owner.destroy();
      return;
    }
    if (ONLY_NOTIFY) {
      const rounds: NotifyRound[] = [];
      for (let r = 1; r <= ROUNDS; r++)
        rounds.push(await notifyRound(url, `round ${r} of ${ROUNDS}`, r % 2 === 0));
      if (ROUNDS > 1) printPooled(rounds);
      await owner.destroy();
      return;
    }
    // The DTLS devices' keys are in the database from the start, so that every gateway child's reload (the plain
    // fan-out's included) reads the same registry and credentials: a DTLS fan-out's CPU then differs from a
    // plain one's by the transport, not by loading 10,000 credentials the plain reload did not have.
    const dtlsN = Number(process.env.BENCH_DTLS_OBSERVERS ?? 10_000);
    const ids = Array.from({ length: dtlsN }, (_, i) => deviceId(i));
    await issueBenchKeys(owner, ids);
    let round = 0;
    if (ONLY_DTLS) {
      await dtlsCapacityRounds(url, owner, ids);
      await owner.destroy();
      return;
    }
    let deliveryOn: Awaited<ReturnType<typeof measure>> | undefined;
    const plainFanout = new Map<number, number>();
    const plainFanoutCpuMs = new Map<number, number>();
    const plainFanoutSystemMs = new Map<number, number>();
    for (const n of SIZES) {
      const g = await measure('gateway', n, url, owner, round++);
      if (n === Math.max(...SIZES)) deliveryOn = g;
      plainFanout.set(n, g.fanoutPerS);
      plainFanoutCpuMs.set(n, g.serverCpuMs);
      plainFanoutSystemMs.set(n, g.serverSystemMs);
      const c = await measure('nodecoap', n, url, owner, round++);
      const pct = (x: number): string => `${((100 * x) / n).toFixed(2)} %`;
      console.log(`\n== ${n} observe relations (CON) — load average ${loadavg()[0]!.toFixed(2)} ==`);
      console.log(
        `heap per relation       gateway ${kb(g.heapPerRelation)}   node-coap ${kb(c.heapPerRelation)}   node-coap/gateway ${ratio(c.heapPerRelation, g.heapPerRelation)}`,
      );
      console.log(
        `RSS per relation        gateway ${kb(g.rssPerRelation)}   node-coap ${kb(c.rssPerRelation)}   node-coap/gateway ${ratio(c.rssPerRelation, g.rssPerRelation)}`,
      );
      console.log(
        `registrations/s         gateway ${g.regPerS.toFixed(0)}   node-coap ${c.regPerS.toFixed(0)}   gateway/node-coap ${ratio(g.regPerS, c.regPerS)}`,
      );
      console.log(
        `  CPU ms (server/client) gateway ${g.regServerCpuMs.toFixed(0)}/${g.regClientCpuMs.toFixed(0)}   node-coap ${c.regServerCpuMs.toFixed(0)}/${c.regClientCpuMs.toFixed(0)}`,
      );
      console.log(
        `fan-out notifications/s gateway ${g.fanoutPerS.toFixed(0)} (via reload)   node-coap ${c.fanoutPerS.toFixed(0)}   gateway/node-coap ${ratio(g.fanoutPerS, c.fanoutPerS)}`,
      );
      console.log(
        `  end to end            gateway ${g.endToEnd.toFixed(2)} s (reload incl. DB read + sends)   node-coap ${c.endToEnd.toFixed(2)} s`,
      );
      console.log(
        `  CPU ms (server/client) gateway ${g.serverCpuMs.toFixed(0)}/${g.clientCpuMs.toFixed(0)}   node-coap ${c.serverCpuMs.toFixed(0)}/${c.clientCpuMs.toFixed(0)}   (incl. a 3.5 s tail that counts late retransmissions)`,
      );
      console.log(
        `  lost                  gateway ${g.lost} (${pct(g.lost)})   node-coap ${c.lost} (${pct(c.lost)})`,
      );
      console.log(
        `  duplicated            gateway ${g.duplicates} (${pct(g.duplicates)})   node-coap ${c.duplicates} (${pct(c.duplicates)})`,
      );
      console.log(
        `  gateway: retransmissions ${g.stats.retransmissions ?? 0}, window-full pauses ${g.stats.windowFull ?? 0}, stale ${g.stale}`,
      );
      console.log(
        `reload of ${ROWS} rows with ${n} observers kept: ${g.reloadMs.toFixed(0)} ms (DB read + swap; notifications follow)`,
      );
    }
    // The delivery record (design §3.8): the largest fan-out again with recording off, same run.
    if (deliveryOn !== undefined) {
      const off = await measure('gateway', Math.max(...SIZES), url, owner, round++, {
        BENCH_DELIVERY: 'false',
      });
      printDelivery(Math.max(...SIZES), [
        { mode: 'on', r: deliveryOn },
        { mode: 'off', r: off },
      ]);
    }
    await benchDeviceReads(url, owner, deviceId, ROWS);
    const { con: lat } = await notifyRound(url, '');
    // CoAP over DTLS (design §3.5), beside the plain figures above.
    const dchild = await startChild('gateway', url, { BENCH_COAP_SECURITY: 'both' });
    const fan = await dtlsFanout(dchild, owner, ids, 500 + round++);
    await stopChild(dchild);
    // The same fan-out with observers that answer at once, as the plain ones do (bench-gateway-dtls.ts).
    const ichild = await startChild('gateway', url, { BENCH_COAP_SECURITY: 'both' });
    const ifan = await dtlsFanout(ichild, owner, ids, 500 + round++, 'independent');
    await stopChild(ichild);
    // A fresh child for the latency, as the plain figure has (see dtlsLatency).
    const lchild = await startChild('gateway', url, { BENCH_COAP_SECURITY: 'both' });
    const dlat = await dtlsLatency(lchild, deviceId(0));
    await stopChild(lchild);
    // Like with like: a device that answers at once (the testkit PSK client), taking turns with a plain one.
    const ilat = await pairedLatency(url, deviceId(0), 1000, true);
    // The same with the DTLS device in a process of its own (see dtlsLatency), on another fresh child.
    const ochild = await startChild('gateway', url, { BENCH_COAP_SECURITY: 'both' });
    const olat = await dtlsLatency(ochild, deviceId(0), 1000, 'own-process');
    await stopChild(ochild);
    const plainSameN = plainFanout.get(dtlsN);
    console.log(
      `\n== CoAP over DTLS 1.2 PSK (TLS_PSK_WITH_AES_128_CCM_8); client node-dtls-client 2.0.3 + coap-packet — load average ${loadavg()[0]!.toFixed(2)} ==`,
    );
    console.log(
      `${fan.observers} DTLS observers (CON): sessions opened + registered ${fan.sessionsPerS.toFixed(0)}/s (client-bound: handshakes and registrations overlap)`,
    );
    console.log(
      `fan-out notifications/s dtls ${fan.fanoutPerS.toFixed(0)} (via reload)${plainSameN === undefined ? '' : `   plain (same run, ${dtlsN}) ${plainSameN.toFixed(0)}   dtls/plain ${ratio(fan.fanoutPerS, plainSameN)}`}`,
    );
    console.log(
      `  lost ${fan.lost}   duplicated ${fan.duplicates}   server CPU ${fan.serverCpuMs.toFixed(0)} ms (incl. a 3 s tail)`,
    );
    const plainCpu = plainFanoutCpuMs.get(dtlsN);
    if (plainCpu !== undefined)
      console.log(
        `  server CPU per notification (its ACK included): dtls ${((1000 * fan.serverCpuMs) / dtlsN).toFixed(1)} µs   plain ${((1000 * plainCpu) / dtlsN).toFixed(1)} µs   capacity dtls/plain ${ratio(plainCpu, fan.serverCpuMs)}`,
      );
    if (plainCpu !== undefined)
      console.log(
        `  like with like, observers answering at once (testkit PSK client): dtls ${((1000 * ifan.serverCpuMs) / dtlsN).toFixed(1)} µs   capacity dtls/plain ${ratio(plainCpu, ifan.serverCpuMs)}   lost ${ifan.lost}   duplicated ${ifan.duplicates}   fan-out ${ifan.fanoutPerS.toFixed(0)}/s`,
      );
    const plainSystem = plainFanoutSystemMs.get(dtlsN);
    if (plainSystem !== undefined)
      console.log(
        `    of which in the kernel: dtls ${((1000 * fan.serverSystemMs) / dtlsN).toFixed(1)} µs   plain ${((1000 * plainSystem) / dtlsN).toFixed(1)} µs`,
      );
    console.log(
      `notify → device over DTLS, open loop 1,000/s for 5 s: p50 ${dlat.p50.toFixed(3)} ms   p99 ${dlat.p99.toFixed(3)} ms   (${dlat.seen}/${dlat.sent} delivered, the rest superseded)   plain p99 (same run) ${lat.p99.toFixed(3)} ms   dtls/plain p99 ${ratio(dlat.p99, lat.p99)}`,
    );
    console.log(
      `  like with like, a device answering at once (testkit PSK client) taking turns every 100 ms with a plain one (pairedLatency): p50 ${percentile(ilat.dtls, 50).toFixed(3)} ms   p99 ${percentile(ilat.dtls, 99).toFixed(3)} ms   plain p50 ${percentile(ilat.plain, 50).toFixed(3)} ms   p99 ${percentile(ilat.plain, 99).toFixed(3)} ms   dtls/plain p99 ${ratio(percentile(ilat.dtls, 99), percentile(ilat.plain, 99))}`,
    );
    console.log(
      `  the same, DTLS device in its own process: p50 ${olat.p50.toFixed(3)} ms   p99 ${olat.p99.toFixed(3)} ms   (${olat.seen}/${olat.sent} delivered)   dtls/plain p99 ${ratio(olat.p99, lat.p99)}`,
    );
    const hs = await runDtlsBench({ durationS: Number(process.env.DTLS_BENCH_DURATION_S ?? 5) });
    console.log(
      `PSK handshakes/s with the cookie exchange ${hs.handshakesPerSecond.toFixed(0)} (server CPU ${hs.serverCpuPerHandshakeMs.toFixed(3)} ms, client CPU ${hs.clientCpuPerHandshakeMs.toFixed(3)} ms per handshake; ${hs.handshakeErrors} errors)`,
    );
    console.log(
      `heap per idle established session at ${hs.sessions} sessions: ${hs.heapBytesPerSession.toFixed(0)} B (+ ${hs.externalBytesPerSession.toFixed(0)} B outside the heap); RSS ${hs.rssBytesPerSession.toFixed(0)} B`,
    );
    await owner.destroy();
  } finally {
    await pg.destroy();
  }
}

// Replicas (design §3.6): `--replicas N` measures cross-replica notify latency instead (bench-gateway-replicas.ts).
if (process.argv.includes('--replicas'))
  await (await import('./bench-gateway-replicas.js')).benchReplicas(process.argv);
else await main();
