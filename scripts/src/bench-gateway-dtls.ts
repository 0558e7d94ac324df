// The coaps half of `npm run bench:gateway` (design §3.5): the same gateway serving CoAP over DTLS 1.2 PSK.
// Fan-out to N DTLS observers on a reload, and notify → device latency over DTLS, printed beside the plain-CoAP
// figures of the same run. Two client sides, both written apart from the server:
// - node-dtls-client 2.0.3 sessions that encode and decode CoAP with coap-packet. Its record layer is JavaScript
//   (about 90 µs of CPU per notification and ACK), so its ACKs reach the server one at a time, each in an
//   event-loop turn of its own;
// - the testkit's PSK client (@platform/testkit/dtls-psk-client: its own PRF, key schedule and CCM-8 on
//   node:crypto), answering each notification at once with a few byte reads, as the plain fan-out's raw
//   observers do. The capacity ratio that compares like with like is this one: both fleets answer as fast as
//   they can, so the server meets the same ACK pattern on both transports.
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { generate, parse } from 'coap-packet';
import { sql, type Kysely } from 'kysely';
import { dtls } from 'node-dtls-client';
import { PskClient } from '@platform/testkit/dtls-psk-client';
import type { GatewayDatabase } from '@platform/device-gateway';
import { openLoop } from './lib/open-loop.js';
import { RawHttpClient } from './lib/raw-http-client.js';
import { percentile } from './lib/wait.js';

export interface DtlsChild {
  coapsPort?: number;
  httpPort: number;
  ask<T>(msg: unknown): Promise<T>;
}

const keyOf = (i: number): Buffer => Buffer.from(`bench-psk-key-${String(i).padStart(18, '0')}`);
const identityOf = (i: number): string => `bench-psk-${i}`;

/** One PSK per bench device (`bench-000000` …), as `device-key issue` would store them. */
export async function issueBenchKeys(owner: Kysely<GatewayDatabase>, deviceIds: string[]): Promise<void> {
  await sql`DELETE FROM device_gateway.device_credentials WHERE psk_identity LIKE 'bench-psk-%'`.execute(
    owner,
  );
  for (let start = 0; start < deviceIds.length; start += 5000) {
    const rows = deviceIds.slice(start, start + 5000).map((device_id, j) => ({
      psk_identity: identityOf(start + j),
      psk_key: keyOf(start + j),
      device_id,
    }));
    await owner.insertInto('device_gateway.device_credentials').values(rows).execute();
  }
}

interface Observer {
  close(): void;
  got: number;
  onValue?: (value: number, at: number) => void;
}

/** Which DTLS client the observers are (see the head of this file). */
export type DtlsClientKind = 'node-dtls-client' | 'independent';

function connect(port: number, i: number): Promise<dtls.Socket> {
  return new Promise((resolve, reject) => {
    const socket = dtls.createSocket({
      type: 'udp4',
      address: '127.0.0.1',
      port,
      psk: { [identityOf(i)]: keyOf(i) },
      timeout: 20_000,
      ciphers: ['TLS_PSK_WITH_AES_128_CCM_8'],
    });
    socket.once('connected', () => resolve(socket));
    socket.once('error', reject);
  });
}

/** Runs `open(i)` for i = 0 … n-1, at most 100 at a time (node-dtls-client never retransmits a lost flight). */
async function hundredAtOnce(n: number, open: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: 100 }, async () => {
      while (next < n) await open(next++);
    }),
  );
}

