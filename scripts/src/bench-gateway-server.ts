// Child process of `npm run bench:gateway`: runs ONE server under test (so heap figures are its own) and
// obeys the parent over IPC. Mode `gateway`: the real gateway (buildApp, CoAP + HTTP, registry in
// PostgreSQL). Mode `nodecoap`: a plain node-coap 1.5.0 server holding one `res` per observe relation and
// calling res.write() per notification — the approach design §3.7 describes. Modes `floor-http` and
// `floor-express`: the least an HTTP → UDP notify can cost here, with node:http alone or express with its
// JSON parser alone (no auth, logging, validation or state): each POST's body goes out as one datagram to
// BENCH_OBSERVER_PORT and is answered 200.
import dgram from 'node:dgram';
import { createServer as createHttpServer } from 'node:http';
import { monitorEventLoopDelay, PerformanceObserver } from 'node:perf_hooks';
import type { AddressInfo } from 'node:net';
import express from 'express';
import { createLogger, createDb, SecretSet } from '@platform/service-kit';
import { buildApp, loadGatewayConfig, type GatewayDatabase } from '@platform/device-gateway';
import { createServer, type IncomingMessage, type OutgoingMessage } from 'coap';

type Command =
  | { cmd: 'heap' }
  | { cmd: 'cpu' }
  | { cmd: 'stats' }
  | { cmd: 'reload' }
  | { cmd: 'fanout'; value: number }
  | { cmd: 'flush' }
  | { cmd: 'lag-start' }
  | { cmd: 'lag-wait' }
  | { cmd: 'lag-stop' }
  | { cmd: 'loop'; reset?: boolean }
  | { cmd: 'exit' };

const cpuMs = (): number => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

// Never outlive the benchmark that started this process.
process.on('disconnect', () => process.exit(0));

const send = (msg: unknown): void => {
  process.send?.(msg);
};

function heap(): { heap: number; rss: number; observers: number } {
  const gc = (globalThis as { gc?: () => void }).gc;
  gc?.();
  gc?.();
  const m = process.memoryUsage();
  return { heap: m.heapUsed, rss: m.rss, observers: observers() };
}

let observers = (): number => 0;

/**
 * BENCH_LOOP=true: the gateway child's event-loop delay (sampled every 2 ms) and garbage-collection pauses, read
 * (and started afresh) by the `loop` command: where a latency tail inside the child comes from. Off by default,
 * since the sampling timer is work the child would not otherwise do.
 */
function loopMonitor(): (reset: boolean) => unknown {
  if (process.env.BENCH_LOOP !== 'true') return () => undefined;
  const delay = monitorEventLoopDelay({ resolution: 2 });
  delay.enable();
  // Pauses by kind (PerformanceGCEntry detail.kind: 1 minor, 2 major, 4 incremental marking, 8 weak callbacks).
  const pauses: { kind: number; ms: number }[] = [];
  new PerformanceObserver((list) => {
    for (const e of list.getEntries())
      pauses.push({ kind: (e as { detail?: { kind?: number } }).detail?.kind ?? 0, ms: e.duration });
  }).observe({ entryTypes: ['gc'] });
  return (reset) => {
    const of = (kind: number) => pauses.filter((x) => x.kind === kind).map((x) => x.ms);
    const out = {
      delayP99Ms: delay.percentile(99) / 1e6,
      delayMaxMs: delay.max / 1e6,
      gcs: pauses.length,
      gcMs: pauses.reduce((a, x) => a + x.ms, 0),
      gcMaxMs: Math.max(0, ...pauses.map((x) => x.ms)),
      minor: of(1),
      major: of(2),
    };
    if (reset) {
      delay.reset();
      pauses.length = 0;
    }
    return out;
  };
}

