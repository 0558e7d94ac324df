// `BENCH_ONLY=reports npm run bench:gateway` (issue 40, "Benchmark"; design §3.4, §3.8): devices' reports of
// what they applied, from BENCH_REPORT_DTLS (10,000) devices over coaps with their keys (the testkit's PSK
// client) and BENCH_REPORT_PLAIN (100,000) keyless ones over plain CoAP (raw sockets), against one gateway child
// with the delivery record on. Per round, two reloads to every device on the same child: one whose
// notifications nobody reports on, one after which every device reports `applied` at once (ABBA over the rounds,
// so a drift of the machine does not favour one side). Printed, each from the same run:
// - the fan-out's throughput (notifications a second, first to last) with reports and without, and their ratio
//   (issue 40: ≥ 0.9);
// - the server's CPU per notification (the round without reports) and per report (what the round with reports
//   cost beyond it, per report answered 2.04);
// - the delivery record's lag during each round (the recorder's gauge, sampled every 50 ms), and how long the
//   reports took to be answered (first notification to last 2.04).
import dgram from 'node:dgram';
import { sql, type Kysely } from 'kysely';
import { PskClient } from '@platform/testkit/dtls-psk-client';
import type { GatewayDatabase } from '@platform/device-gateway';
import { issueBenchKeys } from './bench-gateway-dtls.js';
import { benchDeviceId as deviceId } from './lib/bench-registry.js';

export const REPORT_DTLS = Number(process.env.BENCH_REPORT_DTLS ?? 10_000);
export const REPORT_PLAIN = Number(process.env.BENCH_REPORT_PLAIN ?? 100_000);
const SOCKETS = Number(process.env.BENCH_CLIENT_SOCKETS ?? 1024);

interface ReportChild {
  coapPort: number;
  coapsPort?: number;
  ask<T>(msg: unknown): Promise<T>;
}

interface Deps {
  url: string;
  owner: Kysely<GatewayDatabase>;
  rounds: number;
  startChild(env: Record<string, string>): Promise<ReportChild>;
  stopChild(child: ReportChild): Promise<void>;
}

/** A CoAP Uri-Path sequence, each segment under 269 bytes. */
function pathOptions(segments: string[], firstDelta: number): { bytes: Buffer; last: number } {
  const parts: Buffer[] = [];
  let prev = firstDelta;
  for (const seg of segments) {
    const value = Buffer.from(seg);
    const delta = 11 - prev;
    parts.push(
      value.length < 13
        ? Buffer.from([(delta << 4) | value.length])
        : Buffer.from([(delta << 4) | 13, value.length - 13]),
      value,
    );
    prev = 11;
  }
  return { bytes: Buffer.concat(parts), last: prev };
}

/** A CON request with a 4-byte token: GET with Observe=0, or POST of a JSON report (Content-Format 50). */
function request(mid: number, token: number, deviceId: string, report?: string): Buffer {
  const head = Buffer.from([0x44, report === undefined ? 0x01 : 0x02, mid >> 8, mid & 0xff, 0, 0, 0, 0]);
  head.writeUInt32BE(token >>> 0, 4);
  if (report === undefined) {
    const path = pathOptions(['devices', deviceId, 'settings'], 6);
    return Buffer.concat([head, Buffer.from([0x60]), path.bytes]);
  }
  const path = pathOptions(['devices', deviceId, 'reported'], 0);
  // Content-Format (12) after Uri-Path (11): delta 1, one byte, 50.
  return Buffer.concat([head, path.bytes, Buffer.from([0x11, 50, 0xff]), Buffer.from(report)]);
}

const REPORT_BIT = 0x80000000;
const VERSION = /"version":(\d+)/;
const VALUE = /"reporting_interval_s":(\d+)/;

/** What one fleet (plain or DTLS) saw in a round. */
interface Tally {
  notified: number;
  reported: number;
  refused: number;
  firstAt: number;
  lastNotifiedAt: number;
  lastReportedAt: number;
}

const newTally = (): Tally => ({
  notified: 0,
  reported: 0,
  refused: 0,
  firstAt: Infinity,
  lastNotifiedAt: 0,
  lastReportedAt: 0,
});

/**
 * One device's side of a round: the notification carrying `value` counts once; with `report`, the device answers
 * it with its report of the notification's version (sent through `send`), retried after a 5.03's Max-Age (1 s).
 */
