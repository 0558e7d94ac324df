// The delivery recorder (design §3.8): what the CoAP layer did for each device (sent, acknowledged, heard from,
// relations) and what each device should have (desired), gathered in memory per device and written to
// PostgreSQL in batches, off the hot path: an event costs a map lookup and a few field writes, a flush one
// function call per chunk of devices. A replica that dies loses at most what it had not flushed yet.
import { hash } from 'node:crypto';
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

/** One device's unflushed events; each part holds its newest. Times are wall-clock ms. */
class Pending {
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
  relations = false;

  /** Folds an older, unwritten batch's entry under this one (a failed flush): newer parts win. */
  absorb(older: Pending): void {
    if (this.siteId === null) this.siteId = older.siteId;
    if (this.desired === null && older.desired !== null) {
      this.desired = older.desired;
      this.desiredAt = older.desiredAt;
    }
    if (this.sent === null && older.sent !== null) {
      this.sent = older.sent;
      this.sentAt = older.sentAt;
      this.sentTransport = older.sentTransport;
      this.sentConfirmable = older.sentConfirmable;
    }
    if (this.acked === null && older.acked !== null) {
      this.acked = older.acked;
      this.ackedAt = older.ackedAt;
      this.ackedTransport = older.ackedTransport;
    }
    if (older.heardAt > this.heardAt) this.heardAt = older.heardAt;
    this.relations ||= older.relations;
  }
}

/** Device ids JSON writes as they are (the registry's pattern). */
const PLAIN_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * A document's content hash: 16 hex digits of SHA-256 of its content key (a settings document's is its source
 * and settings, not its device or version). Cached by content key, so a fleet on the same settings costs one
 * hash per flush, not one per device; the cache is dropped when it grows past a few thousand contents.
 */
const contentHashes = new Map<string, string>();
export function contentHash(doc: VisibleDocument): string {
  const key = doc.contentKey;
  let h = contentHashes.get(key);
  if (h === undefined) {
    h = hash('sha256', key, 'hex').slice(0, 16);
    if (contentHashes.size >= 4096) contentHashes.clear();
    contentHashes.set(key, h);
  }
  return h;
}

export class DeliveryRecorder implements DeliveryEvents {
  private pending = new Map<string, Pending>();
  /** Wall-clock ms of the oldest event not yet written (0: none), for the lag gauge. */
  private oldest = 0;
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

  /** Seconds since the oldest event not yet written (0 when everything is written). */
  lagSeconds(): number {
    const oldest = Math.min(this.oldest || Infinity, this.inFlightOldest || Infinity);
    return oldest === Infinity ? 0 : Math.max(0, (Date.now() - oldest) / 1000);
  }

  // ---- events (hot path: one map lookup, a few writes) ------------------------------------------------

  private entry(deviceId: string): Pending {
    let p = this.pending.get(deviceId);
    if (p === undefined) {
      p = new Pending();
      this.pending.set(deviceId, p);
      if (this.oldest === 0) this.oldest = Date.now();
    }
    return p;
  }

  /** The settings document this replica serves the device now, and the device's site. */
  desired(record: DeviceRecord, doc: VisibleDocument): void {
    const p = this.entry(record.deviceId);
    p.siteId = record.siteId;
    p.desired = doc;
    p.desiredAt = Date.now();
  }