async function gateway(): Promise<void> {
  const config = loadGatewayConfig({
    DATABASE_URL: process.env.BENCH_DATABASE_URL,
    GATEWAY_API_KEYS: 'bench-key',
    LOG_LEVEL: 'error',
    GATEWAY_HTTP_PORT: '0',
    GATEWAY_COAP_PORT: '0',
    // One process (bench:gateway -- --replicas measures the bus): overrides apply here directly.
    GATEWAY_CLUSTER_BUS: 'false',
    // Tuning under test, when given: the in-flight window and the fan-out chunk.
    COAP_MAX_INFLIGHT: process.env.COAP_MAX_INFLIGHT,
    COAP_FANOUT_CHUNK: process.env.COAP_FANOUT_CHUNK,
    // Every simulated device sends from 127.0.0.1: the per-address cap (512 by default) would refuse all but
    // the first 512 relations of the run. The total cap (200,000) stays as configured.
    COAP_MAX_RELATIONS_PER_ADDRESS: '10000000',
    // BENCH_COAP_SECURITY=both adds coaps (DTLS 1.2 PSK) on a free port; every simulated device is on loopback.
    GATEWAY_COAP_SECURITY: process.env.BENCH_COAP_SECURITY,
    GATEWAY_COAPS_PORT: '0',
    DTLS_MAX_SESSIONS_PER_ADDRESS: '1000000',
    DTLS_MAX_SESSIONS: '1000000',
    // Every simulated device shares 127.0.0.1; 100 connect at once (node-dtls-client never retransmits).
    DTLS_MAX_HANDSHAKES_PER_ADDRESS: '1000000',
    // The delivery record (design §3.8), on as in production unless BENCH_DELIVERY=false (its cost is measured).
    GATEWAY_DELIVERY_RECORD: process.env.BENCH_DELIVERY === 'false' ? 'false' : undefined,
    // Its flush interval, when given (a long one leaves only the events' cost inside the fan-out's window).
    GATEWAY_DELIVERY_FLUSH_MS: process.env.GATEWAY_DELIVERY_FLUSH_MS,
    // Its writers, when given (GATEWAY_DELIVERY_WRITERS=1: one chunk at a time, as before the fifth pass).
    ...(process.env.GATEWAY_DELIVERY_WRITERS === undefined
      ? {}
      : { GATEWAY_DELIVERY_WRITERS: process.env.GATEWAY_DELIVERY_WRITERS }),
  });
  const logger = createLogger({ service: 'bench-gateway', level: 'error' });
  // The pool as configured (DB_POOL_MAX, 4 by default): the delivery record's writers take up to all but one.
  const db = createDb<GatewayDatabase>(config.database.url, { max: config.database.poolMax });
  const keys = new SecretSet(['bench-key']);
  // BENCH_DELIVERY=discard: the record on, its batches built and handed to a writer that drops them after a
  // turn of the event loop, so the gateway's own cost is measured without PostgreSQL's upserts on the same cores
  // (in production the database is another machine).
  const discard =
    process.env.BENCH_DELIVERY === 'discard'
      ? {
          deliveryWriter: {
            record: () => new Promise<void>((resolve) => setImmediate(resolve)),
            reap: () => Promise.resolve(0),
          },
        }
      : {};
  const app = buildApp({ config, logger, db, apiKeys: () => keys, ...discard });
  await app.coap.listen(0, '127.0.0.1');
  const server = app.http.listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  await app.rollouts.assignments.sync();
  await app.service.reload();
  app.delivery?.start();
  // BENCH_ROLLOUT=true: this child drives rollouts (design §3.9); the rollout benchmark creates them over HTTP.
  if (process.env.BENCH_ROLLOUT === 'true') app.rollouts.driver.start();
  observers = () => app.coap.observerCount;
  // The delivery record's lag (design §3.8), sampled every 50 ms between lag-start and lag-stop, with the
  // window's longest flush (stats.maxFlushMs is since the start: kept aside during the window).
  let lagSamples: number[] = [];
  let lagTimer: NodeJS.Timeout | undefined;
  let maxFlushBefore = 0;
  const lagWindow = { startedAt: 0 };
  const loop = loopMonitor();
  process.on('message', (m: Command) => {
    void (async () => {
      switch (m.cmd) {
        case 'heap':
          send({ ...heap() });
          break;
        case 'cpu':
          send({ cpuMs: cpuMs(), systemMs: process.cpuUsage().system / 1000 });
          break;
        case 'stats':
          send({ ...app.coap.stats, malformedByReason: undefined, delivery: app.delivery?.stats });
          break;
        case 'flush':
          await app.delivery?.flush();
          await app.delivery?.flush();
          send({ done: true });
          break;
        case 'lag-start': {
          lagSamples = [];
          lagWindow.startedAt = performance.now();
          const d = app.delivery;
          if (d !== undefined) {
            maxFlushBefore = d.stats.maxFlushMs;
            d.stats.maxFlushMs = 0;
            lagTimer = setInterval(() => lagSamples.push(d.lagSeconds()), 50);
          }
          send({ done: true });
          break;
        }
        case 'lag-wait': {
          // Until everything is written without being asked to (the timer, early flushes), or 60 s.
          const d = app.delivery;
          const t0 = performance.now();
          while (d !== undefined && d.lagSeconds() > 0 && performance.now() - t0 < 60_000)
            await new Promise((r) => setTimeout(r, 10));
          send({ ms: performance.now() - t0 });
          break;
        }
        case 'lag-stop': {
          if (lagTimer !== undefined) clearInterval(lagTimer);
          lagTimer = undefined;
          const d = app.delivery;
          const sorted = [...lagSamples].sort((a, b) => a - b);
          const windowMaxFlushMs = d?.stats.maxFlushMs ?? 0;
          if (d !== undefined) d.stats.maxFlushMs = Math.max(maxFlushBefore, windowMaxFlushMs);
          send({
            samples: sorted.length,
            maxS: sorted.at(-1) ?? 0,
            p99S: sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * 0.99))] ?? 0,
            windowMs: performance.now() - lagWindow.startedAt,
            maxFlushMs: windowMaxFlushMs,
          });
          break;
        }
        case 'loop':
          send({ loop: loop(m.reset === true) });
          break;
        case 'reload': {
          const t0 = performance.now();
          const summary = await app.service.reload();
          send({ ms: performance.now() - t0, changed: summary.changed });
          break;
        }
        case 'fanout':
          break;
        case 'exit':
          process.exit(0);
      }
    })();
  });
  send({
    ready: true,
    coapPort: app.coap.address().port,
    coapsPort: app.dtls?.address().port,
    httpPort: (server.address() as AddressInfo).port,
  });
}