class Fleet {
  value = -1;
  report = false;
  tally = newTally();
  private seen: Uint8Array;
  private pending: Uint8Array;

  constructor(
    readonly n: number,
    private readonly idOf: (i: number) => string,
    private readonly send: (i: number, bytes: Buffer) => void,
  ) {
    this.seen = new Uint8Array(n);
    this.pending = new Uint8Array(n);
  }

  round(value: number, report: boolean): void {
    this.value = value;
    this.report = report;
    this.tally = newTally();
    this.seen.fill(0);
    this.pending.fill(0);
  }

  /** A CoAP message for device `i` (its 4-byte token read), at `at`. */
  onMessage(i: number, coap: Buffer, at: number, reportAnswer: boolean): void {
    if (reportAnswer) {
      if (this.pending[i] !== 1) return;
      if (coap[1] === 0x44) {
        this.pending[i] = 2;
        this.tally.reported++;
        this.tally.lastReportedAt = at;
      } else if (coap[1] === 0xa3) {
        // 5.03: the record did not know the version yet, or was busy; again after Max-Age (1 s).
        setTimeout(() => this.sendReport(i, this.lastVersion[i] ?? 0), 1000).unref();
      } else {
        this.pending[i] = 2;
        this.tally.refused++;
      }
      return;
    }
    if (coap[1] !== 0x45 || this.seen[i] === 1) return;
    const text = coap.toString('latin1');
    const value = VALUE.exec(text);
    if (value === null || Number(value[1]) !== this.value) return;
    this.seen[i] = 1;
    this.tally.notified++;
    this.tally.firstAt = Math.min(this.tally.firstAt, at);
    this.tally.lastNotifiedAt = at;
    if (!this.report) return;
    const version = Number(VERSION.exec(text)?.[1] ?? 0);
    this.lastVersion[i] = version;
    this.pending[i] = 1;
    this.sendReport(i, version);
  }

  private readonly lastVersion: number[] = [];
  private mid = 1;

  private sendReport(i: number, version: number): void {
    if (this.pending[i] !== 1) return;
    this.mid = (this.mid + 1) & 0xffff;
    this.send(
      i,
      request(this.mid, (REPORT_BIT | i) >>> 0, this.idOf(i), `{"version":${version},"outcome":"applied"}`),
    );
  }
}

/** Plain devices over `SOCKETS` connected sockets; token = index, a report's with the high bit set. */
async function openPlain(port: number, fleet: { onMessage: Fleet['onMessage'] }, n: number) {
  const sockets: dgram.Socket[] = [];
  const count = Math.min(SOCKETS, n);
  let registered = 0;
  const answered = new Uint8Array(n);
  for (let s = 0; s < count; s++) {
    const socket = dgram.createSocket({ type: 'udp4', recvBufferSize: 8 << 20, sendBufferSize: 8 << 20 });
    socket.on('message', (buf) => {
      if (buf.length < 8 || (buf[0]! & 15) !== 4) return;
      const type = (buf[0]! >> 4) & 3;
      if (type === 0) socket.send(Buffer.from([0x60, 0x00, buf[2]!, buf[3]!]));
      const token = buf.readUInt32BE(4);
      const isReport = (token & REPORT_BIT) !== 0;
      const i = token & ~REPORT_BIT;
      if (i >= n) return;
      if (!isReport && type === 2 && answered[i] === 0) {
        answered[i] = 1;
        registered++;
        return;
      }
      fleet.onMessage(i, buf, performance.now(), isReport && type === 2);
    });
    await new Promise<void>((r) => socket.bind(0, '127.0.0.1', r));
    await new Promise<void>((r) => socket.connect(port, '127.0.0.1', r));
    sockets.push(socket);
  }
  const send = (i: number, bytes: Buffer): void => sockets[i % sockets.length]!.send(bytes);
  return {
    send,
    sockets,
    /** Registers every device (CON, Observe=0), 1,000 outstanding, retried after 500 ms without progress. */
    async registerAll(idOf: (i: number) => string): Promise<void> {
      let sent = 0;
      let last = performance.now();
      let seen = 0;
      while (registered < n) {
        while (sent < n && sent - registered < 1000) {
          send(sent, request(sent & 0xffff, sent, idOf(sent)));
          sent++;
        }
        await new Promise((r) => setImmediate(r));
        if (registered !== seen) {
          seen = registered;
          last = performance.now();
        } else if (performance.now() - last > 500) {
          for (let i = 0; i < sent; i++) if (answered[i] === 0) send(i, request(i & 0xffff, i, idOf(i)));
          last = performance.now();
        }
      }
    },
    close(): void {
      for (const s of sockets) s.close();
    },
  };
}