/** Opens `n` sessions (device i observes bench device i's settings, CON) and waits for each first response. */
async function observeAll(port: number, deviceIds: string[], marker: { value: number }): Promise<Observer[]> {
  const observers = new Array<Observer>(deviceIds.length);
  await hundredAtOnce(deviceIds.length, async (i) => {
    const socket = await connect(port, i);
    const o: Observer = { close: () => socket.close(), got: 0 };
    observers[i] = o;
    await new Promise<void>((resolve) => {
      let first = true;
      socket.on('message', (raw: Buffer) => {
        let p;
        try {
          p = parse(raw);
        } catch {
          return;
        }
        if (p.confirmable) socket.send(generate({ ack: true, code: '0.00', messageId: p.messageId }));
        if (first) {
          first = false;
          resolve();
          return;
        }
        const m = /"reporting_interval_s":(\d+)/.exec(p.payload.toString());
        const value = m === null ? -1 : Number(m[1]);
        if (value === marker.value) o.got++;
        o.onValue?.(value, performance.now());
      });
      socket.send(observeRequest(i, deviceIds[i]!));
    });
  });
  return observers;
}

/**
 * The registration of device `i`: GET with Observe, token = 3 bytes of the index and 0x42; CON unless told (a
 * NON registration gets NON notifications, design §3.4).
 */
function observeRequest(i: number, deviceId: string, confirmable = true): Buffer {
  return generate({
    confirmable,
    code: 'GET',
    messageId: (i * 7) & 0xffff,
    token: Buffer.from([i & 0xff, (i >> 8) & 0xff, 0x42]),
    options: [
      { name: 'Observe', value: Buffer.alloc(0) },
      { name: 'Uri-Path', value: Buffer.from('devices') },
      { name: 'Uri-Path', value: Buffer.from(deviceId) },
      { name: 'Uri-Path', value: Buffer.from('settings') },
    ],
  });
}

/**
 * As observeAll, with the testkit's PSK client: each notification is answered at once (a confirmable one with an
 * empty ACK, RFC 7252 §4.2: 0x60 0x00 and its message id) and its value read from the payload's text, the work
 * the plain fan-out's raw observers do per datagram, plus opening and sealing one record each.
 */
async function observeAllIndependent(
  port: number,
  deviceIds: string[],
  marker: { value: number },
  confirmable = true,
): Promise<Observer[]> {
  const observers = new Array<Observer>(deviceIds.length);
  await hundredAtOnce(deviceIds.length, async (i) => {
    const client = await PskClient.open({ port, keepDatagrams: false });
    await client.connectSocket();
    await client.connect(identityOf(i), keyOf(i), { timeoutMs: 20_000 });
    const o: Observer = { close: () => client.close(), got: 0 };
    observers[i] = o;
    await client.request(observeRequest(i, deviceIds[i]!, confirmable), 20_000);
    client.onApplicationData = (coap: Buffer) => {
      if (coap.length < 4) return;
      if (coap[0]! >> 4 === 0x4) client.sendApp(Buffer.from([0x60, 0x00, coap[2]!, coap[3]!]));
      const m = /"reporting_interval_s":(\d+)/.exec(coap.toString('latin1'));
      const value = m === null ? -1 : Number(m[1]);
      if (value === marker.value) o.got++;
      o.onValue?.(value, performance.now());
    };
  });
  return observers;
}

/**
 * One DTLS observer of `deviceId`'s settings answering at once (observeAllIndependent with one device, so with
 * the first key issueBenchKeys issued: `deviceId` must be the first device it was given). The DTLS half of
 * bench-gateway.ts's paired latency.
 */
export async function openDtlsObserver(
  port: number,
  deviceId: string,
  confirmable: boolean,
): Promise<{ close(): void; onValue?: (value: number, at: number) => void }> {
  const [observer] = await observeAllIndependent(port, [deviceId], { value: -1 }, confirmable);
  return observer!;
}

const observersOf = (client: DtlsClientKind): typeof observeAll =>
  client === 'independent' ? observeAllIndependent : observeAll;

export interface DtlsFanout {
  observers: number;
  sessionsPerS: number;
  fanoutPerS: number;
  lost: number;
  duplicates: number;
  serverCpuMs: number;
  /** Of serverCpuMs, the kernel's (process.cpuUsage().system): sendmsg/recvmsg and their wake-ups. */
  serverSystemMs: number;
  /** The observers' CPU over the same window (this process). */
  clientCpuMs: number;
}

