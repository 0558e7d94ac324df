// The delivery recorder (design §3.8): what the CoAP layer did for each device (sent, acknowledged, heard from,
// relations) and what each device should have (desired), gathered in memory per device and written to
// PostgreSQL in batches, off the hot path: an event costs a map lookup and a few field writes, a flush one
// function call per chunk of devices. A replica that dies loses at most what it had not flushed yet.
import { errorMessage, type Logger } from '@platform/service-kit';
import type { DeviceRecord, VisibleDocument } from '../domain/documents.js';

export type DeliveryTransport = 'plain' | 'dtls';

/** What the observe layer reports (ObserveLayer's `delivery` sink); settings resources only, except `heard`. */
export interface DeliveryEvents {
  sent(deviceId: string, doc: VisibleDocument, transport: DeliveryTransport, confirmable: boolean): void;
  acknowledged(deviceId: string, doc: VisibleDocument, transport: DeliveryTransport): void;
  heard(deviceId: string, transport: DeliveryTransport): void;
  /**
   * A relation was registered: the device was heard from, and for its settings (`settings`, the document the
   * response carried) the relations changed and the document was sent, unconfirmed. One event, one lookup.
   */
  registered(deviceId: string, settings: VisibleDocument | null, transport: DeliveryTransport): void;
  /** The device's relations to its settings on this replica changed (count read at the flush). */
  relationsChanged(deviceId: string): void;
}

/** One device's row of a batch: the argument of `device_gateway.delivery_record` (migration 0005). */
export interface DeliveryRow {
  d: string;
  s?: string;
  dv?: number;
  ds?: string;
  dc?: string;
  /** Times: wall-clock ms since the epoch. */
  da?: number;
  sv?: number;
  sc?: string;
  sa?: number;
  st?: DeliveryTransport;
  sk?: boolean;
  av?: number;
  ac?: string;
  aa?: number;
  at?: DeliveryTransport;
  h?: number;
  r?: number;
}

/** Where batches go (delivery/sql.ts against PostgreSQL). */
export interface DeliveryWriter {
  /** `rowsJson`: a JSON array of DeliveryRow. */
  record(replica: string, rowsJson: string): Promise<void>;
  /** Removes from observed_by every replica whose bus session is not up, except `self` (null: none). */
  reap(self: string | null): Promise<number>;
}

export interface DeliveryRecorderOptions {
  /** This replica's id (the bus origin): `sent_by`, `acked_by`, `observed_by`. */
  replica: string;
  writer: DeliveryWriter;
  logger: Logger;
  /** A change is written within this many ms (plus one flush's time); GATEWAY_DELIVERY_FLUSH_MS. */
  flushMs: number;
  /** Relations to the device's settings on this replica that count (see `trusts`), read at the flush. */
  relationsOf: (deviceId: string) => number;
  /**
   * Whether what arrives over `transport` may speak for the device. Over plain CoAP anyone can claim any device:
   * for a device that has a DTLS key (and a gateway that serves coaps) only its DTLS sessions count, so a plain
   * client cannot make the record say it was sent or acknowledged. Default: everything counts.
   */
  trusts?: (deviceId: string, transport: DeliveryTransport) => boolean;
  /** Rows per function call. */
  chunkRows?: number;
  /** Dead replicas are removed from `observed_by` this often (ms). */
  reapMs?: number;
}

// The parts of a device's facts not yet written (bits of `Facts.unwritten`).
const DESIRED = 1;
const SENT = 2;
const ACKED = 4;
const HEARD = 8;
const RELATIONS = 16;

/**
 * What this replica knows of one device, kept for as long as the device has events (not made per flush): each
 * part holds its newest, `unwritten` says which parts the next row carries. Times are wall-clock ms. A part is
 * never cleared, only marked written, so a failed write is undone by marking its parts unwritten again: the
 * row then carries their newest values, which the function's rules (each part only moves to a higher version)
 * accept in any order.
 */