/** DTLS devices (the testkit's PSK client), 100 handshakes at a time; device i holds bench key i. */
async function openDtls(
  port: number,
  fleet: { onMessage: Fleet['onMessage'] },
  n: number,
  idOf: (i: number) => string,
) {
  const clients = new Array<PskClient>(n);
  let next = 0;
  await Promise.all(
    Array.from({ length: 100 }, async () => {
      while (next < n) {
        const i = next++;
        const client = await PskClient.open({ port, keepDatagrams: false });
        await client.connectSocket();
        await client.connect(`bench-psk-${i}`, Buffer.from(`bench-psk-key-${String(i).padStart(18, '0')}`), {
          timeoutMs: 30_000,
        });
        clients[i] = client;
        await client.request(request(i & 0xffff, i, idOf(i)), 30_000);
        client.onApplicationData = (coap: Buffer) => {
          if (coap.length < 8 || (coap[0]! & 15) !== 4) return;
          const type = (coap[0]! >> 4) & 3;
          if (type === 0) client.sendApp(Buffer.from([0x60, 0x00, coap[2]!, coap[3]!]));
          const token = coap.readUInt32BE(4);
          fleet.onMessage(
            token & ~REPORT_BIT,
            coap,
            performance.now(),
            (token & REPORT_BIT) !== 0 && type === 2,
          );
        };
      }
    }),
  );
  return {
    send: (i: number, bytes: Buffer): void => clients[i]!.sendApp(bytes),
    close(): void {
      for (const c of clients) c?.close();
    },
  };
}

interface RoundResult {
  report: boolean;
  notified: number;
  reported: number;
  refused: number;
  fanoutPerS: number;
  cpuMs: number;
  reportsDoneS: number;
  lagMaxS: number;
  lagP99S: number;
}