/** N DTLS observers; every device's settings change; one reload notifies them all over their sessions. */
export async function dtlsFanout(
  child: DtlsChild,
  owner: Kysely<GatewayDatabase>,
  deviceIds: string[],
  value: number,
  client: DtlsClientKind = 'node-dtls-client',
): Promise<DtlsFanout> {
  const marker = { value };
  const t0 = performance.now();
  const observers = await observersOf(client)(child.coapsPort!, deviceIds, marker);
  const sessionsPerS = observers.length / ((performance.now() - t0) / 1000);
  let first = Infinity;
  let last = 0;
  for (const o of observers)
    o.onValue = (v, at) => {
      if (v !== value) return;
      first = Math.min(first, at);
      last = Math.max(last, at);
    };
  // As the plain fan-out does (bench-gateway.ts measure): the registrations' delivery rows written first, so
  // that no flush of them falls inside the measured window.
  await new Promise((r) => setTimeout(r, 500));
  await child.ask({ cmd: 'flush' });
  await sql`UPDATE device_gateway.device_registry SET desired_settings = jsonb_build_object('reporting_interval_s', ${value}::int)`.execute(
    owner,
  );
  const cpu0 = await child.ask<{ cpuMs: number; systemMs?: number }>({ cmd: 'cpu' });
  const clientCpu0 = process.cpuUsage();
  await child.ask({ cmd: 'reload' });
  // Settle: until every observer has its notification, or 3 s without progress.
  let seen = -1;
  for (;;) {
    await new Promise((r) => setTimeout(r, 500));
    const now = observers.reduce((n, o) => n + Math.min(o.got, 1), 0);
    if (now === observers.length || now === seen) break;
    seen = now;
  }
  await new Promise((r) => setTimeout(r, 3000));
  const clientCpu = process.cpuUsage(clientCpu0);
  const cpu1 = await child.ask<{ cpuMs: number; systemMs?: number }>({ cmd: 'cpu' });
  const serverCpuMs = cpu1.cpuMs - cpu0.cpuMs;
  const serverSystemMs = (cpu1.systemMs ?? NaN) - (cpu0.systemMs ?? NaN);
  const delivered = observers.reduce((n, o) => n + Math.min(o.got, 1), 0);
  const duplicates = observers.reduce((n, o) => n + Math.max(o.got - 1, 0), 0);
  for (const o of observers) o.close();
  return {
    observers: observers.length,
    sessionsPerS,
    fanoutPerS: delivered / ((last - first) / 1000 || 1e-3),
    lost: observers.length - delivered,
    duplicates,
    serverCpuMs,
    serverSystemMs,
    clientCpuMs: (clientCpu.user + clientCpu.system) / 1000,
  };
}

/**
 * notify-settings over HTTP → one DTLS observer: open loop at `rate`/s for 5 s, time to its notification.
 * Measured as the plain figure is (bench-gateway.ts `latency`): on a gateway child of its own, after a 1 s open
 * loop that is not counted, so that neither the JIT's first compilations of the DTLS paths nor the collection
 * of a previous phase's garbage lands in the tail.
 */
