// The delivery recorder (design §3.8): what the CoAP layer did for each device (sent, acknowledged, heard from,
// relations) and what each device should have (desired), gathered in memory per device and written to
// PostgreSQL in batches, off the hot path: an event costs a map lookup and a few typed-array stores (no
// allocation), a flush one function call per chunk of devices, the chunks of a flush on up to `writers`
// connections at once. A replica that dies loses at most what it had not flushed yet.
import { errorMessage, type Logger } from '@platform/service-kit';
import type { DeviceRecord, VisibleDocument } from '../domain/documents.js';
import type { EventClock } from './db-clock.js';
import {
  ACKED,
  ColumnBuilder,
  type DeliveryBatch,
  ACKED_DTLS,
  D_ACKED,
  D_DESIRED,
  D_SENT,
  D_STRIDE,
  DESIRED,
  HAVE_ACKED,
  HAVE_DESIRED,
  HAVE_SENT,
  HEARD,
  ID_PLAIN,
  N_ACKED_AT,
  N_ACKED_V,
  N_DESIRED_AT,
  N_DESIRED_V,
  N_HEARD_AT,
  N_ROW,
  N_SENT_AT,
  N_SENT_V,
  QUEUED,
  RELATIONS,
  SENT,
  SENT_CON,
  SENT_DTLS,
  SOURCE_MASK,
  Snapshot,
  TOUCHED,
} from './row-builder.js';

/**
 * Milliseconds on the monotonic clock, as an integer reading near the epoch's (the wall clock when the process
 * started plus the time elapsed since). Holds, dues and the lag gauge run on it, so a step of the wall clock
 * (NTP at boot, a virtual machine resumed) neither holds a row back for the length of the step nor hides the
 * record's lag (a cold review's finding). Event times are kept on it too and dated on the event clock (the
 * database's clock as this replica measures it, db-clock.ts) as a round takes them (`take`).
 */
const MONO_BASE = Math.round(performance.timeOrigin);
export function monoNow(): number {
  return MONO_BASE + Math.floor(performance.now());
}

export type DeliveryTransport = 'plain' | 'dtls';

/**
 * What `relationsOf` says of a device observed here only by relations that cannot speak for it (plain CoAP for a
 * keyed device): written as the relation count -1, the record's state is then `observed_unauthenticated` unless
 * another replica holds a relation that speaks (design §3.8).
 */
export const UNAUTHENTICATED_ONLY = -1;

/**
 * Where the caller keeps a device's slot in the recorder (the observe layer: on the device's resource), so the
 * event needs no map lookup; checked against the device id, so a stale or foreign one only costs the lookup.
 */
export interface DeliveryRef {
  deliverySlot: number;
}

/**
 * What the observe layer reports (ObserveLayer's `delivery` sink); settings resources only, except `heard`.
 * `ref`, when given, is the device's DeliveryRef.
 */
export interface DeliveryEvents {
  sent(
    deviceId: string,
    doc: VisibleDocument,
    transport: DeliveryTransport,
    confirmable: boolean,
    ref?: DeliveryRef,
  ): void;
  acknowledged(deviceId: string, doc: VisibleDocument, transport: DeliveryTransport, ref?: DeliveryRef): void;
  heard(deviceId: string, transport: DeliveryTransport, ref?: DeliveryRef): void;
  /**
   * A relation was registered: the device was heard from, and for its settings (`settings`, the document the
   * response carried) the relations changed and the document was sent, unconfirmed. One event, one lookup.
   * True when the answer's settings need a confirmation (design §3.8): the device may speak for itself over this
   * transport and has not acknowledged that content here; the observe layer then sends it once more,
   * confirmable, so its ACK is the evidence that the device holds them.
   */
  registered(
    deviceId: string,
    settings: VisibleDocument | null,
    transport: DeliveryTransport,
    ref?: DeliveryRef,
  ): boolean;
  /** The device's relations to its settings on this replica changed (count read at the flush). */
  relationsChanged(deviceId: string, ref?: DeliveryRef): void;
}

/**
 * One device's row of a batch, as objects (tests, and the keys of migration 0005's JSON rows): the recorder
 * sends the same values as columns (DeliveryBatch, `delivery_record_arrays`, migration 0011).
 */
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
  /**
   * Writes one chunk (`delivery_record_arrays`). The batch object and its strings are the recorder's, reused
   * for its next chunk once the call has settled: read them before returning, keep none. Up to `writers` calls
   * at once, never two with the same device.
   */
  record(replica: string, batch: DeliveryBatch): Promise<void>;
  /**
   * Removes from observed_by every replica whose bus session is not up, except `self` (null: none); in batches
   * that each commit on their own (0013), so a chunk of `record` waits for one batch at most.
   */
  reap(self: string | null): Promise<number>;
  /**
   * Reports how old this replica's oldest unwritten event is (ms; 0: everything is written), once a tick
   * (`delivery_report`, migration 0014): the rollout driver waits for the record that far before it judges a
   * device that has not acknowledged (design §3.9). `lagMs` is read as late as possible (once the connection
   * is the writer's); the report stands for `validMs`. Optional: a writer without it reports nothing.
   */
  report?(replica: string, lagMs: () => number, validMs: number): Promise<void>;
}

export interface DeliveryRecorderOptions {
  /** This replica's id (the bus origin): `sent_by`, `acked_by`, `observed_by`. */
  replica: string;
  writer: DeliveryWriter;
  logger: Logger;
  /** A change is written within this many ms (plus one flush's time); GATEWAY_DELIVERY_FLUSH_MS. */
  flushMs: number;
  /**
   * Relations to the device's settings on this replica that count (see `trusts`), read at the flush; whether
   * there are any is kept per device until its next relation event (registered, relationsChanged).
   * UNAUTHENTICATED_ONLY when none counts but there is one that does not (the record's
   * observed_unauthenticated_by, migration 0042).
   */
  relationsOf: (deviceId: string) => number;
  /**
   * Whether what arrives over `transport` may speak for the device. Over plain CoAP anyone can claim any device:
   * for a device that has a DTLS key (and a gateway that serves coaps) only its DTLS sessions count, so a plain
   * client cannot make the record say it was sent or acknowledged. Default: everything counts.
   */
  trusts?: (deviceId: string, transport: DeliveryTransport) => boolean;
  /** Rows per function call. */
  chunkRows?: number;
  /**
   * Chunks of one flush written at once, each on a connection of its own (GATEWAY_DELIVERY_WRITERS; default 1).
   * A device is in one chunk of a flush and every call locks its rows in device order, so they cannot deadlock.
   */
  writers?: number;
  /** Dead replicas are removed from `observed_by` this often (ms). */
  reapMs?: number;
  /**
   * The clock event times are dated on (db-clock.ts: the database's, as this replica measures it; design §3.8),
   * started and stopped with the recorder. Default: this host's wall clock.
   */
  clock?: EventClock;
}