export async function benchReports(deps: Deps): Promise<void> {
  const dtlsN = REPORT_DTLS;
  const plainN = REPORT_PLAIN;
  const dtlsIds = Array.from({ length: dtlsN }, (_, i) => deviceId(i));
  const plainId = (i: number): string => deviceId(dtlsN + i);
  await issueBenchKeys(deps.owner, dtlsIds);
  const child = await deps.startChild({ BENCH_COAP_SECURITY: 'both' });
  const plainFleet = new Fleet(plainN, plainId, (i, b) => plain.send(i, b));
  const dtlsFleet = new Fleet(
    dtlsN,
    (i) => dtlsIds[i]!,
    (i, b) => dtls.send(i, b),
  );
  const t0 = performance.now();
  const plain = await openPlain(child.coapPort, plainFleet, plainN);
  await plain.registerAll(plainId);
  const dtls = await openDtls(child.coapsPort!, dtlsFleet, dtlsN, (i) => dtlsIds[i]!);
  console.log(
    `\n== reports: ${plainN} plain and ${dtlsN} DTLS devices observing (${((performance.now() - t0) / 1000).toFixed(1)} s to register) ==`,
  );
  await new Promise((r) => setTimeout(r, 1000));
  await child.ask({ cmd: 'flush' });
  const results: RoundResult[] = [];
  let value = 200;
  for (let r = 0; r < deps.rounds; r++) {
    // ABBA: without, with; with, without; …
    const order = r % 2 === 0 ? [false, true] : [true, false];
    for (const report of order) {
      value++;
      plainFleet.round(value, report);
      dtlsFleet.round(value, report);
      await sql`UPDATE device_gateway.device_registry SET desired_settings = jsonb_build_object('reporting_interval_s', ${value}::int)`.execute(
        deps.owner,
      );
      const cpu0 = await child.ask<{ cpuMs: number }>({ cmd: 'cpu' });
      await child.ask({ cmd: 'lag-start' });
      const start = performance.now();
      await child.ask({ cmd: 'reload' });
      // Until every device has its notification (and, reporting, its 2.04), or 3 s without progress.
      let seen = -1;
      for (;;) {
        await new Promise((res) => setTimeout(res, 500));
        const done =
          plainFleet.tally.notified +
          dtlsFleet.tally.notified +
          (report ? plainFleet.tally.reported + dtlsFleet.tally.reported : 0);
        const goal = report ? 2 * (plainN + dtlsN) : plainN + dtlsN;
        if (done >= goal || done === seen) break;
        seen = done;
      }
      await child.ask({ cmd: 'lag-wait' });
      const lag = await child.ask<{ maxS: number; p99S: number }>({ cmd: 'lag-stop' });
      const cpu1 = await child.ask<{ cpuMs: number }>({ cmd: 'cpu' });
      const tallies = [plainFleet.tally, dtlsFleet.tally];
      const first = Math.min(...tallies.map((t) => t.firstAt));
      const lastNotified = Math.max(...tallies.map((t) => t.lastNotifiedAt));
      const lastReported = Math.max(...tallies.map((t) => t.lastReportedAt));
      const notified = plainFleet.tally.notified + dtlsFleet.tally.notified;
      results.push({
        report,
        notified,
        reported: plainFleet.tally.reported + dtlsFleet.tally.reported,
        refused: plainFleet.tally.refused + dtlsFleet.tally.refused,
        fanoutPerS: notified / ((lastNotified - first) / 1000 || 1e-3),
        cpuMs: cpu1.cpuMs - cpu0.cpuMs,
        reportsDoneS: report ? (lastReported - start) / 1000 : 0,
        lagMaxS: lag.maxS,
        lagP99S: lag.p99S,
      });
      const x = results.at(-1)!;
      console.log(
        `  round ${r + 1} ${report ? 'with reports   ' : 'without reports'}: ${x.notified} notified at ${x.fanoutPerS.toFixed(0)}/s` +
          `${report ? `, ${x.reported} reports answered 2.04 (${x.refused} refused) within ${x.reportsDoneS.toFixed(2)} s of the reload` : ''}` +
          `; server CPU ${x.cpuMs.toFixed(0)} ms; record lag max ${x.lagMaxS.toFixed(2)} s, p99 ${x.lagP99S.toFixed(2)} s`,
      );
      // The record written before the next round, so no round's flush falls in the other's window.
      await child.ask({ cmd: 'flush' });
      await new Promise((res) => setTimeout(res, 1000));
    }
  }
  const stats = await child.ask<{ reportsByResult?: Record<string, number> }>({ cmd: 'stats' });
  plain.close();
  dtls.close();
  await deps.stopChild(child);
  const sum = (xs: RoundResult[], f: (x: RoundResult) => number): number => xs.reduce((a, x) => a + f(x), 0);
  const on = results.filter((x) => x.report);
  const off = results.filter((x) => !x.report);
  const perNotifyUs = (1000 * sum(off, (x) => x.cpuMs)) / sum(off, (x) => x.notified);
  const extraMs =
    sum(on, (x) => x.cpuMs) -
    (sum(off, (x) => x.cpuMs) * sum(on, (x) => x.notified)) / sum(off, (x) => x.notified);
  const perReportUs =
    (1000 * extraMs) /
    Math.max(
      1,
      sum(on, (x) => x.reported),
    );
  const fanOn = sum(on, (x) => x.fanoutPerS) / on.length;
  const fanOff = sum(off, (x) => x.fanoutPerS) / off.length;
  console.log(
    `  pooled over ${deps.rounds} round(s): server CPU ${perNotifyUs.toFixed(1)} µs a notification, ${perReportUs.toFixed(1)} µs a report (${(perReportUs / perNotifyUs).toFixed(2)}x)`,
  );
  console.log(
    `  fan-out with reports ${fanOn.toFixed(0)}/s, without ${fanOff.toFixed(0)}/s: ratio ${(fanOn / fanOff).toFixed(3)} (issue 40 asks ≥ 0.9)`,
  );
  console.log(
    `  record lag max: with reports ${Math.max(...on.map((x) => x.lagMaxS)).toFixed(2)} s, without ${Math.max(...off.map((x) => x.lagMaxS)).toFixed(2)} s; answers ${JSON.stringify(stats.reportsByResult ?? {})}`,
  );
}
