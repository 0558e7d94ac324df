// `npm run bench:dtls`: the gateway's DTLS 1.2 PSK server (services/device-gateway/src/dtls) on loopback
// with real sockets. The client is node-dtls-client 2.0.3, an independent implementation (PSK,
// AES-128-CCM-8, with the HelloVerifyRequest cookie exchange). Prints figures; not a pass/fail test.
//
//   handshakes/s  : full handshakes (cookie exchange included) completed per second by CONCURRENCY
//                   clients that connect, complete, and close, for DURATION_S seconds
//   heap/session  : V8 heap (after gc) per idle established session with SESSIONS sessions held open
//
// The server runs in a child process (so its CPU and heap are its own) and is the function
// `runDtlsBenchServer` below; `runDtlsBench` can be called from another benchmark (bench:gateway).
import { fork } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { getHeapSpaceStatistics } from 'node:v8';
import { fileURLToPath } from 'node:url';
import { DtlsServer } from '@platform/device-gateway';
import { dtls } from 'node-dtls-client';
import { benchNodeArgs } from './lib/node-args.js';
import { processCpuSeconds } from './lib/cpu-usage.js';

const KEY = Buffer.from('bench-key-0123456789abcdefghijkl');
const IDENTITY = 'bench-device';

interface ServerReport {
  rss: number;
  /** V8's committed heap (all spaces), and of it the pages actually resident (physical_space_size). */
  heapTotal: number;
  heapPhysical: number;
  /** physical_space_size per V8 space (new_space grows under allocation pressure and stays grown). */
  spaces: Record<string, number>;
  /** /proc/self/smaps_rollup, bytes: Anonymous (heap, malloc arenas, V8) and Rss. */
  anonymous: number;
  /** Resident bytes of the main malloc arena ([heap], grown by brk), from /proc/self/smaps. */
  brk: number;
  heapUsed: number;
  external: number;
  arrayBuffers: number;
  sessions: number;
  handshakes: number;
  handshakesCompleted: number;
  cookiesSent: number;
  handshakeFailures: number;
}

/** A field of /proc/self/smaps_rollup in kB (Linux; 0 elsewhere). */
function smapsKb(field: string): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(
      readFileSync('/proc/self/smaps_rollup', 'utf8'),
    );
    return m === null ? 0 : Number(m[1]);
  } catch {
    return 0;
  }
}

/** Resident kB of the [heap] mapping (the main malloc arena) in /proc/self/smaps (0 if none). */
function brkResidentKb(): number {
  try {
    const smaps = readFileSync('/proc/self/smaps', 'utf8');
    const at = smaps.indexOf(' [heap]\n');
    if (at === -1) return 0;
    const m = /^Rss:\s+(\d+) kB/m.exec(smaps.slice(at));
    return m === null ? 0 : Number(m[1]);
  } catch {
    return 0;
  }
}

/** The server side, in the child: answers 'report' with its heap after a full gc and its counters. */
async function runDtlsBenchServer(): Promise<void> {
  const silent = (): void => undefined;
  const server = new DtlsServer({
    lookupPsk: (identity) =>
      identity === IDENTITY ? { credentialId: 'c', identity, key: KEY, deviceId: 'd' } : undefined,
    logger: { info: silent, warn: silent, error: silent, debug: silent },
    maxSessions: 100_000,
    maxSessionsPerAddress: 100_000,
    // Every client is on 127.0.0.1 with the one bench key (node-dtls-client never retransmits, so an evicted
    // handshake would only time out).
    maxSessionsPerCredential: 100_000,
    maxHandshakes: 10_000,
    maxHandshakesPerAddress: 10_000,
    // A session's key objects are dropped after one to two quiet sweeps (record-layer.ts); 500 ms here so that
    // the idle figure below needs a wait of 1.5 s, not of 10 s.
    idleSweepIntervalMs: 500,
    socketBufferBytes: 4 * 1024 * 1024,
  });
  server.onApplicationData = (session, data) => server.send(session, data);
  await server.listen(0, '127.0.0.1');
  const gc = (globalThis as { gc?: () => void }).gc;
  process.on('message', (msg: { cmd: string }) => {
    if (msg.cmd === 'report') {
      gc?.();
      gc?.();
      const m = process.memoryUsage();
      const snap = server.snapshot();
      const spaces: Record<string, number> = {};
      for (const sp of getHeapSpaceStatistics()) spaces[sp.space_name] = sp.physical_space_size;
      const report: ServerReport = {
        rss: m.rss,
        heapTotal: m.heapTotal,
        heapPhysical: Object.values(spaces).reduce((a, b) => a + b, 0),
        spaces,
        anonymous: smapsKb('Anonymous') * 1024,
        brk: brkResidentKb() * 1024,
        heapUsed: m.heapUsed,
        external: m.external,
        arrayBuffers: m.arrayBuffers,
        sessions: snap.sessions,
        handshakes: snap.handshakes,
        handshakesCompleted: server.stats.handshakesCompleted,
        cookiesSent: server.stats.cookiesSent,
        handshakeFailures: Object.values(server.stats.handshakeFailures).reduce((a, b) => a + b, 0),
      };
      process.send!(report);
    } else if (msg.cmd === 'exit') {
      void server.close().then(() => process.exit(0));
    }
  });
  process.send!({ port: server.address().port });
}