// A slot's bytes (stride 4): unwritten parts, the parts of the row being written, flags, the desired source.
const B_UNWRITTEN = 0;
const B_WRITING = 1;
const B_FLAGS = 2;
/**
 * Bits 0-1: the desired source (index in SOURCES); ID_PLAIN: the device id needs no escaping in JSON; HELD: the
 * slot waits in the recorder's `held` list; KNOWN: OBSERVED says whether this replica has a relation to the
 * device's settings, as last looked up (cleared by every relation event). The row builder reads none of these.
 */
const B_META = 3;
const HELD = 8;
const KNOWN = 16;
const OBSERVED = 32;
const B_STRIDE = 4;
// Its numbers (stride 8, one 64-byte line): N_DESIRED_V .. N_HEARD_AT (row-builder.ts), then:
/** Monotonic ms (`monoNow`) of the oldest unwritten event (for the lag gauge). */
const N_SINCE = 7;
const N_STRIDE = 8;
/** Rows a chunk has at least when a flush is split between writers (a call's round trip is worth ~100 rows). */
const MIN_CHUNK = 250;
/** Due rows waiting in `later` go before the round's batch once the oldest is this many intervals old. */
const LATER_MAX_INTERVALS = 4;
// What `defer` says of a row: write it now, hold it for a later flush, or write it after the round's others.
const TAKE = 0;
const HOLD = 1;
const LATER = 2;
/** Device ids JSON writes as they are (the registry's pattern). */
const PLAIN_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * What this replica knows of its devices, one slot per device (assigned at its first event, freed by the sweep)
 * in typed arrays: an event stores a few numbers and allocates nothing, and the fan-out's working set holds no
 * object per device. Each part holds its newest; UNWRITTEN says which parts the next row carries. A part is
 * never cleared, only marked written, so a failed write is undone by marking its parts unwritten again: the row
 * then carries their newest values, which the function's rules (each part only moves to a higher version)
 * accept in any order.
 */
class FactTable {
  bytes: Uint8Array;
  nums: Float64Array;
  digests: Uint32Array;
  /** The number of a slot's entry in the recorder's `held` list (valid while its HELD bit is set). */
  heldSeq: Int32Array;
  /** The device of each slot ('' when free). */
  ids: string[] = [];
  /** Slots in use, by device. */
  readonly index = new Map<string, number>();
  private readonly free: number[] = [];
  /** Slots ever handed out (the next new one). */
  private used = 0;
  // The digest last parsed (a fleet on the same settings shares one digest string).
  private lastDigest = '';
  private lastHi = 0;
  private lastLo = 0;

  constructor(public capacity: number) {
    this.bytes = new Uint8Array(capacity * B_STRIDE);
    this.nums = new Float64Array(capacity * N_STRIDE);
    this.digests = new Uint32Array(capacity * D_STRIDE);
    this.heldSeq = new Int32Array(capacity);
  }

  /** The device's slot, assigned if it has none (cleared). */
  slot(deviceId: string): number {
    const s = this.index.get(deviceId);
    return s === undefined ? this.assign(deviceId) : s;
  }

  private assign(deviceId: string): number {
    let s = this.free.pop();
    if (s === undefined) {
      if (this.used === this.capacity) this.grow();
      s = this.used++;
    }
    this.bytes.fill(0, s * B_STRIDE, (s + 1) * B_STRIDE);
    this.nums.fill(0, s * N_STRIDE, (s + 1) * N_STRIDE);
    this.ids[s] = deviceId;
    if (PLAIN_ID.test(deviceId)) this.bytes[s * B_STRIDE + B_META] = ID_PLAIN;
    this.index.set(deviceId, s);
    return s;
  }

  release(s: number): void {
    this.index.delete(this.ids[s]!);
    this.ids[s] = '';
    this.bytes[s * B_STRIDE + B_FLAGS] = 0;
    this.free.push(s);
  }

  private grow(): void {
    const capacity = this.capacity * 2;
    const bytes = new Uint8Array(capacity * B_STRIDE);
    bytes.set(this.bytes);
    const nums = new Float64Array(capacity * N_STRIDE);
    nums.set(this.nums);
    const digests = new Uint32Array(capacity * D_STRIDE);
    digests.set(this.digests);
    const heldSeq = new Int32Array(capacity);
    heldSeq.set(this.heldSeq);
    this.heldSeq = heldSeq;
    this.bytes = bytes;
    this.nums = nums;
    this.digests = digests;
    this.capacity = capacity;
  }

  /** Whether the content digest at `d` (digests) of slot `s` is `doc`'s. */
  holdsDigest(s: number, d: number, doc: VisibleDocument): boolean {
    const h = doc.contentDigest;
    const i = s * D_STRIDE + d;
    return this.digests[i] === hex32(h, 0) && this.digests[i + 1] === hex32(h, 8);
  }

  /** Stores a document's version and content digest at `n` (nums) and `d` (digests) of slot `s`. */
  setDoc(s: number, n: number, d: number, doc: VisibleDocument): void {
    this.nums[s * N_STRIDE + n] = doc.version;
    const h = doc.contentDigest;
    if (h !== this.lastDigest) {
      this.lastHi = hex32(h, 0);
      this.lastLo = hex32(h, 8);
      this.lastDigest = h;
    }
    const i = s * D_STRIDE + d;
    this.digests[i] = this.lastHi;
    this.digests[i + 1] = this.lastLo;
  }
}

/**
 * Eight hex digits of `h` from `at` as a number. A content digest is 16 lowercase hex digits of SHA-256
 * (documents.ts), never anything else; nothing here throws, since it runs inside the CoAP layer's handlers.
 */
function hex32(h: string, at: number): number {
  let v = 0;
  for (let i = at; i < at + 8; i++) {
    const c = h.charCodeAt(i) | 0;
    v = v * 16 + ((c <= 57 ? c - 48 : (c | 32) - 87) & 15);
  }
  return v;
}

