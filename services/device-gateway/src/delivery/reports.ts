// Devices' reports into the delivery record (design §3.8; migration 0023). A report is answered only once its
// write committed (or was refused), so unlike the recorder's events it is not held for a flush: reports that
// arrive while a call runs wait for the next call and go in one (up to `maxBatch`), on at most `writers`
// connections of the pool at once. Each waits at most `deadlineMs` (under CoAP's ACK_TIMEOUT, 2 s, so a CON
// report is answered before the device retransmits it), else it is answered `unavailable` (5.03, retry); its
// write may still commit, and the device's retry is then an equal report (2.04, the same row).
import { errorMessage, type Logger } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import type { DeviceReport, ReportResult, ReportSink } from '../coap/report-resource.js';
import type { GatewayDatabase } from '../db/tables.js';
import type { DeliveryTransport } from './recorder.js';

/** One report's row of a call, with what the replica itself issued the device (its current version). */
export interface ReportRow {
  deviceId: string;
  report: DeviceReport;
  transport: DeliveryTransport;
  /** This replica's current version of the device's settings, and its content digest (null: none). */
  localVersion: number | null;
  localContent: string | null;
}

/** Writes one batch and answers each row, in the batch's order (`device_reports_batch`, migration 0026). */
export type ReportBatchWriter = (rows: readonly ReportRow[]) => Promise<ReportResult[]>;

export function reportBatchWriter(
  db: Kysely<GatewayDatabase>,
  replica: string,
  recentMs: number,
): ReportBatchWriter {
  return async (rows) => {
    const { rows: out } = await sql<{ device_id: string; result: ReportResult }>`
      SELECT device_id, result FROM device_gateway.device_reports_batch(${replica},
        ${rows.map((r) => r.deviceId)}::text[], ${rows.map((r) => String(r.report.version))}::bigint[],
        ${rows.map((r) => r.report.outcome)}::text[], ${rows.map((r) => r.report.reason)}::text[],
        ${rows.map((r) => (r.report.settings === null ? null : JSON.stringify(r.report.settings)))}::jsonb[],
        ${rows.map((r) => r.transport)}::text[],
        ${rows.map((r) => (r.localVersion === null ? null : String(r.localVersion)))}::bigint[],
        ${rows.map((r) => r.localContent)}::text[], ${Math.round(recentMs)}::integer)`.execute(db);
    // The function answers in device order (its lock order); a device may report twice in one batch, so each
    // device's answers are matched in turn (the function keeps the batch's order within a device).
    const byDevice = new Map<string, ReportResult[]>();
    for (const o of out) {
      const list = byDevice.get(o.device_id);
      if (list === undefined) byDevice.set(o.device_id, [o.result]);
      else list.push(o.result);
    }
    return rows.map((r) => byDevice.get(r.deviceId)?.shift() ?? 'unavailable');
  };
}

interface Pending {
  row: ReportRow;
  resolve: (result: ReportResult) => void;
  timer: NodeJS.Timeout;
  settled: boolean;
}

export interface ReportWriterOptions {
  write: ReportBatchWriter;
  /** This replica's current version and content of a device's settings (null: it serves none). */
  local: (deviceId: string) => { version: number; content: string } | null;
  logger: Logger;
  /** Calls at once, each on a connection of the pool. */
  writers?: number;
  maxBatch?: number;
  /** A report not written within this long is answered `unavailable` (ms). */
  deadlineMs?: number;
  /**
   * Reports waiting at most (default 20,000, about 4 MB); past it a report is answered `unavailable` at once (5.03,
   * retry), so a flood cannot queue memory.
   */
  maxQueued?: number;
}

export class ReportWriter implements ReportSink {
  /** Reports waiting for a call, from `head` on (taken by index: a splice would move the rest each time). */
  private queue: Pending[] = [];
  private head = 0;
  private running = 0;
  private stopped = false;
  private readonly writers: number;
  private readonly maxBatch: number;
  private readonly deadlineMs: number;
  private readonly maxQueued: number;

  constructor(private readonly options: ReportWriterOptions) {
    this.writers = Math.max(1, options.writers ?? 1);
    this.maxBatch = options.maxBatch ?? 2000;
    this.deadlineMs = options.deadlineMs ?? 1500;
    this.maxQueued = options.maxQueued ?? 20_000;
  }

  report(deviceId: string, report: DeviceReport, transport: DeliveryTransport): Promise<ReportResult> {
    if (this.stopped || this.queue.length - this.head >= this.maxQueued)
      return Promise.resolve('unavailable');
    const local = this.options.local(deviceId);
    return new Promise<ReportResult>((resolve) => {
      const pending: Pending = {
        row: {
          deviceId,
          report,
          transport,
          localVersion: local?.version ?? null,
          localContent: local?.content ?? null,
        },
        resolve,
        settled: false,
        timer: setTimeout(() => this.settle(pending, 'unavailable'), this.deadlineMs),
      };
      pending.timer.unref();
      this.queue.push(pending);
      this.pump();
    });
  }

  /** Answers what waits `unavailable` and takes no more. */
  stop(): void {
    this.stopped = true;
    for (let i = this.head; i < this.queue.length; i++) this.settle(this.queue[i]!, 'unavailable');
    this.queue = [];
    this.head = 0;
  }

  private settle(p: Pending, result: ReportResult): void {
    if (p.settled) return;
    p.settled = true;
    clearTimeout(p.timer);
    p.resolve(result);
  }

  private pump(): void {
    while (this.running < this.writers && this.head < this.queue.length) {
      // Reports already answered (their deadline passed while they waited) are not written.
      const end = Math.min(this.queue.length, this.head + this.maxBatch);
      const batch: Pending[] = [];
      for (let i = this.head; i < end; i++) if (!this.queue[i]!.settled) batch.push(this.queue[i]!);
      this.head = end;
      if (this.head === this.queue.length) {
        this.queue = [];
        this.head = 0;
      }
      if (batch.length === 0) continue;
      this.running++;
      this.options
        .write(batch.map((p) => p.row))
        .then(
          (results) => batch.forEach((p, i) => this.settle(p, results[i] ?? 'unavailable')),
          (err: unknown) => {
            this.options.logger.warn('device reports not written', {
              reports: batch.length,
              error: errorMessage(err),
            });
            for (const p of batch) this.settle(p, 'unavailable');
          },
        )
        .finally(() => {
          this.running--;
          this.pump();
        });
    }
  }
}