function connect(port: number, identity: string = IDENTITY, key: Buffer = KEY): Promise<dtls.Socket> {
  return new Promise((resolve, reject) => {
    const socket = dtls.createSocket({
      type: 'udp4',
      address: '127.0.0.1',
      port,
      psk: { [identity]: key },
      timeout: 10_000,
      ciphers: ['TLS_PSK_WITH_AES_128_CCM_8'],
    });
    socket.once('connected', () => resolve(socket));
    socket.once('error', reject);
  });
}

export interface DtlsBenchResult {
  client: string;
  handshakesPerSecond: number;
  handshakeErrors: number;
  serverCpuPerHandshakeMs: number;
  clientCpuPerHandshakeMs: number;
  sessions: number;
  heapBytesPerSession: number;
  externalBytesPerSession: number;
  rssBytesPerSession: number;
  /** The same right after the sessions were made, while they still hold their key objects. */
  activeRssBytesPerSession: number;
  activeHeapBytesPerSession: number;
  /**
   * Where the idle RSS growth is, bytes per session (after - before): V8's resident heap pages in all and per
   * space, and the rest of the process's anonymous memory (malloc arenas: OpenSSL, Node's native objects).
   */
  rssBreakdown: {
    v8Physical: number;
    outsideV8: number;
    /** Of outsideV8, the main malloc arena's growth (OpenSSL and Node's native objects live there). */
    mainArena: number;
    spaces: Record<string, number>;
    /** RSS and V8 heap per session still above `before` once all the sessions have closed (and gc ran). */
    rssAfterClose: number;
    heapAfterClose: number;
    sessionsLeft: number;
    /** A second fill of as many idle sessions into the same process: RSS and heap per session above `closed`. */
    secondFillSessions: number;
    secondFillRss: number;
    secondFillHeap: number;
  };
  /** Refused handshakes: median time to the alert seen by the client, and server CPU per refusal. */
  refusals: { kind: string; count: number; medianMs: number; p90Ms: number; serverCpuMs: number }[];
}

/** Runs `count` handshakes that must fail, 16 at a time; client-side time from connect to the failure. */
async function refusals(
  port: number,
  pid: number,
  kind: string,
  identity: string,
  key: Buffer,
  count: number,
): Promise<DtlsBenchResult['refusals'][number]> {
  const times: number[] = [];
  const cpu0 = processCpuSeconds(pid);
  let left = count;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (left-- > 0) {
        const t0 = performance.now();
        try {
          (await connect(port, identity, key)).close();
        } catch {
          times.push(performance.now() - t0);
        }
      }
    }),
  );
  times.sort((a, b) => a - b);
  return {
    kind,
    count: times.length,
    medianMs: times[Math.floor(times.length / 2)] ?? NaN,
    p90Ms: times[Math.floor(times.length * 0.9)] ?? NaN,
    serverCpuMs: times.length ? ((processCpuSeconds(pid) - cpu0) * 1000) / times.length : NaN,
  };
}