/** A document's content hash (`VisibleDocument.contentDigest`): what the record compares, not versions. */
export function contentHash(doc: VisibleDocument): string {
  return doc.contentDigest;
}

export class DeliveryRecorder implements DeliveryEvents {
  /** Every device with events since the last sweep or unwritten parts: one slot each, kept across flushes. */
  private readonly table = new FactTable(1024);
  /** Slots with unwritten parts, in the order of their first unwritten event (`queued` of them). */
  private queue = new Int32Array(1024);
  private queued = 0;
  /** The queue being written (swapped with `queue` at each flush). */
  private spare = new Int32Array(1024);
  /** Monotonic ms of the oldest unwritten event in `queue` (0: empty), for the lag gauge. */
  private queueOldest = 0;
  /** The batch being written, and its oldest event. */
  private inFlightOldest = 0;
  /** One a writer: the chunk it writes, built from its own snapshot and buffer. */
  private readonly lanes: Lane[];
  private flushing: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** Started: the timer ticks, and a flush also starts early (see `mark`). */
  private running = false;
  /**
   * Rows that became writable since the last flush took the queue (a part other than desired alone): when a
   * chunk's worth waits, a flush starts without waiting for the tick (design §3.8).
   */
  private ready = 0;
  /** An early flush is scheduled (setImmediate), or wanted when the running flush ends. */
  private earlyScheduled = false;
  private earlyWanted = false;
  /** A tick (or `flush()`) came during an early flush: it goes on with a round of the tick's rules. */
  private tickWanted = false;
  /** When the rows a flush deferred are due (monotonic ms, 0: none), and the timer that flushes them then. */
  private deferredDue = 0;
  private dueTimer: NodeJS.Timeout | undefined;
  private lastReap = 0;
  /** A round's due rows of desired parts alone, taken after its other rows (see `write`). */
  private later = new Int32Array(1024);
  /** later[laterAt..laterN) wait (QUEUED, in no queue); their oldest event (for the lag gauge). */
  private laterAt = 0;
  private laterN = 0;
  private laterOldest = 0;
  /**
   * Rows a round held back (HOLD) whose device has had no new part since: kept out of the queue, so the early
   * flushes during a fan-out do not read them again at every round (100,000 after a reload, about fifty rounds);
   * the first round of a tick (or of the due timer, or `flush()`) puts them back at the head of the queue.
   * held[0..heldN) with heldSeqs[k], valid while the slot is HELD with that number (an entry whose slot left is
   * skipped); heldLive of them valid, their oldest event heldOldest (for the lag gauge; 0 once none is left).
   * heldDue[k] and heldSince[k]: when the entry's row was due when held, and its oldest unwritten event (which
   * does not change while it is queued), read in order by `unholdAll` rather than from the slot.
   */
  private held = new Int32Array(1024);
  private heldSeqs = new Int32Array(1024);
  private heldDue = new Float64Array(1024);
  private heldSince = new Float64Array(1024);
  /** When the row `defer` just held is due. */
  private holdDue = 0;
  private heldN = 0;
  private heldLive = 0;
  private heldOldest = 0;
  private heldNext = 0;
  /** The reap running beside the rounds (writers > 1), in place of one writer. */
  private reaping: Promise<void> | undefined;
  /** Wall clock minus monotonic clock (ms) when the round began: what `take` adds to its rows' event times. */
  private wallOffset = 0;
  /** Stopping: the last flush holds nothing back (`defer`, `unholdAll`), and relations are no longer reported. */
  private final = false;
  /** A progress report is under way; the last one failed. */
  private reporting = false;
  private reportFailing = false;
  private readonly chunkRows: number;
  private readonly writers: number;
  private readonly reapMs: number;
  readonly stats = {
    flushes: 0,
    rows: 0,
    failures: 0,
    totalFlushMs: 0,
    maxFlushMs: 0,
    /** Flushes started early (a chunk's worth waiting) rather than by the tick; counted in `flushes` too. */
    earlyFlushes: 0,
    /** Function calls (chunks) written. */
    chunks: 0,
  };

  constructor(private readonly options: DeliveryRecorderOptions) {
    this.chunkRows = options.chunkRows ?? 2000;
    this.writers = Math.max(1, options.writers ?? 1);
    this.reapMs = options.reapMs ?? 10_000;
    this.lanes = Array.from({ length: this.writers }, () => ({
      chunk: new Int32Array(this.chunkRows),
      since: new Float64Array(this.chunkRows),
      snapshot: new Snapshot(this.chunkRows),
      columns: new ColumnBuilder(),
    }));
  }

  start(): void {
    this.running = true;
    this.options.clock?.start();
    // The first reap one interval from now, not at the first flush: the devices of a replica that died register
    // again here meanwhile, and each such write leaves the dead replica out of observed_by itself (0015), so
    // the reap finds their rows clean instead of writing each a second time.
    this.lastReap = monoNow();
    this.timer ??= setInterval(() => {
      void this.flush();
      this.report();
    }, this.options.flushMs);
    this.timer.unref();
    this.report();
  }

  /**
   * Tells the database how far this replica's record is written (the writer's `report`), unless a report is
   * still under way. The lag is read once the writer holds its connection, and the database subtracts it from
   * its own clock when the call arrives, so what it stores is earlier than what is really written by no more
   * than the call's way there: never a device judged on a record that is not there yet. (The lag is measured
   * on the wall clock: a step of the host's clock backwards makes it look smaller by the step.)
   */
  private report(): void {
    const writer = this.options.writer;
    if (writer.report === undefined || this.reporting) return;
    this.reporting = true;
    // A report stands for three intervals (at least 5 s): a replica whose bus session is down is still waited
    // for while it keeps reporting, and one that died is not once its last report lapses.
    const validMs = Math.min(600_000, Math.max(5000, 3 * this.options.flushMs));
    writer
      .report(this.options.replica, () => Math.min(86_400_000, Math.ceil(this.lagSeconds() * 1000)), validMs)
      .then(
        () => {
          if (this.reportFailing) this.options.logger.info('delivery record: reporting progress again');
          this.reportFailing = false;
        },
        (err: unknown) => {
          // Once a failing streak: the flushes' own warnings say the rest.
          if (!this.reportFailing)
            this.options.logger.warn('delivery record: reporting progress failed', {
              error: errorMessage(err),
            });
          this.reportFailing = true;
        },
      )
      .finally(() => (this.reporting = false));
  }