class Facts {
  siteId: string | null = null;
  desired: VisibleDocument | null = null;
  desiredAt = 0;
  sent: VisibleDocument | null = null;
  sentAt = 0;
  sentTransport: DeliveryTransport = 'plain';
  sentConfirmable = false;
  acked: VisibleDocument | null = null;
  ackedAt = 0;
  ackedTransport: DeliveryTransport = 'plain';
  heardAt = 0;
  unwritten = 0;
  /** In the list of the next flush (or the one being written); set with `unwritten`, cleared when built. */
  queued = false;
  /** An event came since the previous sweep (see `sweep`). */
  touched = true;
  /** Wall-clock ms of the oldest unwritten event (for the lag gauge). */
  since = 0;
  /** The parts of the row being written (marked unwritten again if its write fails). */
  writing = 0;

  constructor(readonly deviceId: string) {}
}

/** Device ids JSON writes as they are (the registry's pattern). */
const PLAIN_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** A document's content hash (`VisibleDocument.contentDigest`): what the record compares, not versions. */
export function contentHash(doc: VisibleDocument): string {
  return doc.contentDigest;
}

export class DeliveryRecorder implements DeliveryEvents {
  /** Every device with events since the last sweep or unwritten parts; one object each, kept across flushes. */
  private readonly facts = new Map<string, Facts>();
  /** Devices with unwritten parts, in the order of their first unwritten event. */
  private queue: Facts[] = [];
  /** Wall-clock ms of the oldest unwritten event in `queue` (0: empty), for the lag gauge. */
  private queueOldest = 0;
  /** The batch being written, and its oldest event. */
  private inFlightOldest = 0;
  private flushing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private lastReap = 0;
  private readonly chunkRows: number;
  private readonly reapMs: number;
  readonly stats = {
    flushes: 0,
    rows: 0,
    failures: 0,
    totalFlushMs: 0,
    maxFlushMs: 0,
  };

  constructor(private readonly options: DeliveryRecorderOptions) {
    this.chunkRows = options.chunkRows ?? 2000;
    this.reapMs = options.reapMs ?? 10_000;
  }

  start(): void {
    this.timer ??= setInterval(() => void this.flush(), this.options.flushMs);
    this.timer.unref();
  }

  /**
   * Writes what is left and removes this replica from every `observed_by` (run after the bus stopped: a replica
   * whose bus session is up cannot be removed); bounded by the pool's deadlines.
   */
  async stop(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    await this.flush();
    await this.options.writer.reap(null).catch((err: unknown) => {
      this.options.logger.warn('delivery record: leaving failed', { error: errorMessage(err) });
    });
  }

  /** Devices whose facts are held: those with events in the last one or two reap intervals, or unwritten parts. */
  get devicesHeld(): number {
    return this.facts.size;
  }

  /** Seconds since the oldest event not yet written (0 when everything is written). */
  lagSeconds(): number {
    const oldest = Math.min(this.queueOldest || Infinity, this.inFlightOldest || Infinity);
    return oldest === Infinity ? 0 : Math.max(0, (Date.now() - oldest) / 1000);
  }

  // ---- events (hot path: one map lookup and a few field writes, no allocation) ---------------------------

  /** The device's facts, with `part` marked unwritten (queued for the next flush if it was not). */
  private mark(deviceId: string, part: number, now: number): Facts {
    let f = this.facts.get(deviceId);
    if (f === undefined) {
      f = new Facts(deviceId);
      this.facts.set(deviceId, f);
    }
    f.unwritten |= part;
    f.touched = true;
    if (!f.queued) {
      f.queued = true;
      f.since = now;
      this.enqueue(f);
    }
    return f;
  }

  /** The settings document this replica serves the device now, and the device's site. */
  desired(record: DeviceRecord, doc: VisibleDocument): void {
    const now = Date.now();
    const f = this.mark(record.deviceId, DESIRED, now);
    f.siteId = record.siteId;
    f.desired = doc;
    f.desiredAt = now;
  }