async function nodecoap(): Promise<void> {
  const relations: OutgoingMessage[] = [];
  const server = createServer({ type: 'udp4' });
  // The same document shape as the gateway's; the bench's round value goes into the settings (as in the
  // gateway, where the registry's settings change), so the client counts both servers the same way.
  const doc = (id: string, value: number) =>
    JSON.stringify({
      device_id: id,
      version: value,
      source: 'registry',
      settings: { reporting_interval_s: value },
    });
  server.on('request', (req: IncomingMessage, res: OutgoingMessage) => {
    const id = req.url.split('/')[2] ?? '';
    if (req.headers.Observe === 0) {
      relations.push(res);
      (res as unknown as { id: string }).id = id;
      res.on('finish', () => {
        const i = relations.indexOf(res);
        if (i !== -1) relations.splice(i, 1);
      });
      res.write(doc(id, 60));
    } else res.end(doc(id, 60));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  observers = () => relations.length;
  process.on('message', (m: Command) => {
    switch (m.cmd) {
      case 'heap':
        send({ ...heap() });
        break;
      case 'cpu':
        send({ cpuMs: cpuMs() });
        break;
      case 'stats':
        send({});
        break;
      case 'loop':
        send({});
        break;
      case 'flush':
      case 'lag-start':
      case 'lag-wait':
      case 'lag-stop':
        // No delivery record here (the parent asks the gateway only).
        send({ done: true });
        break;
      case 'fanout': {
        // The plain approach: one synchronous loop of res.write() over every held relation.
        const t0 = performance.now();
        for (const res of relations) res.write(doc((res as unknown as { id: string }).id, m.value));
        send({ ms: performance.now() - t0 });
        break;
      }
      case 'reload':
        send({ ms: 0 });
        break;
      case 'exit':
        process.exit(0);
    }
  });
  const address = (server as unknown as { _sock: { address(): AddressInfo } })._sock.address();
  send({ ready: true, coapPort: address.port, httpPort: 0 });
}

async function floor(withExpress: boolean): Promise<void> {
  const socket = dgram.createSocket('udp4');
  await new Promise<void>((r) => socket.connect(Number(process.env.BENCH_OBSERVER_PORT), '127.0.0.1', r));
  const answer = '{"status":"updated"}';
  let server;
  if (withExpress) {
    const app = express();
    app.set('etag', false);
    app.use(express.json());
    app.post('/api/notify-settings', (req, res) => {
      socket.send(JSON.stringify(req.body));
      res.json({ status: 'updated' });
    });
    server = app.listen(0, '127.0.0.1');
  } else {
    server = createHttpServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        socket.send(Buffer.concat(chunks));
        res
          .writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length })
          .end(answer);
      });
    }).listen(0, '127.0.0.1');
  }
  await new Promise((r) => server.once('listening', r));
  process.on('message', (m: Command) => {
    if (m.cmd === 'cpu') send({ cpuMs: cpuMs() });
    if (m.cmd === 'exit') process.exit(0);
  });
  send({ ready: true, coapPort: 0, httpPort: (server.address() as AddressInfo).port });
}

const mode = process.argv[2];
await (mode === 'nodecoap'
  ? nodecoap()
  : mode === 'floor-http' || mode === 'floor-express'
    ? floor(mode === 'floor-express')
    : gateway());