  /**
   * Writes what is left and removes this replica from every `observed_by` (run after the bus stopped: a replica
   * whose bus session is up cannot be removed); bounded by the pool's deadlines.
   */
  async stop(): Promise<void> {
    this.running = false;
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    if (this.dueTimer !== undefined) clearTimeout(this.dueTimer);
    this.dueTimer = undefined;
    await this.flushing;
    // The last flush writes every row, held ones too: nothing will join them (design §3.8, "a clean stop
    // writes the rest"; a cold review found a young desired part of an observed device left unwritten).
    this.final = true;
    await this.flush();
    await this.reaping;
    await this.options.writer.reap(null).catch((err: unknown) => {
      this.options.logger.warn('delivery record: leaving failed', { error: errorMessage(err) });
    });
    this.options.clock?.stop();
  }

  /** Devices whose facts are held: those with events in the last one or two reap intervals, or unwritten parts. */
  get devicesHeld(): number {
    return this.table.index.size;
  }

  /** Seconds since the oldest event not yet written (0 when everything is written). */
  lagSeconds(): number {
    const oldest = Math.min(
      this.queueOldest || Infinity,
      this.inFlightOldest || Infinity,
      this.laterOldest || Infinity,
      this.heldOldest || Infinity,
    );
    return oldest === Infinity ? 0 : Math.max(0, (monoNow() - oldest) / 1000);
  }

  // ---- events (hot path: one map lookup and a few typed-array stores, no allocation) --------------------

  /**
   * The device's slot, with `part` marked unwritten (queued for the next flush if it was not). `stays`: the part
   * is a confirmable notification's send, which leaves a held row held (below).
   */
  private mark(deviceId: string, part: number, now: number, ref?: DeliveryRef, stays = false): number {
    const t = this.table;
    let s: number;
    if (ref === undefined) s = t.slot(deviceId);
    else {
      s = ref.deliverySlot;
      if (s < 0 || t.ids[s] !== deviceId) ref.deliverySlot = s = t.slot(deviceId);
    }
    const b = s * B_STRIDE;
    const bytes = t.bytes;
    const before = bytes[b + B_UNWRITTEN]!;
    bytes[b + B_UNWRITTEN] = before | part;
    if ((part & RELATIONS) !== 0) bytes[b + B_META]! &= ~KNOWN;
    // A part other than desired alone, new to the row: one more row a flush can write now (counted once a part),
    // unless the part is a confirmable notification's send (`stays`) that leaves the row with its acknowledgement
    // still to come and nothing else to write: an early round would only hold it. A held row then stays in
    // `held`, a row with nothing unwritten goes there at once, neither counted; its acknowledgement (or the next
    // tick, which puts every held row back) brings it to the queue.
    const flags = bytes[b + B_FLAGS]!;
    const held =
      stays &&
      ((flags & QUEUED) === 0 ? before === 0 : (bytes[b + B_META]! & HELD) !== 0 && (before & ACKED) === 0);
    const fresh = (part & ~before & ~DESIRED) !== 0 && !held;
    if (fresh && ++this.ready >= this.chunkRows) this.early();
    if ((flags & QUEUED) === 0) {
      bytes[b + B_FLAGS] = flags | QUEUED | TOUCHED;
      t.nums[s * N_STRIDE + N_SINCE] = now;
      if (held) this.hold(s, now + this.options.flushMs);
      else this.enqueue(s, now);
    } else {
      bytes[b + B_FLAGS] = flags | TOUCHED;
      // A held row with a new part (its notification sent, or acknowledged) is due for a look again: back in the
      // queue, where the next early round finds it.
      if (fresh && (bytes[b + B_META]! & HELD) !== 0) {
        this.unhold(s);
        this.enqueue(s, t.nums[s * N_STRIDE + N_SINCE]!);
      }
    }
    return s;
  }

  /**
   * The settings document this replica serves the device now (and the device's site, which the row does not
   * carry). `ref`: where the registry keeps the device's slot (its entry in GatewayState), as for the observe
   * layer's events: a reload's 100,000 events then need no lookup in the recorder's map.
   */
  desired(record: DeviceRecord, doc: VisibleDocument, ref?: DeliveryRef): void {
    const now = monoNow();
    const t = this.table;
    const s = this.mark(record.deviceId, DESIRED, now, ref);
    t.setDoc(s, N_DESIRED_V, D_DESIRED, doc);
    t.nums[s * N_STRIDE + N_DESIRED_AT] = now;
    const named = (doc.body as { source?: unknown }).source;
    const b = s * B_STRIDE;
    t.bytes[b + B_META] =
      (t.bytes[b + B_META]! & ~SOURCE_MASK) | (named === 'override' ? 1 : named === 'rollout' ? 2 : 0);
    t.bytes[b + B_FLAGS]! |= HAVE_DESIRED;
  }