  sent(deviceId: string, doc: VisibleDocument, transport: DeliveryTransport, confirmable: boolean): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const p = this.entry(deviceId);
    p.sent = doc;
    p.sentAt = Date.now();
    p.sentTransport = transport;
    p.sentConfirmable = confirmable;
  }

  acknowledged(deviceId: string, doc: VisibleDocument, transport: DeliveryTransport): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const p = this.entry(deviceId);
    p.acked = doc;
    p.ackedAt = p.heardAt = Date.now();
    p.ackedTransport = transport;
  }

  heard(deviceId: string, transport: DeliveryTransport): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    this.entry(deviceId).heardAt = Date.now();
  }

  registered(deviceId: string, settings: VisibleDocument | null, transport: DeliveryTransport): void {
    const p = this.entry(deviceId);
    if (settings !== null) p.relations = true;
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const now = Date.now();
    p.heardAt = now;
    if (settings === null) return;
    // The response to a registration is never confirmable (piggybacked in the ACK of a CON request, or NON):
    // the device has it, but has not acknowledged it.
    p.sent = settings;
    p.sentAt = now;
    p.sentTransport = transport;
    p.sentConfirmable = false;
  }

  relationsChanged(deviceId: string): void {
    this.entry(deviceId).relations = true;
  }

  /**
   * Reports this replica's relations of every device it holds again: after its bus session was down, another
   * replica may have reaped it from every `observed_by` (delivery_reap), and nothing else would put it back.
   */
  reportRelations(deviceIds: Iterable<string>): void {
    for (const deviceId of deviceIds) this.entry(deviceId).relations = true;
  }

  // ---- flushing -----------------------------------------------------------------------------------------

  /** Writes every pending event; one flush at a time (a tick during a flush waits for the next). */
  flush(): Promise<void> {
    if (this.flushing !== undefined) return this.flushing;
    if (this.pending.size === 0 && Date.now() - this.lastReap < this.reapMs) return Promise.resolve();
    this.flushing = this.write().finally(() => (this.flushing = undefined));
    return this.flushing;
  }

  private async write(): Promise<void> {
    const batch = this.pending;
    this.pending = new Map();
    this.inFlightOldest = this.oldest;
    this.oldest = 0;
    const started = performance.now();
    try {
      // Rows are built a chunk at a time, between the writes: a 100,000-device batch never holds the event
      // loop for more than one chunk's hashing and encoding (a few ms), so ACKs keep being read meanwhile.
      let written = 0;
      let chunk: string[] = [];
      const send = async (): Promise<void> => {
        await this.options.writer.record(this.options.replica, `[${chunk.join(',')}]`);
        written += chunk.length;
        chunk = [];
      };
      let deferred = false;
      const now = Date.now();
      for (const [deviceId, pending] of batch) {
        if (this.defer(deviceId, pending, now)) {
          deferred = true;
          continue;
        }
        chunk.push(this.rowText(deviceId, pending));
        if (chunk.length === this.chunkRows) await send();
      }
      if (chunk.length > 0) await send();
      if (deferred)
        this.oldest = this.oldest === 0 ? this.inFlightOldest : Math.min(this.oldest, this.inFlightOldest);
      this.stats.flushes++;
      this.stats.rows += written;
      const ms = performance.now() - started;
      if (written > 0) {
        this.stats.totalFlushMs += ms;
        if (ms > this.stats.maxFlushMs) this.stats.maxFlushMs = ms;
      }
      if (Date.now() - this.lastReap >= this.reapMs) {
        this.lastReap = Date.now();
        await this.options.writer.reap(this.options.replica);
      }
    } catch (err) {
      // Nothing is lost but time: the batch goes back under whatever arrived meanwhile, and the next tick
      // writes both (a chunk written before the failure is written again, which the function's rules absorb).
      this.stats.failures++;
      this.options.logger.warn('delivery record: flush failed; retrying at the next tick', {
        error: errorMessage(err),
        devices: batch.size,
      });
      for (const [deviceId, older] of batch) {
        const newer = this.pending.get(deviceId);
        if (newer === undefined) this.pending.set(deviceId, older);
        else newer.absorb(older);
      }
      this.oldest = this.oldest === 0 ? this.inFlightOldest : Math.min(this.oldest, this.inFlightOldest);
    } finally {
      this.inFlightOldest = 0;
    }
  }

  /**
   * A device whose settings just changed and that observes them here is about to be sent them (the fan-out
   * pump) and, moments later, to acknowledge them: its row waits while its desired part is younger than one
   * flush interval, so a fleet-wide change writes one row per device (desired, sent and acknowledged together)
   * instead of two, and the record's lag stays within two intervals.
   */
  private defer(deviceId: string, p: Pending, now: number): boolean {
    if (
      p.desired === null ||
      now - p.desiredAt >= this.options.flushMs ||
      p.sent !== null ||
      p.acked !== null ||
      p.relations ||
      p.heardAt > 0
    )
      return false;
    if (this.options.relationsOf(deviceId) === 0) return false;
    const newer = this.pending.get(deviceId);
    if (newer === undefined) this.pending.set(deviceId, p);
    else newer.absorb(p);
    return true;
  }

  /**
   * One row as JSON text (a DeliveryRow), written directly: 100,000 rows a fan-out, and building objects for
   * JSON.stringify cost more than the text. Every value is a number, a boolean, a fixed word, a hex digest or a
   * device id (1-128 of [A-Za-z0-9._:-], nothing JSON escapes; anything else goes through JSON.stringify).
   */
  private rowText(d: string, p: Pending): string {
    let t = `{"d":${PLAIN_ID.test(d) ? `"${d}"` : JSON.stringify(d)}`;
    const desired = p.desired;
    if (desired !== null) {
      const named = (desired.body as { source: string }).source;
      const source = named === 'override' || named === 'rollout' ? named : 'registry';
      t += `,"dv":${desired.version},"ds":"${source}","dc":"${contentHash(desired)}","da":${p.desiredAt}`;
    }
    if (p.sent !== null)
      t += `,"sv":${p.sent.version},"sc":"${contentHash(p.sent)}","sa":${p.sentAt},"st":"${p.sentTransport}","sk":${p.sentConfirmable}`;
    if (p.acked !== null)
      t += `,"av":${p.acked.version},"ac":"${contentHash(p.acked)}","aa":${p.ackedAt},"at":"${p.ackedTransport}"`;
    if (p.heardAt > 0) t += `,"h":${p.heardAt}`;
    if (p.relations) t += `,"r":${this.options.relationsOf(d)}`;
    return `${t}}`;
  }
}