export async function dtlsLatency(
  child: DtlsChild,
  deviceId: string,
  rate = 1000,
  /**
   * 'in-process': the DTLS device (node-dtls-client, its record layer in JavaScript, ≈ 90 µs of CPU per
   * notification and its ACK) shares this process's event loop with the HTTP load generator, as before.
   * 'own-process': the device runs in a process of its own and reports when each notification arrived (wall
   * clock, performance.timeOrigin + now(), so that the two processes' times compare), so its work delays neither
   * the generator nor the timestamps of other notifications.
   */
  device: 'in-process' | 'own-process' = 'in-process',
  clientKind: DtlsClientKind = 'node-dtls-client',
  /** NON registration (the testkit client in this process only): no ACK round trip to wait for. */
  confirmable = true,
): Promise<{ p50: number; p99: number; seen: number; sent: number; samples: number[] }> {
  const sentAt = new Map<number, number>();
  const samples: number[] = [];
  const onValue = (v: number, at: number): void => {
    const t = sentAt.get(v);
    if (t === undefined) return;
    sentAt.delete(v);
    samples.push(at - t);
  };
  const clock =
    device === 'in-process' ? () => performance.now() : () => performance.timeOrigin + performance.now();
  let stopDevice: () => Promise<void>;
  if (device === 'in-process') {
    const observers = confirmable
      ? await observersOf(clientKind)(child.coapsPort!, [deviceId], { value: -1 })
      : await observeAllIndependent(child.coapsPort!, [deviceId], { value: -1 }, false);
    observers[0]!.onValue = onValue;
    stopDevice = () => {
      observers[0]!.close();
      return Promise.resolve();
    };
  } else {
    const proc = fork(fileURLToPath(import.meta.url), [], {
      env: {
        ...process.env,
        BENCH_DTLS_DEVICE: JSON.stringify({ port: child.coapsPort!, deviceId, client: clientKind }),
      },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    await new Promise<void>((resolve, reject) => {
      proc.once('message', () => resolve());
      proc.once('exit', (code) => reject(new Error(`DTLS device exited with ${code}`)));
    });
    // Values arrive in batches (an IPC message per notification would load both processes).
    proc.on('message', (m: { values: [number, number][] }) => {
      for (const [v, at] of m.values) onValue(v, at);
    });
    stopDevice = async () => {
      const exited = new Promise((r) => proc.once('exit', r));
      proc.send({ cmd: 'exit' });
      await exited;
    };
  }
  const client = new RawHttpClient(child.httpPort, 64, { authorization: 'Bearer bench-key' });
  const post = async (value: number): Promise<void> => {
    sentAt.set(value, clock());
    await client.post(
      '/api/notify-settings',
      JSON.stringify({ device_id: deviceId, settings: { reporting_interval_s: value } }),
    );
  };
  const warmUpBase = 10_000;
  await openLoop(rate, rate, (i) => post(warmUpBase + i));
  await new Promise((r) => setTimeout(r, 100));
  samples.length = 0;
  const total = rate * 5;
  const base = 20_000;
  await openLoop(rate, total, (i) => post(base + i));
  await new Promise((r) => setTimeout(r, 500));
  client.close();
  await stopDevice();
  samples.sort((a, b) => a - b);
  return {
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    seen: samples.length,
    sent: total,
    samples,
  };
}

/**
 * The DTLS device of dtlsLatency's 'own-process' mode, in a child: one session (of the client asked for) observing
 * one device's settings; sends [value, wall-clock ms] of each notification to the parent every 50 ms.
 */
async function runDevice(config: { port: number; deviceId: string; client: DtlsClientKind }): Promise<void> {
  const observers = await observersOf(config.client)(config.port, [config.deviceId], { value: -1 });
  let batch: [number, number][] = [];
  observers[0]!.onValue = (v, at) => batch.push([v, performance.timeOrigin + at]);
  const timer = setInterval(() => {
    if (batch.length === 0) return;
    process.send!({ values: batch });
    batch = [];
  }, 50);
  process.on('message', (m: { cmd: string }) => {
    if (m.cmd !== 'exit') return;
    clearInterval(timer);
    if (batch.length > 0) process.send!({ values: batch });
    observers[0]!.close();
    process.disconnect();
  });
  process.send!({ ready: true });
}

if (process.env.BENCH_DTLS_DEVICE !== undefined && process.argv[1] === fileURLToPath(import.meta.url))
  await runDevice(
    JSON.parse(process.env.BENCH_DTLS_DEVICE) as { port: number; deviceId: string; client: DtlsClientKind },
  );