  sent(
    deviceId: string,
    doc: VisibleDocument,
    transport: DeliveryTransport,
    confirmable: boolean,
    ref?: DeliveryRef,
  ): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const now = monoNow();
    const s = this.mark(deviceId, SENT, now, ref, confirmable);
    this.setSent(s, doc, now, transport, confirmable);
  }

  private setSent(
    s: number,
    doc: VisibleDocument,
    now: number,
    transport: DeliveryTransport,
    con: boolean,
  ): void {
    const t = this.table;
    t.setDoc(s, N_SENT_V, D_SENT, doc);
    t.nums[s * N_STRIDE + N_SENT_AT] = now;
    const i = s * B_STRIDE + B_FLAGS;
    t.bytes[i] =
      (t.bytes[i]! & ~(SENT_DTLS | SENT_CON)) |
      HAVE_SENT |
      (transport === 'dtls' ? SENT_DTLS : 0) |
      (con ? SENT_CON : 0);
  }

  acknowledged(
    deviceId: string,
    doc: VisibleDocument,
    transport: DeliveryTransport,
    ref?: DeliveryRef,
  ): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const now = monoNow();
    const t = this.table;
    const s = this.mark(deviceId, ACKED | HEARD, now, ref);
    t.setDoc(s, N_ACKED_V, D_ACKED, doc);
    const n = s * N_STRIDE;
    t.nums[n + N_ACKED_AT] = now;
    t.nums[n + N_HEARD_AT] = now;
    const i = s * B_STRIDE + B_FLAGS;
    t.bytes[i] = (t.bytes[i]! & ~ACKED_DTLS) | HAVE_ACKED | (transport === 'dtls' ? ACKED_DTLS : 0);
  }

  heard(deviceId: string, transport: DeliveryTransport, ref?: DeliveryRef): void {
    if (this.options.trusts?.(deviceId, transport) === false) return;
    const now = monoNow();
    const s = this.mark(deviceId, HEARD, now, ref);
    this.table.nums[s * N_STRIDE + N_HEARD_AT] = now;
  }

  registered(
    deviceId: string,
    settings: VisibleDocument | null,
    transport: DeliveryTransport,
    ref?: DeliveryRef,
  ): boolean {
    const now = monoNow();
    const trusted = this.options.trusts?.(deviceId, transport) !== false;
    const part =
      (settings !== null ? RELATIONS : 0) | (trusted ? HEARD : 0) | (trusted && settings !== null ? SENT : 0);
    if (part === 0) return false;
    const s = this.mark(deviceId, part, now, ref);
    if (!trusted) return false;
    this.table.nums[s * N_STRIDE + N_HEARD_AT] = now;
    if (settings === null) return false;
    // The response to a registration is never confirmable (piggybacked in the ACK of a CON request, or NON):
    // the device has it, but has not acknowledged it. Unless it acknowledged this content here before (a device
    // registering again on the same replica), the caller confirms it with a confirmable notification.
    const t = this.table;
    const acked =
      (t.bytes[s * B_STRIDE + B_FLAGS]! & HAVE_ACKED) !== 0 && t.holdsDigest(s, D_ACKED, settings);
    this.setSent(s, settings, now, transport, false);
    return !acked;
  }

  relationsChanged(deviceId: string, ref?: DeliveryRef): void {
    this.mark(deviceId, RELATIONS, monoNow(), ref);
  }

  /**
   * Reports this replica's relations of every device it holds again: after its bus session was down, another
   * replica may have reaped it from every `observed_by` (delivery_reap), and nothing else would put it back.
   */
  reportRelations(deviceIds: Iterable<string>): void {
    // After stop (a resync's later report, resync.ts): the replica has left every observed_by.
    if (this.final) return;
    const now = monoNow();
    for (const deviceId of deviceIds) this.mark(deviceId, RELATIONS, now);
  }

  // ---- flushing -----------------------------------------------------------------------------------------

  /**
   * Writes every unwritten part (but the rows `defer` holds back); one flush at a time (a tick during a flush
   * makes it go on under the tick's rules), in rounds of a few chunks written on up to `writers` connections
   * at once, until a round finds no more than it may take.
   */
  flush(): Promise<void> {
    return this.begin(false);
  }

  private begin(early: boolean): Promise<void> {
    if (this.flushing !== undefined) {
      if (!early) this.tickWanted = true;
      return this.flushing;
    }
    if (this.queued === 0 && (early || this.heldLive === 0) && monoNow() - this.lastReap < this.reapMs)
      return Promise.resolve();
    if (early) this.stats.earlyFlushes++;
    this.flushing = this.drain(early).finally(() => {
      this.flushing = undefined;
      // Rows that became writable during the last round: a chunk's worth starts the next flush at once.
      if (this.earlyWanted || this.ready >= this.chunkRows) {
        this.earlyWanted = false;
        this.early();
      }
    });
    return this.flushing;
  }

  /**
   * Rounds until one takes all it found: a round takes at most two chunks a writer, the oldest first, so an
   * event waits for the rows queued before it, not for a whole backlog taken at once (design §3.8).
   */
  private async drain(early: boolean): Promise<void> {
    let rules = early;
    // The held rows are put back in the queue by the first round under the tick's rules, once a tick: a drain's
    // later rounds would only hold the same rows again.
    let merge = !early;
    for (;;) {
      const more = await this.write(rules, merge);
      merge = false;
      if (this.tickWanted) {
        this.tickWanted = false;
        rules = false;
        merge = true;
      } else if (!more) return;
    }
  }

  /**
   * A flush before the tick, once a chunk's worth of rows can be written (design §3.8): at the tick alone a
   * fan-out's rows would wait up to a whole interval and then arrive all at once; started as they come, they
   * are written while the fan-out runs, on every writer. Scheduled, not run inside the event that counted the
   * row (the CoAP layer's handler); while a flush runs, the next starts when it ends.
   */
  private early(): void {
    if (!this.running || this.earlyScheduled) return;
    if (this.flushing !== undefined) {
      this.earlyWanted = true;
      return;
    }
    this.earlyScheduled = true;
    setImmediate(() => {
      this.earlyScheduled = false;
      if (this.flushing !== undefined) this.earlyWanted = true;
      else if (this.running) void this.begin(true);
    });
  }

  /** One round; true when it stopped at its limit with rows of its batch left (which stay first in the queue). */
  private async write(early: boolean, merge: boolean): Promise<boolean> {
    const now = monoNow();
    // The event clock's reading against the monotonic one, once a round: its rows' event times are dated with it.
    this.wallOffset = (this.options.clock?.now() ?? Date.now()) - now;
    const keptDue = merge ? this.unholdAll(now) : 0;
    // The batch is the queue as it is now; events from here on queue their devices in the other array. A slot
    // is in at most one of them (QUEUED), so each holds at most every slot, and a device is in one chunk.
    const batch = this.queue;
    const size = this.queued;
    // The round's limit: what its writers take in about two calls each.
    const limit = 2 * this.writers * this.chunkRows;
    let taken = 0;
    this.queue = this.spare.length >= batch.length ? this.spare : new Int32Array(batch.length);
    this.queued = 0;
    this.ready = 0;
    this.deferredDue = keptDue;
    this.inFlightOldest = this.queueOldest;
    this.queueOldest = 0;
    const started = performance.now();
    const t = this.table;
    // Chunks no larger than chunkRows, and small enough that a small flush still uses every writer.
    const per = Math.min(
      this.chunkRows,
      Math.max(MIN_CHUNK, Math.ceil((size + this.laterN - this.laterAt) / this.writers)),
    );
    // Each writer takes a chunk at a time from the batch (one cursor, `i`): its devices' unwritten parts are
    // copied into its snapshot and marked written (copy and clear, so no event is lost or read half-written),
    // then the chunk's columns are built from the snapshot and written. An event after its device was taken
    // queues it again for the next flush; a failed write marks what it carried unwritten again. After a failure
    // no further chunk is taken; the chunks in flight finish (or fail and are marked unwritten) first.
    let written = 0;
    let i = 0;
    let failure: { err: unknown } | undefined;
    // Due rows of desired parts alone of observed devices (`later`, kept across rounds so a round does not scan
    // them again): taken once the batch's other rows are, so while the fan-out is still notifying those devices
    // they wait for their acknowledgements where the writers are busy, and take one row.
    if (this.later.length < this.laterN + size) {
      const grown = new Int32Array(Math.max(this.laterN + size, this.later.length * 2));
      grown.set(this.later.subarray(this.laterAt, this.laterN));
      this.laterN -= this.laterAt;
      this.laterAt = 0;
      this.later = grown;
    }
    const later = this.later;
    // ... unless they have waited LATER_MAX_INTERVALS intervals: then they go first, so a stream of newer rows
    // that never lets a round reach the end of its batch cannot keep them waiting (the lag stays bounded by the
    // backlog of a row per device). A reload's fan-out on the benchmark machine is over before that.
    const laterFirst =
      this.laterOldest !== 0 && now - this.laterOldest >= LATER_MAX_INTERVALS * this.options.flushMs;
    const takeLater = (l: Lane, n: number): number => {
      for (; this.laterAt < this.laterN && n < per && taken < limit; this.laterAt++) {
        const s = later[this.laterAt]!;
        const since0 = t.nums[s * N_STRIDE + N_SINCE]!;
        if (!this.take(l.snapshot, s, n)) break;
        l.since[n] = since0;
        l.chunk[n++] = s;
        taken++;
      }
      return n;
    };
    const lane = async (l: Lane): Promise<void> => {
      while (failure === undefined && taken < limit && (i < size || this.laterAt < this.laterN)) {
        let n = laterFirst ? takeLater(l, 0) : 0;
        for (; i < size && n < per && taken < limit; i++) {
          const s = batch[i]!;
          const d = this.defer(s, now, early);
          if (d === HOLD) {
            this.hold(s, this.holdDue);
            continue;
          }
          if (d === LATER) {
            later[this.laterN++] = s;
            const since = t.nums[s * N_STRIDE + N_SINCE]!;
            if (this.laterOldest === 0 || since < this.laterOldest) this.laterOldest = since;
            continue;
          }
          const since0 = t.nums[s * N_STRIDE + N_SINCE]!;
          if (!this.take(l.snapshot, s, n)) break; // the snapshot's id area is full: the next chunk takes it
          l.since[n] = since0;
          l.chunk[n++] = s;
          taken++;
        }
        if (i >= size) n = takeLater(l, n);
        if (n === 0) continue;
        try {
          await this.options.writer.record(this.options.replica, l.columns.build(l.snapshot, n));
        } catch (err) {
          // Its parts are unwritten again (with whatever newer values arrived meanwhile).
          for (let k = 0; k < n; k++) this.requeue(l.chunk[k]!, l.since[k]!);
          failure ??= { err };
          return;
        }
        // Counted as written, chunk by chunk: a round that fails later still wrote this one.
        written += n;
        this.stats.rows += n;
        this.stats.chunks++;
      }
    };
    try {
      // While a reap runs beside the rounds it holds one writer's connection.
      await Promise.all(this.reaping === undefined ? this.lanes.map(lane) : this.lanes.slice(1).map(lane));
      if (failure !== undefined) throw failure.err;
      this.stats.flushes++;
      const ms = performance.now() - started;
      if (written > 0) {
        this.stats.totalFlushMs += ms;
        if (ms > this.stats.maxFlushMs) this.stats.maxFlushMs = ms;
      }
      if (monoNow() - this.lastReap >= this.reapMs && this.reaping === undefined) {
        this.lastReap = monoNow();
        this.sweep();
        // A reap after a replica died updates every row that named it (100,000 after a fleet's fan-out: seconds);
        // with more than one writer it runs beside the next rounds, in place of one writer, instead of holding
        // them. It locks its rows in device order (0009), like every chunk, so they cannot deadlock, and commits
        // them in batches of REAP_BATCH (0013), so a chunk over rows it has passed waits for one batch, not for
        // the whole reap.
        const reap = this.options.writer.reap(this.options.replica);
        if (this.writers === 1) await reap;
        else
          this.reaping = reap.then(
            () => {
              this.reaping = undefined;
            },
            (err: unknown) => {
              this.reaping = undefined;
              this.options.logger.warn('delivery record: reaping failed; retrying after the next interval', {
                error: errorMessage(err),
              });
            },
          );
      }
    } catch (err) {
      // Nothing is lost but time: what was not written goes back on the queue (the failed chunks' rows by
      // `requeue`, the rest of the batch below), and the next tick writes it under whatever arrived meanwhile
      // (a chunk written before the failure is written again, which the function's rules absorb).
      this.stats.failures++;
      this.options.logger.warn('delivery record: flush failed; retrying at the next tick', {
        error: errorMessage(err),
        devices: size,
      });
    } finally {
      this.inFlightOldest = 0;
      this.requeueRest(batch, i, size);
      // The waiting rows' oldest event, for the lag gauge (a read a row: no lookup).
      let oldest = 0;
      for (let k = this.laterAt; k < this.laterN; k++) {
        const since = t.nums[this.later[k]! * N_STRIDE + N_SINCE]!;
        if (oldest === 0 || since < oldest) oldest = since;
      }
      this.laterOldest = oldest;
      if (this.laterAt === this.laterN) this.laterAt = this.laterN = 0;
      this.scheduleDue();
    }
    return failure === undefined && (i < size || this.laterAt < this.laterN);
  }

  /**
   * Slot `s` (QUEUED, in no queue) waits in `held` until a new part or the next tick's first round; `due`: when
   * `defer` found it due.
   */
  private hold(s: number, due: number): void {
    if (this.heldN === this.held.length) {
      // Entries whose slot left are dropped first; the list grows only when most are valid.
      if (this.heldLive <= this.heldN >> 1) this.compactHeld();
      else {
        const size = this.held.length * 2;
        const held = new Int32Array(size);
        held.set(this.held);
        const seqs = new Int32Array(size);
        seqs.set(this.heldSeqs);
        const dues = new Float64Array(size);
        dues.set(this.heldDue);
        const sinces = new Float64Array(size);
        sinces.set(this.heldSince);
        this.held = held;
        this.heldSeqs = seqs;
        this.heldDue = dues;
        this.heldSince = sinces;
      }
    }
    const t = this.table;
    const seq = (this.heldNext = (this.heldNext + 1) | 0);
    t.heldSeq[s] = seq;
    t.bytes[s * B_STRIDE + B_META]! |= HELD;
    const since = t.nums[s * N_STRIDE + N_SINCE]!;
    const k = this.heldN++;
    this.held[k] = s;
    this.heldSeqs[k] = seq;
    this.heldDue[k] = due;
    this.heldSince[k] = since;
    this.heldLive++;
    if (this.heldOldest === 0 || since < this.heldOldest) this.heldOldest = since;
  }

  /** Slot `s` leaves `held` (its entry stays, skipped as no longer valid). */
  private unhold(s: number): void {
    this.table.bytes[s * B_STRIDE + B_META]! &= ~HELD;
    if (--this.heldLive === 0) this.heldN = this.heldOldest = 0;
  }

  private compactHeld(): void {
    const t = this.table;
    let n = 0;
    for (let k = 0; k < this.heldN; k++) {
      const s = this.held[k]!;
      if ((t.bytes[s * B_STRIDE + B_META]! & HELD) === 0 || t.heldSeq[s] !== this.heldSeqs[k]) continue;
      this.held[n] = s;
      this.heldSeqs[n] = this.heldSeqs[k]!;
      this.heldDue[n] = this.heldDue[k]!;
      this.heldSince[n++] = this.heldSince[k]!;
    }
    this.heldN = n;
  }

  /**
   * Every held row back at the head of the queue (older than what was queued since), in the order held, but
   * those the round would hold again under the tick's rules (`defer`): a desired part alone, younger than an
   * interval, of a device known to be observed here. They stay in `held` (a reload's tick during its fan-out
   * would otherwise move 100,000 rows to the queue and back, and the due timer, which fires as each part of a
   * reload's rows comes due, again each time); returns when the first of them is due (0: none). Such a row's
   * due is read from its entry: a desired part that changed again while held has a later due than its entry
   * says, so it is at most moved early and held again by `defer`.
   */
  private unholdAll(now: number): number {
    let due = 0;
    if (this.heldLive > 0) {
      const t = this.table;
      const total = this.heldLive + this.queued;
      const next = this.spare.length >= total ? this.spare : new Int32Array(Math.max(total, t.capacity));
      let n = 0;
      let kept = 0;
      let keptOldest = 0;
      let movedOldest = 0;
      for (let k = 0; k < this.heldN; k++) {
        const s = this.held[k]!;
        const m = s * B_STRIDE + B_META;
        const meta = t.bytes[m]!;
        if ((meta & HELD) === 0 || t.heldSeq[s] !== this.heldSeqs[k]) continue;
        const since = this.heldSince[k]!;
        const at = this.heldDue[k]!;
        if (
          !this.final &&
          at > now &&
          t.bytes[s * B_STRIDE + B_UNWRITTEN] === DESIRED &&
          (meta & (KNOWN | OBSERVED)) === (KNOWN | OBSERVED)
        ) {
          this.held[kept] = s;
          this.heldSeqs[kept] = this.heldSeqs[k]!;
          this.heldDue[kept] = at;
          this.heldSince[kept++] = since;
          if (keptOldest === 0 || since < keptOldest) keptOldest = since;
          if (due === 0 || at < due) due = at;
          continue;
        }
        t.bytes[m] = meta & ~HELD;
        next[n++] = s;
        if (movedOldest === 0 || since < movedOldest) movedOldest = since;
      }
      if (n > 0) {
        next.set(this.queue.subarray(0, this.queued), n);
        this.spare = this.queue;
        this.queue = next;
        this.queued += n;
        if (movedOldest !== 0 && (this.queueOldest === 0 || movedOldest < this.queueOldest))
          this.queueOldest = movedOldest;
      }
      this.heldN = this.heldLive = kept;
      this.heldOldest = keptOldest;
      return due;
    }
    this.heldN = this.heldLive = this.heldOldest = 0;
    return due;
  }

  /**
   * Puts the batch's rows a round did not reach (batch[from..size), still QUEUED) back at the head of the
   * queue, before the events that came during the round: the oldest are written first.
   */
  private requeueRest(batch: typeof this.queue, from: number, size: number): void {
    const rest = size - from;
    if (rest <= 0) {
      this.spare = batch;
      return;
    }
    const t = this.table;
    const total = rest + this.queued;
    const next = batch.length >= total ? batch : new Int32Array(Math.max(total, t.capacity));
    if (next === batch) next.copyWithin(0, from, size);
    else next.set(batch.subarray(from, size));
    next.set(this.queue.subarray(0, this.queued), rest);
    let oldest = this.queueOldest;
    for (let k = 0; k < rest; k++) {
      const since = t.nums[next[k]! * N_STRIDE + N_SINCE]!;
      if (oldest === 0 || since < oldest) oldest = since;
    }
    this.spare = this.queue;
    this.queue = next;
    this.queued = total;
    this.queueOldest = oldest;
  }

  /**
   * Rows this flush deferred are written when they are due, not at the tick after (which could come up to an
   * interval later): one timer, for the first of them.
   */
  private scheduleDue(): void {
    if (this.deferredDue === 0 || !this.running || this.dueTimer !== undefined) return;
    const wait = Math.max(0, this.deferredDue - monoNow());
    this.dueTimer = setTimeout(() => {
      this.dueTimer = undefined;
      void this.flush();
    }, wait);
    this.dueTimer.unref();
  }

  /**
   * Copies slot `s`'s unwritten parts into row `r` of the snapshot and marks them written (WRITING keeps them
   * until the write is known); false when its device id does not fit in this chunk.
   */
  private take(snap: Snapshot, s: number, r: number): boolean {
    const t = this.table;
    const b = s * B_STRIDE;
    const bytes = t.bytes;
    const parts = bytes[b + B_UNWRITTEN]!;
    const d = t.ids[s]!;
    if (!snap.putId(r, d, (bytes[b + B_META]! & ID_PLAIN) !== 0)) return false;
    const o = r * 4;
    snap.bytes[o] = parts;
    snap.bytes[o + 1] = bytes[b + B_FLAGS]!;
    snap.bytes[o + 2] = bytes[b + B_META]!;
    const from = s * N_STRIDE;
    const nums = t.nums;
    const to = r * N_ROW;
    const sn = snap.nums;
    for (let k = 0; k < N_ROW; k++) sn[to + k] = nums[from + k]!;
    // Event times, monotonic in the slot, dated on the event clock of this round (0: never happened).
    const off = this.wallOffset;
    if (sn[to + N_DESIRED_AT]! > 0) sn[to + N_DESIRED_AT]! += off;
    if (sn[to + N_SENT_AT]! > 0) sn[to + N_SENT_AT]! += off;
    if (sn[to + N_ACKED_AT]! > 0) sn[to + N_ACKED_AT]! += off;
    if (sn[to + N_HEARD_AT]! > 0) sn[to + N_HEARD_AT]! += off;
    const g = s * D_STRIDE;
    const h = r * D_STRIDE;
    for (let k = 0; k < D_STRIDE; k++) snap.digests[h + k] = t.digests[g + k]!;
    if (parts & RELATIONS) {
      const rel = this.options.relationsOf(d);
      snap.rel[r] = rel;
      bytes[b + B_META] = (bytes[b + B_META]! & ~OBSERVED) | KNOWN | (rel > 0 ? OBSERVED : 0);
    } else snap.rel[r] = 0;
    bytes[b + B_WRITING] = parts;
    bytes[b + B_UNWRITTEN] = 0;
    bytes[b + B_FLAGS]! &= ~QUEUED;
    return true;
  }

  /** Marks the parts slot `s` was written with unwritten again after a failed write. */
  private requeue(s: number, since: number): void {
    const bytes = this.table.bytes;
    const b = s * B_STRIDE;
    bytes[b + B_UNWRITTEN]! |= bytes[b + B_WRITING]!;
    const flags = bytes[b + B_FLAGS]!;
    const i = s * N_STRIDE + N_SINCE;
    if ((flags & QUEUED) === 0) {
      bytes[b + B_FLAGS] = flags | QUEUED;
      this.table.nums[i] = since;
      this.enqueue(s, since);
    } else {
      const oldest = Math.min(since, this.table.nums[i]!);
      this.table.nums[i] = oldest;
      if ((bytes[b + B_META]! & HELD) !== 0) {
        // Held meanwhile (a confirmable send while its row was in flight goes to `held` at once): back in the
        // queue, so the next round writes what failed and the gauge counts it from its own oldest event (the
        // held list's entry knew only the send; a cold review found the gauge too low).
        this.unhold(s);
        this.enqueue(s, oldest);
      } else if (this.queueOldest === 0 || oldest < this.queueOldest) this.queueOldest = oldest;
    }
  }

  private enqueue(s: number, since: number): void {
    if (this.queued === this.queue.length) {
      // Never more than every slot; the table grew since the queue was made.
      const next = new Int32Array(Math.max(this.table.capacity, this.queue.length * 2));
      next.set(this.queue);
      this.queue = next;
    }
    this.queue[this.queued++] = s;
    if (this.queueOldest === 0 || since < this.queueOldest) this.queueOldest = since;
  }

  /**
   * Forgets devices with nothing unwritten and no event since the previous sweep (one per reap interval), so
   * the table holds the devices that are active, not every device ever seen; their slots are used again.
   */
  private sweep(): void {
    const t = this.table;
    for (const s of t.index.values()) {
      const i = s * B_STRIDE + B_FLAGS;
      const flags = t.bytes[i]!;
      if ((flags & (QUEUED | TOUCHED)) !== 0) t.bytes[i] = flags & ~TOUCHED;
      else t.release(s);
    }
  }

  /**
   * Whether this replica has a relation to the device's settings. Looked up (a map lookup in the observe layer,
   * 1–2 µs at 100,000 devices) once and kept in the slot until the next relation event (`mark` clears it), since
   * the tick's rounds ask it of every held row (design §3.8). A relation count that changes without an event (a
   * device given a DTLS key, whose plain relations stop counting) is seen at the next event; until then its row
   * is at most held for an interval rather than written at once, or written after its round's others.
   */
  private observed(s: number): boolean {
    const t = this.table;
    const m = s * B_STRIDE + B_META;
    const meta = t.bytes[m]!;
    if ((meta & KNOWN) !== 0) return (meta & OBSERVED) !== 0;
    const yes = this.options.relationsOf(t.ids[s]!) > 0;
    t.bytes[m] = (meta & ~OBSERVED) | KNOWN | (yes ? OBSERVED : 0);
    return yes;
  }

  /**
   * A device whose settings just changed and that observes them here is about to be sent them (the fan-out
   * pump) and, moments later, to acknowledge them: its row is held (HOLD) while its desired part is younger
   * than one flush interval, so a fleet-wide change writes one row per device (desired, sent and acknowledged
   * together) instead of two, and then, due, is written after the round's other rows (LATER): where the
   * writers are busy, the fan-out reaches many of them first and they still take one row. An early flush
   * (`early`) also holds a row whose confirmable notification was sent less than an interval ago and is not
   * acknowledged yet (its acknowledgement is on its way), and does not ask for the relations of a young
   * desired part (the tick or the due timer does): it writes what is complete, the tick everything. Each held
   * row is due (`deferredDue`) an interval after the part it waits on.
   */
  private defer(s: number, now: number, early: boolean): number {
    if (this.final) return TAKE;
    const t = this.table;
    const parts = t.bytes[s * B_STRIDE + B_UNWRITTEN]!;
    const n = s * N_STRIDE;
    const flushMs = this.options.flushMs;
    let since: number;
    if (parts === DESIRED) {
      since = t.nums[n + N_DESIRED_AT]!;
      // Due: an observed device's row after the round's other rows (the fan-out may still reach it first; it
      // then waits in `later`, not looked up again), an unobserved device's now (nothing will join it).
      if (now - since >= flushMs) return this.observed(s) ? LATER : TAKE;
      if (!early && !this.observed(s)) return TAKE;
    } else if (early && (parts & (SENT | ACKED)) === SENT) {
      if ((t.bytes[s * B_STRIDE + B_FLAGS]! & SENT_CON) === 0) return TAKE;
      since = t.nums[n + N_SENT_AT]!;
      if (now - since >= flushMs) return TAKE;
    } else return TAKE;
    const due = since + flushMs;
    if (this.deferredDue === 0 || due < this.deferredDue) this.deferredDue = due;
    this.holdDue = due;
    return HOLD;
  }
}

/** One writer's own parts: the slots of its chunk (marked unwritten again if its write fails), their facts as they were when taken (what the builder reads), and its builder. */
interface Lane {
  chunk: Int32Array;
  since: Float64Array;
  snapshot: Snapshot;
  columns: ColumnBuilder;
}