  sent(deviceId: string, doc: VisibleDocument, transport: DeliveryTransport, confirmable: boolean): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const now = Date.now();
    const f = this.mark(deviceId, SENT, now);
    f.sent = doc;
    f.sentAt = now;
    f.sentTransport = transport;
    f.sentConfirmable = confirmable;
  }

  acknowledged(deviceId: string, doc: VisibleDocument, transport: DeliveryTransport): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const now = Date.now();
    const f = this.mark(deviceId, ACKED | HEARD, now);
    f.acked = doc;
    f.ackedAt = f.heardAt = now;
    f.ackedTransport = transport;
  }

  heard(deviceId: string, transport: DeliveryTransport): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const now = Date.now();
    this.mark(deviceId, HEARD, now).heardAt = now;
  }

  registered(deviceId: string, settings: VisibleDocument | null, transport: DeliveryTransport): void {
    const now = Date.now();
    const trusted = this.options.trusts?.(deviceId, transport) !== false;
    const part =
      (settings !== null ? RELATIONS : 0) | (trusted ? HEARD : 0) | (trusted && settings !== null ? SENT : 0);
    if (part === 0) return;
    const f = this.mark(deviceId, part, now);
    if (!trusted) return;
    f.heardAt = now;
    if (settings === null) return;
    // The response to a registration is never confirmable (piggybacked in the ACK of a CON request, or NON):
    // the device has it, but has not acknowledged it.
    f.sent = settings;
    f.sentAt = now;
    f.sentTransport = transport;
    f.sentConfirmable = false;
  }

  relationsChanged(deviceId: string): void {
    this.mark(deviceId, RELATIONS, Date.now());
  }

  /**
   * Reports this replica's relations of every device it holds again: after its bus session was down, another
   * replica may have reaped it from every `observed_by` (delivery_reap), and nothing else would put it back.
   */
  reportRelations(deviceIds: Iterable<string>): void {
    const now = Date.now();
    for (const deviceId of deviceIds) this.mark(deviceId, RELATIONS, now);
  }

  // ---- flushing -----------------------------------------------------------------------------------------

  /** Writes every unwritten part; one flush at a time (a tick during a flush waits for the next). */
  flush(): Promise<void> {
    if (this.flushing !== undefined) return this.flushing;
    if (this.queue.length === 0 && Date.now() - this.lastReap < this.reapMs) return Promise.resolve();
    this.flushing = this.write().finally(() => (this.flushing = undefined));
    return this.flushing;
  }

  private async write(): Promise<void> {
    const batch = this.queue;
    this.queue = [];
    this.inFlightOldest = this.queueOldest;
    this.queueOldest = 0;
    const started = performance.now();
    // Rows are built a chunk at a time, between the writes: a 100,000-device batch never holds the event loop
    // for more than one chunk's encoding (a few ms), so ACKs keep being read meanwhile. A device is taken off
    // the queue when its row is built; an event after that queues it again for the next flush.
    let written = 0;
    let i = 0;
    const now = Date.now();
    try {
      while (i < batch.length) {
        const rows: string[] = [];
        const chunk: Facts[] = [];
        for (; i < batch.length && rows.length < this.chunkRows; i++) {
          const f = batch[i]!;
          if (this.defer(f, now)) {
            this.enqueue(f);
            continue;
          }
          rows.push(this.rowText(f));
          chunk.push(f);
          f.writing = f.unwritten;
          f.unwritten = 0;
          f.queued = false;
        }
        if (rows.length === 0) continue;
        try {
          await this.options.writer.record(this.options.replica, `[${rows.join(',')}]`);
        } catch (err) {
          // Its parts are unwritten again (with whatever newer values arrived meanwhile).
          for (const f of chunk) this.requeue(f, f.writing, now);
          throw err;
        }
        written += rows.length;
      }
      this.stats.flushes++;
      this.stats.rows += written;
      const ms = performance.now() - started;
      if (written > 0) {
        this.stats.totalFlushMs += ms;
        if (ms > this.stats.maxFlushMs) this.stats.maxFlushMs = ms;
      }
      if (Date.now() - this.lastReap >= this.reapMs) {
        this.lastReap = Date.now();
        this.sweep();
        await this.options.writer.reap(this.options.replica);
      }
    } catch (err) {
      // Nothing is lost but time: what was not written goes back on the queue, and the next tick writes it
      // under whatever arrived meanwhile (a chunk written before the failure is written again, which the
      // function's rules absorb).
      this.stats.failures++;
      this.options.logger.warn('delivery record: flush failed; retrying at the next tick', {
        error: errorMessage(err),
        devices: batch.length,
      });
      for (; i < batch.length; i++) if (batch[i]!.queued) this.enqueue(batch[i]!);
    } finally {
      this.inFlightOldest = 0;
    }
  }

  /** Marks `parts` of `f` unwritten again after a failed write. */
  private requeue(f: Facts, parts: number, now: number): void {
    f.unwritten |= parts;
    if (!f.queued) {
      f.queued = true;
      f.since = now;
      this.enqueue(f);
    }
  }

  private enqueue(f: Facts): void {
    this.queue.push(f);
    if (this.queueOldest === 0 || f.since < this.queueOldest) this.queueOldest = f.since;
  }

  /**
   * Forgets devices with nothing unwritten and no event since the previous sweep (one per reap interval), so
   * the map holds the devices that are active, not every device ever seen.
   */
  private sweep(): void {
    for (const [deviceId, f] of this.facts) {
      if (f.queued || f.touched) f.touched = false;
      else this.facts.delete(deviceId);
    }
  }

  /**
   * A device whose settings just changed and that observes them here is about to be sent them (the fan-out
   * pump) and, moments later, to acknowledge them: its row waits while its desired part is younger than one
   * flush interval, so a fleet-wide change writes one row per device (desired, sent and acknowledged together)
   * instead of two, and the record's lag stays within two intervals.
   */
  private defer(f: Facts, now: number): boolean {
    return (
      f.unwritten === DESIRED &&
      now - f.desiredAt < this.options.flushMs &&
      this.options.relationsOf(f.deviceId) > 0
    );
  }

  /**
   * One row as JSON text (a DeliveryRow) of the unwritten parts, written directly: 100,000 rows a fan-out, and
   * building objects for JSON.stringify cost more than the text. Every value is a number, a boolean, a fixed
   * word, a hex digest or a device id (1-128 of [A-Za-z0-9._:-], nothing JSON escapes; anything else goes
   * through JSON.stringify).
   */
  private rowText(f: Facts): string {
    const d = f.deviceId;
    const parts = f.unwritten;
    let t = `{"d":${PLAIN_ID.test(d) ? `"${d}"` : JSON.stringify(d)}`;
    const desired = f.desired;
    if (parts & DESIRED && desired !== null) {
      const named = (desired.body as { source: string }).source;
      const source = named === 'override' || named === 'rollout' ? named : 'registry';
      t += `,"dv":${desired.version},"ds":"${source}","dc":"${contentHash(desired)}","da":${f.desiredAt}`;
    }
    if (parts & SENT && f.sent !== null)
      t += `,"sv":${f.sent.version},"sc":"${contentHash(f.sent)}","sa":${f.sentAt},"st":"${f.sentTransport}","sk":${f.sentConfirmable}`;
    if (parts & ACKED && f.acked !== null)
      t += `,"av":${f.acked.version},"ac":"${contentHash(f.acked)}","aa":${f.ackedAt},"at":"${f.ackedTransport}"`;
    if (parts & HEARD && f.heardAt > 0) t += `,"h":${f.heardAt}`;
    if (parts & RELATIONS) t += `,"r":${this.options.relationsOf(d)}`;
    return `${t}}`;
  }
}
