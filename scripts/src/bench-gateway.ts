// `npm run bench:gateway`: the device gateway against a plain node-coap 1.5.0 server, in one run, on
// loopback with real sockets (issue 4 item 8). Prints figures and ratios; it is not a pass/fail test.
import { fork, type ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { gatewayMigrations, type GatewayDatabase } from '@platform/device-gateway';
import { startPostgres } from '@platform/testkit';
import { sql } from 'kysely';

const SIZES = (process.env.BENCH_SIZES ?? '10000,100000').split(',').map(Number);
const ROWS = Math.max(...SIZES);
// Many sockets: real devices are one endpoint each, and the gateway caps relations per endpoint (256).
const CLIENT_SOCKETS = Number(process.env.BENCH_CLIENT_SOCKETS ?? 1024);
const serverJs = fileURLToPath(new URL('./bench-gateway-server.js', import.meta.url));

interface Child {
  proc: ChildProcess;
  coapPort: number;
  httpPort: number;
  ask<T>(msg: unknown): Promise<T>;
}

async function startChild(mode: 'gateway' | 'nodecoap', databaseUrl: string): Promise<Child> {
  const proc = fork(serverJs, [mode], {
    // BENCH_PROFILE=<dir> writes a CPU profile per server child (node --cpu-prof) for the report.
    execArgv: [
      '--expose-gc',
      ...(process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE}`] : []),
    ],
    env: { ...process.env, BENCH_DATABASE_URL: databaseUrl },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const first = await new Promise<{ coapPort: number; httpPort: number }>((resolve, reject) => {
    proc.once('message', (m) => resolve(m as { coapPort: number; httpPort: number }));
    proc.once('exit', (code) => reject(new Error(`${mode} server exited with ${code}`)));
  });
  return {
    proc,
    coapPort: first.coapPort,
    httpPort: first.httpPort,
    ask: <T>(msg: unknown) =>
      new Promise<T>((resolve) => {
        proc.once('message', (m) => resolve(m as T));
        proc.send(msg as object);
      }),
  };
}

/** Asks the child to exit (so a CPU profile is written), killing it if it does not within 5 s. */
async function stopChild(child: Child): Promise<void> {
  const exited = new Promise<void>((resolve) => child.proc.once('exit', () => resolve()));
  child.proc.send({ cmd: 'exit' });
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), 5000);
  await exited;
  clearTimeout(timer);
}

/** Raw CoAP observers: N relations over CLIENT_SOCKETS sockets, token = relation index (4 bytes). */
class Observers {
  readonly sockets: dgram.Socket[] = [];
  registered = 0;
  /** Per relation: notifications received since `mark()`, and message ids seen (duplicate detection). */
  received = new Uint8Array(0);
  lastMid = new Int32Array(0);
  answered = new Uint8Array(0);
  duplicates = 0;
  notifications = 0;
  lastAt = 0;
  firstAt = 0;
  onNotification: ((index: number, payload: Buffer, at: number) => void) | undefined;

  constructor(
    readonly port: number,
    readonly n: number,
  ) {
    this.received = new Uint8Array(n);
    this.lastMid = new Int32Array(n).fill(-1);
    this.answered = new Uint8Array(n);
  }

  async open(): Promise<void> {
    for (let i = 0; i < CLIENT_SOCKETS; i++) {
      const s = dgram.createSocket({ type: 'udp4', recvBufferSize: 8 << 20, sendBufferSize: 8 << 20 });
      s.on('message', (buf) => this.onMessage(s, buf));
      await new Promise<void>((r) => s.bind(0, '127.0.0.1', r));
      this.sockets.push(s);
    }
  }

  private onMessage(s: dgram.Socket, buf: Buffer): void {
    if (buf.length < 8) return;
    const type = (buf[0]! >> 4) & 3;
    const tkl = buf[0]! & 15;
    const mid = (buf[2]! << 8) | buf[3]!;
    if (tkl !== 4) return;
    const index = buf.readUInt32BE(4);
    if (index >= this.n) return;
    if (type === 0) s.send(Buffer.from([0x60, 0x00, buf[2]!, buf[3]!]), this.port, '127.0.0.1');
    if (type === 2) {
      if (this.answered[index] === 0) {
        this.answered[index] = 1;
        this.registered++;
      }
      return;
    }
    if (buf[1] !== 0x45) return; // 2.05 only
    this.notifications++;
    if (this.lastMid[index] === mid) {
      this.duplicates++;
      return;
    }
    this.lastMid[index] = mid;
    this.received[index] = Math.min(255, this.received[index]! + 1);
    this.lastAt = performance.now();
    if (this.firstAt === 0) this.firstAt = this.lastAt;
    if (this.onNotification !== undefined) {
      // The payload is the JSON document (an ETag byte may be 0xff, so do not search for the marker).
      this.onNotification(index, buf.subarray(buf.indexOf('{"device_id"')), this.lastAt);
    }
  }

  request(index: number, path: string, observe: boolean): Buffer {
    const segments = path.split('/').filter(Boolean);
    const parts: number[] = [0x44, 0x01, (index >> 8) & 0xff, index & 0xff];
    parts.push((index >>> 24) & 0xff, (index >> 16) & 0xff, (index >> 8) & 0xff, index & 0xff);
    let prev = 0;
    if (observe) {
      parts.push(0x60); // Observe (6), length 0 → value 0
      prev = 6;
    }
    for (const seg of segments) {
      const bytes = Buffer.from(seg);
      const delta = 11 - prev;
      if (bytes.length < 13) parts.push((delta << 4) | bytes.length);
      else parts.push((delta << 4) | 13, bytes.length - 13);
      parts.push(...bytes);
      prev = 11;
    }
    return Buffer.from(parts);
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
    const s = this.sockets[i % CLIENT_SOCKETS]!;
    s.send(this.request(i, `/devices/${deviceId(i)}/settings`, true), this.port, '127.0.0.1');
  }

  mark(): void {
    this.received.fill(0);
    this.duplicates = 0;
    this.notifications = 0;
    this.firstAt = 0;
  }

  /** Waits until every relation got a notification or nothing arrived for `idleMs`. */
  async settle(idleMs = 3000): Promise<void> {
    for (;;) {
      await new Promise((r) => setTimeout(r, 100));
      let got = 0;
      for (let i = 0; i < this.n; i++) if (this.received[i]! > 0) got++;
      if (got === this.n && performance.now() - this.lastAt > 300) return;
      if (performance.now() - this.lastAt > idleMs && this.lastAt > 0) return;
    }
  }

  got(): number {
    let got = 0;
    for (let i = 0; i < this.n; i++) if (this.received[i]! > 0) got++;
    return got;
  }

  close(): void {
    for (const s of this.sockets) s.close();
  }
}

const deviceId = (i: number): string => `bench-${String(i).padStart(6, '0')}`;
const kb = (bytes: number): string => `${(bytes / 1024).toFixed(2)} KB`;
const ratio = (a: number, b: number): string => `${(a / b).toFixed(2)}x`;

async function measure(
  mode: 'gateway' | 'nodecoap',
  n: number,
  databaseUrl: string,
  owner: ReturnType<typeof createDb<GatewayDatabase>>,
  round: number,
) {
  const child = await startChild(mode, databaseUrl);
  const base = await child.ask<{ heap: number; rss: number }>({ cmd: 'heap' });
  const obs = new Observers(child.coapPort, n);
  await obs.open();
  const regPerS = await obs.registerAll();
  await new Promise((r) => setTimeout(r, 500));
  const after = await child.ask<{ heap: number; rss: number; observers: number }>({ cmd: 'heap' });
  obs.mark();
  let reloadMs = 0;
  const t0 = performance.now();
  if (mode === 'gateway') {
    // Every device's settings change; the reload swaps the registry and notifies every observer.
    await sql`UPDATE device_gateway.device_registry SET desired_settings = jsonb_build_object('reporting_interval_s', ${100 + round}::int)`.execute(
      owner,
    );
    reloadMs = (await child.ask<{ ms: number }>({ cmd: 'reload' })).ms;
  } else {
    await child.ask({ cmd: 'fanout', value: 2 + round });
  }
  await obs.settle();
  const got = obs.got();
  // Rate from the first to the last notification received (the reload's database read and the UPDATE
  // before it are reported separately); end-to-end seconds include them.
  const seconds = (obs.lastAt - obs.firstAt) / 1000;
  const endToEnd = (obs.lastAt - t0) / 1000;
  const result = {
    heapPerRelation: (after.heap - base.heap) / n,
    rssPerRelation: (after.rss - base.rss) / n,
    observers: after.observers,
    regPerS,
    fanoutPerS: got / seconds,
    lost: n - got,
    duplicates: obs.duplicates,
    reloadMs,
    endToEnd,
  };
  obs.close();
  await stopChild(child);
  return result;
}

async function latency(
  databaseUrl: string,
): Promise<{ p50: number; p99: number; sent: number; seen: number }> {
  const child = await startChild('gateway', databaseUrl);
  const obs = new Observers(child.coapPort, 1);
  await obs.open();
  await obs.registerAll();
  const sentAt = new Map<number, number>();
  const samples: number[] = [];
  obs.onNotification = (_i, payload, at) => {
    const doc = JSON.parse(payload.toString()) as { settings: { reporting_interval_s: number } };
    const t = sentAt.get(doc.settings.reporting_interval_s);
    if (t !== undefined) samples.push(at - t);
  };
  const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
  const post = (value: number): Promise<void> =>
    new Promise((resolve) => {
      const body = JSON.stringify({ device_id: deviceId(0), settings: { reporting_interval_s: value } });
      const req = http.request(
        {
          host: '127.0.0.1',
          port: child.httpPort,
          path: '/api/notify-settings',
          method: 'POST',
          agent,
          headers: {
            'content-type': 'application/json',
            authorization: 'Bearer bench-key',
            'content-length': Buffer.byteLength(body),
          },
        },
        (res) => {
          res.resume();
          res.on('end', () => resolve());
        },
      );
      req.end(body);
    });
  // 1,000 notifies per second for 5 s, each with a distinct value so every notification is matched.
  const total = 5000;
  const t0 = performance.now();
  const pending: Promise<void>[] = [];
  for (let i = 0; i < total; i++) {
    const due = t0 + i;
    while (performance.now() < due) await new Promise((r) => setImmediate(r));
    const value = 10 + i;
    sentAt.set(value, performance.now());
    pending.push(post(value));
  }
  await Promise.all(pending);
  await new Promise((r) => setTimeout(r, 500));
  samples.sort((a, b) => a - b);
  const pct = (p: number) =>
    samples[Math.min(samples.length - 1, Math.floor((p / 100) * samples.length))] ?? NaN;
  agent.destroy();
  obs.close();
  await stopChild(child);
  return { p50: pct(50), p99: pct(99), sent: total, seen: samples.length };
}

async function main(): Promise<void> {
  console.log(`bench:gateway — loopback, ${ROWS} registry rows, sizes ${SIZES.join(', ')}`);
  const pg = await startPostgres();
  try {
    const owner = createDb<GatewayDatabase>(pg.url, { max: 2 });
    await migrateToLatest(owner, [gatewayMigrations]);
    await sql`
      INSERT INTO device_gateway.device_registry (device_id, site_id, name, model, desired_settings)
      SELECT 'bench-' || lpad(i::text, 6, '0'), 'a1000000-0000-4000-8000-000000000001', 'Bench device ' || i, 'bench',
             '{"reporting_interval_s": 60}'::jsonb
      FROM generate_series(0, ${ROWS - 1}) AS i`.execute(owner);
    const login = new URL(pg.url);
    login.username = 'device_gateway_login';
    login.password = 'device-gateway-dev';
    const url = login.toString();

    let round = 0;
    for (const n of SIZES) {
      const g = await measure('gateway', n, url, owner, round++);
      const c = await measure('nodecoap', n, url, owner, round++);
      console.log(`\n== ${n} observe relations (CON) ==`);
      console.log(
        `heap per relation      gateway ${kb(g.heapPerRelation)}   node-coap ${kb(c.heapPerRelation)}   ratio ${ratio(c.heapPerRelation, g.heapPerRelation)} smaller`,
      );
      console.log(
        `RSS per relation       gateway ${kb(g.rssPerRelation)}   node-coap ${kb(c.rssPerRelation)}`,
      );
      console.log(
        `registrations/s        gateway ${g.regPerS.toFixed(0)}   node-coap ${c.regPerS.toFixed(0)}   ratio ${ratio(g.regPerS, c.regPerS)}`,
      );
      console.log(
        `fan-out notifications/s gateway ${g.fanoutPerS.toFixed(0)} (via reload)   node-coap ${c.fanoutPerS.toFixed(0)}   ratio ${ratio(g.fanoutPerS, c.fanoutPerS)}`,
      );
      console.log(
        `fan-out end to end     gateway ${g.endToEnd.toFixed(2)} s (UPDATE + reload + sends)   node-coap ${c.endToEnd.toFixed(2)} s`,
      );
      console.log(`lost                   gateway ${g.lost}   node-coap ${c.lost}`);
      console.log(
        `duplicated             gateway ${g.duplicates} (${((100 * g.duplicates) / n).toFixed(2)} %)   node-coap ${c.duplicates} (${((100 * c.duplicates) / n).toFixed(2)} %)`,
      );
      console.log(
        `reload of ${ROWS} rows with ${n} observers kept: ${g.reloadMs.toFixed(0)} ms (includes the DB read)`,
      );
    }
    const lat = await latency(url);
    console.log(`\n== notify-settings over HTTP → device, 1,000/s for 5 s ==`);
    console.log(
      `p50 ${lat.p50.toFixed(3)} ms   p99 ${lat.p99.toFixed(3)} ms   (${lat.seen}/${lat.sent} notifications matched)`,
    );
    await owner.destroy();
  } finally {
    await pg.destroy();
  }
}

await main();