/** Runs both figures against a fresh server child and returns them. */
export async function runDtlsBench(
  opts: { durationS?: number; concurrency?: number; sessions?: number } = {},
): Promise<DtlsBenchResult> {
  const durationS = opts.durationS ?? Number(process.env.DTLS_BENCH_DURATION_S ?? 10);
  const concurrency = opts.concurrency ?? Number(process.env.DTLS_BENCH_CONCURRENCY ?? 64);
  const sessions = opts.sessions ?? Number(process.env.DTLS_BENCH_SESSIONS ?? 10_000);
  const child = fork(fileURLToPath(import.meta.url), ['server'], {
    // BENCH_PROFILE=<dir> writes a CPU profile of the server child (node --cpu-prof), as bench:gateway does.
    execArgv: [
      '--expose-gc',
      ...(process.env.BENCH_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROFILE}`] : []),
      ...benchNodeArgs(),
    ],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const { port } = await new Promise<{ port: number }>((resolve) =>
    child.once('message', (m) => resolve(m as { port: number })),
  );
  const report = (): Promise<ServerReport> =>
    new Promise((resolve) => {
      child.once('message', (m) => resolve(m as ServerReport));
      child.send({ cmd: 'report' });
    });

  // 1. Handshake rate: CONCURRENCY loops of connect -> connected -> close (close_notify).
  let done = 0;
  let errors = 0;
  const cpu0 = processCpuSeconds(child.pid!);
  const clientCpu0 = process.cpuUsage();
  const t0 = performance.now();
  const until = t0 + durationS * 1000;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < until) {
        try {
          const s = await connect(port);
          done++;
          s.close();
        } catch {
          errors++;
        }
      }
    }),
  );
  const elapsedS = (performance.now() - t0) / 1000;
  const serverCpuS = processCpuSeconds(child.pid!) - cpu0;
  const clientCpu = process.cpuUsage(clientCpu0);
  const clientCpuS = (clientCpu.user + clientCpu.system) / 1e6;
  const handshakesPerSecond = done / elapsedS;

  // 2. Heap per idle session: hold SESSIONS sessions open, compare the server's heap after gc.
  await new Promise((r) => setTimeout(r, 500)); // let the closes of phase 1 land
  const before = await report();
  let heldErrors = 0;
  const fill = async (): Promise<dtls.Socket[]> => {
    const held: dtls.Socket[] = [];
    let failed = 0;
    const perWorker = Math.ceil(sessions / 200);
    await Promise.all(
      Array.from({ length: 200 }, async () => {
        for (let i = 0; i < perWorker && held.length + failed < sessions; i++) {
          try {
            held.push(await connect(port));
          } catch {
            failed++;
          }
        }
      }),
    );
    heldErrors += failed;
    return held;
  };
  const idleWaitMs = Number(process.env.DTLS_BENCH_IDLE_WAIT_MS ?? 1500);
  /** Closes the sessions and waits (up to 15 s) until the server holds none; returns its report then. */
  const closeAll = async (held: dtls.Socket[]): Promise<ServerReport> => {
    for (const s of held) s.close();
    let r = await report();
    for (let i = 0; i < 30 && r.sessions > 0; i++) {
      await new Promise((res) => setTimeout(res, 500));
      r = await report();
    }
    return r;
  };
  const held = await fill();
  const active = await report();
  // Idle: quiet for longer than two sweeps, so the sessions hold only what an idle session holds.
  await new Promise((r) => setTimeout(r, idleWaitMs));
  const after = await report();
  const n = after.sessions - before.sessions;
  // The same process once every session has ended: what of the growth was the sessions' own state, and what
  // is memory the allocators kept after the handshakes (freed, but not returned to the system). Then the same
  // number of sessions again: how much of the kept memory a second fill reuses.
  const closed = await closeAll(held);
  const held2 = await fill();
  await new Promise((r) => setTimeout(r, idleWaitMs));
  const after2 = await report();
  const n2 = after2.sessions - closed.sessions;
  await closeAll(held2);

  // 3. Refusals: a wrong key and an unknown identity must look alike (both decrypt_error, same work).
  await new Promise((r) => setTimeout(r, 500));
  const refused: DtlsBenchResult['refusals'] = [];
  for (let round = 0; round < 2; round++) {
    refused.push(await refusals(port, child.pid!, 'wrong key', IDENTITY, Buffer.from('x'.repeat(32)), 1000));
    refused.push(await refusals(port, child.pid!, 'unknown identity', 'no-such-device', KEY, 1000));
  }
  child.send({ cmd: 'exit' });
  await new Promise((r) => child.once('exit', r));
  return {
    client: 'node-dtls-client 2.0.3 (cookie exchange on every handshake)',
    handshakesPerSecond,
    handshakeErrors: errors + heldErrors,
    serverCpuPerHandshakeMs: done > 0 ? (serverCpuS * 1000) / done : NaN,
    clientCpuPerHandshakeMs: done > 0 ? (clientCpuS * 1000) / done : NaN,
    sessions: n,
    heapBytesPerSession: n > 0 ? (after.heapUsed - before.heapUsed) / n : NaN,
    externalBytesPerSession: n > 0 ? (after.external - before.external) / n : NaN,
    rssBytesPerSession: n > 0 ? (after.rss - before.rss) / n : NaN,
    activeRssBytesPerSession: n > 0 ? (active.rss - before.rss) / n : NaN,
    activeHeapBytesPerSession: n > 0 ? (active.heapUsed - before.heapUsed) / n : NaN,
    rssBreakdown: {
      v8Physical: (after.heapPhysical - before.heapPhysical) / n,
      mainArena: (after.brk - before.brk) / n,
      outsideV8: (after.anonymous - before.anonymous - (after.heapPhysical - before.heapPhysical)) / n,
      spaces: Object.fromEntries(
        Object.keys(after.spaces).map((k) => [k, (after.spaces[k]! - (before.spaces[k] ?? 0)) / n]),
      ),
      rssAfterClose: (closed.rss - before.rss) / n,
      heapAfterClose: (closed.heapUsed - before.heapUsed) / n,
      sessionsLeft: closed.sessions,
      secondFillSessions: n2,
      secondFillRss: n2 > 0 ? (after2.rss - closed.rss) / n2 : NaN,
      secondFillHeap: n2 > 0 ? (after2.heapUsed - closed.heapUsed) / n2 : NaN,
    },
    refusals: refused,
  };
}

async function main(): Promise<void> {
  const load = loadavg()[0]!.toFixed(2);
  const r = await runDtlsBench();
  console.log(`DTLS 1.2 PSK server (TLS_PSK_WITH_AES_128_CCM_8), client: ${r.client}`);
  console.log(`  load average (1 min) at start: ${load}`);
  console.log(
    `  handshakes/s:             ${r.handshakesPerSecond.toFixed(0)} (errors ${r.handshakeErrors})`,
  );
  console.log(`  server CPU per handshake: ${r.serverCpuPerHandshakeMs.toFixed(3)} ms`);
  console.log(
    `  client CPU per handshake: ${r.clientCpuPerHandshakeMs.toFixed(3)} ms (the limit when it is higher)`,
  );
  console.log(`  idle sessions held:       ${r.sessions}`);
  console.log(`  heap per idle session:    ${r.heapBytesPerSession.toFixed(0)} bytes (V8 heap after gc)`);
  console.log(
    `  external per session:     ${r.externalBytesPerSession.toFixed(0)} bytes (Buffer backing stores)`,
  );
  console.log(`  RSS per idle session:     ${r.rssBytesPerSession.toFixed(0)} bytes (process RSS after gc)`);
  console.log(
    `  just established:         heap ${r.activeHeapBytesPerSession.toFixed(0)} bytes, RSS ${r.activeRssBytesPerSession.toFixed(0)} bytes per session (key objects held)`,
  );
  const b = r.rssBreakdown;
  const bySpace = Object.entries(b.spaces)
    .filter(([, v]) => Math.abs(v) >= 10)
    .map(([k, v]) => `${k} ${v.toFixed(0)}`)
    .join(', ');
  console.log(
    `  RSS growth, per session:  V8 resident pages ${b.v8Physical.toFixed(0)} B (${bySpace}); anonymous memory outside V8 ${b.outsideV8.toFixed(0)} B, of which the main malloc arena ${b.mainArena.toFixed(0)} B`,
  );
  console.log(
    `  after all closed:         RSS ${b.rssAfterClose.toFixed(0)} B, heap ${b.heapAfterClose.toFixed(0)} B per session still above the start (${b.sessionsLeft} sessions left)`,
  );
  console.log(
    `  a second fill, idle:      ${b.secondFillSessions} sessions, RSS ${b.secondFillRss.toFixed(0)} B, heap ${b.secondFillHeap.toFixed(0)} B per session above the emptied process`,
  );
  for (const f of r.refusals) {
    console.log(
      `  refused (${f.kind.padEnd(16)}): ${f.count} x decrypt_error, client-side median ${f.medianMs.toFixed(2)} ms, ` +
        `p90 ${f.p90Ms.toFixed(2)} ms, server CPU ${f.serverCpuMs.toFixed(3)} ms each`,
    );
  }
}

if (process.argv[2] === 'server') {
  await runDtlsBenchServer();
} else if (process.argv[1] === fileURLToPath(import.meta.url)) {
  await main();
}
