// The delivery record's rows (design §3.8), built from a snapshot of the recorder's facts: at a flush the event
// loop copies each device's unwritten parts into the snapshot (a few dozen stores a device, nothing allocated)
// and builds the chunk's columns from it byte by byte, into one reused buffer: one PostgreSQL array literal a
// column, the parameters of `delivery_record_arrays` (migration 0011).

// The parts of a device's facts not yet written (the recorder's UNWRITTEN byte; a row carries them).
export const DESIRED = 1;
export const SENT = 2;
export const ACKED = 4;
export const HEARD = 8;
export const RELATIONS = 16;

// Flags (the recorder's FLAGS byte).
/** In the queue of the next flush (or of the one being written); set with a part, cleared when its row is built. */
export const QUEUED = 1;
/** An event came since the previous sweep (the recorder's `sweep`). */
export const TOUCHED = 2;
export const HAVE_DESIRED = 4;
export const HAVE_SENT = 8;
export const HAVE_ACKED = 16;
export const SENT_DTLS = 32;
export const SENT_CON = 64;
export const ACKED_DTLS = 128;

/** Bits 0-1 of the META byte: the desired source, an index in SOURCES. */
export const SOURCE_MASK = 3;
/** The device id needs no escaping in JSON (the registry's pattern). */
export const ID_PLAIN = 4;
export const SOURCES = ['registry', 'override', 'rollout'] as const;

// A device's numbers (stride 8 in the recorder, the first 7 in a snapshot): versions (µs clock readings, exact
// below 2^53) and wall-clock ms.
export const N_DESIRED_V = 0;
export const N_DESIRED_AT = 1;
export const N_SENT_V = 2;
export const N_SENT_AT = 3;
export const N_ACKED_V = 4;
export const N_ACKED_AT = 5;
export const N_HEARD_AT = 6;
/** Numbers a row reads. */
export const N_ROW = 7;
// Its content digests (16 hex digits as two 32-bit halves; stride 6): desired, sent, acknowledged.
export const D_DESIRED = 0;
export const D_SENT = 2;
export const D_ACKED = 4;
export const D_STRIDE = 6;

/** Bytes of device id (as an array element, quotes included) a snapshot holds per row on average before a chunk ends. */
const ID_BYTES_PER_ROW = 140;

/**
 * One chunk's facts, copied out of the recorder at the flush (and their parts marked written there): what the
 * builder reads. Row r: parts, flags and meta at bytes[4r..4r+2], numbers at nums[7r..], digests at
 * digests[6r..], the relation count at rel[r], the device id's array element at idBytes[idStart[r]..idStart[r+1]).
 */
export class Snapshot {
  readonly nums: Float64Array;
  readonly digests: Uint32Array;
  readonly rel: Int32Array;
  readonly idStart: Int32Array;
  readonly bytes: Uint8Array;
  readonly idBytes: Uint8Array;

  constructor(readonly rows: number) {
    this.nums = new Float64Array(rows * N_ROW);
    this.digests = new Uint32Array(rows * D_STRIDE);
    this.rel = new Int32Array(rows);
    this.idStart = new Int32Array(rows + 1);
    this.bytes = new Uint8Array(rows * 4);
    this.idBytes = new Uint8Array(Math.max(rows * ID_BYTES_PER_ROW, 8192));
  }

  /**
   * Writes row r's device id (an array element) after row r-1's; false (nothing written) when the id area is
   * full, so the chunk ends before this row. An id outside the registry's pattern (`plain` false) is written as
   * NULL: the function writes devices of the registry only, whose ids all match it, so such a row is skipped
   * there anyway, and no escaping is needed.
   */
  putId(r: number, d: string, plain: boolean): boolean {
    const start = r === 0 ? 0 : this.idStart[r]!;
    if (r === 0) this.idStart[0] = 0;
    const out = this.idBytes;
    let p = start;
    if (!plain) {
      if (start + 4 > out.length) return false;
      out[p++] = 0x4e; // NULL
      out[p++] = 0x55;
      out[p++] = 0x4c;
      out[p++] = 0x4c;
    } else {
      if (start + d.length + 2 > out.length) return false;
      out[p++] = 0x22;
      for (let i = 0; i < d.length; i++) out[p++] = d.charCodeAt(i);
      out[p++] = 0x22;
    }
    this.idStart[r + 1] = p;
    return true;
  }
}

/**
 * A chunk as `delivery_record_arrays` takes it (migration 0011): `rows` rows, and one PostgreSQL array literal a
 * column, in the function's order (COLUMNS); null for a column no row carries.
 */
export interface DeliveryBatch {
  rows: number;
  columns: (string | null)[];
}

/** The function's columns, in its parameters' order (after the replica). */
export const COLUMNS = [
  'd',
  'dv',
  'ds',
  'dc',
  'da',
  'sv',
  'sc',
  'sa',
  'st',
  'sk',
  'av',
  'ac',
  'aa',
  'at',
  'h',
  'r',
] as const;
// Their indexes.
const C_D = 0;
const C_DV = 1;
const C_DS = 2;
const C_DC = 3;
const C_DA = 4;
const C_SV = 5;
const C_SC = 6;
const C_SA = 7;
const C_ST = 8;
const C_SK = 9;
const C_AV = 10;
const C_AC = 11;
const C_AA = 12;
const C_AT = 13;
const C_H = 14;
const C_R = 15;

const ascii = (text: string): Uint8Array => Uint8Array.from(Buffer.from(text, 'latin1'));
const HEX = ascii('0123456789abcdef');
const T_PLAIN = ascii('plain');
const T_DTLS = ascii('dtls');
const T_SOURCES = SOURCES.map(ascii);
// Which columns a row carries a value for (ColumnBuilder's `has`).
const H_DESIRED = 1;
const H_SENT = 2;
const H_ACKED = 4;
const H_HEARD = 8;
const H_REL = 16;
/** The most one element other than a device id takes (a number's digits, a digest, a word), and its comma. */
const ELEMENT_MAX = 32;

/**
 * A chunk's columns built in one reused buffer, written byte by byte: one string a column per chunk (16), none
 * per row or per number. Not shared between chunks written at the same time (one builder a writer).
 */
export class ColumnBuilder {
  private buf = Buffer.allocUnsafe(1 << 18);
  private pos = 0;
  /** Reused for every chunk: the writer reads it before its call returns. */
  private readonly batch: DeliveryBatch = { rows: 0, columns: COLUMNS.map(() => null) };

  /** Per row of the chunk being built, which columns it carries a value for (the H_ bits), set once a chunk. */
  private has = new Uint8Array(0);
  /** The high half (above 10^8) of the last number written with one, and its digits. */
  private hiValue = -1;
  private readonly hiBytes = new Uint8Array(8);
  private hiLength = 0;

  /**
   * The snapshot's first `n` rows as columns. Every value is a number, a boolean, a fixed word, a hex digest or
   * a device id of the registry's pattern (quoted), so no element needs escaping. Which parts each row carries
   * is read once (`has`), then each column is written by a loop of its own: no per-value dispatch.
   */
  build(snap: Snapshot, n: number): DeliveryBatch {
    const columns = this.batch.columns;
    this.batch.rows = n;
    if (this.has.length < n) this.has = new Uint8Array(Math.max(n, snap.rows));
    const has = this.has;
    const bytes = snap.bytes;
    const nums = snap.nums;
    let any = 0;
    for (let r = 0; r < n; r++) {
      const parts = bytes[r * 4]!;
      const flags = bytes[r * 4 + 1]!;
      const h =
        ((parts & DESIRED) !== 0 && (flags & HAVE_DESIRED) !== 0 ? H_DESIRED : 0) |
        ((parts & SENT) !== 0 && (flags & HAVE_SENT) !== 0 ? H_SENT : 0) |
        ((parts & ACKED) !== 0 && (flags & HAVE_ACKED) !== 0 ? H_ACKED : 0) |
        ((parts & HEARD) !== 0 && nums[r * N_ROW + N_HEARD_AT]! > 0 ? H_HEARD : 0) |
        ((parts & RELATIONS) !== 0 ? H_REL : 0);
      has[r] = h;
      any |= h;
    }
    columns[C_D] = n > 0 ? this.ids(snap, n) : null;
    const desired = (any & H_DESIRED) !== 0;
    columns[C_DV] = desired ? this.nums(snap, n, H_DESIRED, N_DESIRED_V) : null;
    columns[C_DS] = desired ? this.sources(snap, n) : null;
    columns[C_DC] = desired ? this.digests(snap, n, H_DESIRED, D_DESIRED) : null;
    columns[C_DA] = desired ? this.nums(snap, n, H_DESIRED, N_DESIRED_AT) : null;
    const sent = (any & H_SENT) !== 0;
    columns[C_SV] = sent ? this.nums(snap, n, H_SENT, N_SENT_V) : null;
    columns[C_SC] = sent ? this.digests(snap, n, H_SENT, D_SENT) : null;
    columns[C_SA] = sent ? this.nums(snap, n, H_SENT, N_SENT_AT) : null;
    columns[C_ST] = sent ? this.transports(snap, n, H_SENT, SENT_DTLS) : null;
    columns[C_SK] = sent ? this.confirmable(snap, n) : null;
    const acked = (any & H_ACKED) !== 0;
    columns[C_AV] = acked ? this.nums(snap, n, H_ACKED, N_ACKED_V) : null;
    columns[C_AC] = acked ? this.digests(snap, n, H_ACKED, D_ACKED) : null;
    columns[C_AA] = acked ? this.nums(snap, n, H_ACKED, N_ACKED_AT) : null;
    columns[C_AT] = acked ? this.transports(snap, n, H_ACKED, ACKED_DTLS) : null;
    columns[C_H] = (any & H_HEARD) !== 0 ? this.nums(snap, n, H_HEARD, N_HEARD_AT) : null;
    columns[C_R] = (any & H_REL) !== 0 ? this.relations(snap, n) : null;
    return this.batch;
  }

  /** Starts a column of `n` elements of at most `each` bytes: its `{`. */
  private open(n: number, each: number): void {
    this.pos = 0;
    this.ensure(n * each + 2);
    this.buf[this.pos++] = 0x7b; // {
  }

  /** Ends the column: its `}`, and the column as a string. */
  private close(): string {
    this.buf[this.pos++] = 0x7d; // }
    return this.buf.toString('latin1', 0, this.pos);
  }

  /** NULL, for a row that carries no value in this column. */
  private nul(): void {
    const buf = this.buf;
    const p = this.pos;
    buf[p] = 0x4e;
    buf[p + 1] = 0x55;
    buf[p + 2] = 0x4c;
    buf[p + 3] = 0x4c;
    this.pos = p + 4;
  }

  /** The device ids (a NULL id, outside the registry's pattern, as it is: the function skips the row). */
  private ids(snap: Snapshot, n: number): string {
    this.pos = 0;
    this.ensure(snap.idStart[n]! + n + 2);
    const buf = this.buf;
    buf[this.pos++] = 0x7b;
    for (let r = 0; r < n; r++) {
      if (r > 0) buf[this.pos++] = 0x2c; // ,
      this.copy(snap.idBytes, snap.idStart[r]!, snap.idStart[r + 1]!);
    }
    return this.close();
  }

  /**
   * Number `k` of each row that has `bit`. A value equal to the one before it in the column (a time in ms: a
   * fan-out sends and hears dozens of devices a millisecond) is copied from that one's bytes.
   */
  private nums(snap: Snapshot, n: number, bit: number, k: number): string {
    this.open(n, ELEMENT_MAX);
    const has = this.has;
    const nums = snap.nums;
    const buf = this.buf;
    let prev = NaN;
    let from = 0;
    let to = 0;
    for (let r = 0; r < n; r++) {
      if (r > 0) buf[this.pos++] = 0x2c;
      if ((has[r]! & bit) === 0) {
        this.nul();
        continue;
      }
      const v = nums[r * N_ROW + k]!;
      if (v === prev) {
        let p = this.pos;
        for (let i = from; i < to; i++) buf[p++] = buf[i]!;
        this.pos = p;
        continue;
      }
      from = this.pos;
      this.num(v);
      to = this.pos;
      prev = v;
    }
    return this.close();
  }

  /** Digest `d` of each row that has `bit`. */
  private digests(snap: Snapshot, n: number, bit: number, d: number): string {
    this.open(n, ELEMENT_MAX);
    const has = this.has;
    const digests = snap.digests;
    for (let r = 0; r < n; r++) {
      if (r > 0) this.buf[this.pos++] = 0x2c;
      if ((has[r]! & bit) !== 0) this.digest(digests, r * D_STRIDE + d);
      else this.nul();
    }
    return this.close();
  }

  /** The desired source of each row that has a desired part. */
  private sources(snap: Snapshot, n: number): string {
    this.open(n, ELEMENT_MAX);
    const has = this.has;
    for (let r = 0; r < n; r++) {
      if (r > 0) this.buf[this.pos++] = 0x2c;
      if ((has[r]! & H_DESIRED) !== 0)
        this.bytes(T_SOURCES[snap.bytes[r * 4 + 2]! & SOURCE_MASK] ?? T_SOURCES[0]!);
      else this.nul();
    }
    return this.close();
  }

  /** dtls or plain (the flag `dtls`) of each row that has `bit`. */
  private transports(snap: Snapshot, n: number, bit: number, dtls: number): string {
    this.open(n, ELEMENT_MAX);
    const has = this.has;
    for (let r = 0; r < n; r++) {
      if (r > 0) this.buf[this.pos++] = 0x2c;
      if ((has[r]! & bit) !== 0) this.bytes(snap.bytes[r * 4 + 1]! & dtls ? T_DTLS : T_PLAIN);
      else this.nul();
    }
    return this.close();
  }

  /** t or f: whether each row's sent notification was confirmable. */
  private confirmable(snap: Snapshot, n: number): string {
    this.open(n, ELEMENT_MAX);
    const has = this.has;
    for (let r = 0; r < n; r++) {
      if (r > 0) this.buf[this.pos++] = 0x2c;
      if ((has[r]! & H_SENT) !== 0) this.buf[this.pos++] = snap.bytes[r * 4 + 1]! & SENT_CON ? 0x74 : 0x66;
      else this.nul();
    }
    return this.close();
  }

  /** The relation count of each row that carries its relations. */
  private relations(snap: Snapshot, n: number): string {
    this.open(n, ELEMENT_MAX);
    const has = this.has;
    for (let r = 0; r < n; r++) {
      if (r > 0) this.buf[this.pos++] = 0x2c;
      if ((has[r]! & H_REL) !== 0) this.num(snap.rel[r]!);
      else this.nul();
    }
    return this.close();
  }

  /** Room for `bytes` more. */
  private ensure(bytes: number): void {
    const need = this.pos + bytes;
    if (need <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(need, this.buf.length * 2));
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }

  /** A short constant (a loop: Buffer#copy is a native call, too slow for a few bytes). */
  private bytes(b: Uint8Array): void {
    this.copy(b, 0, b.length);
  }

  private copy(b: Uint8Array, from: number, to: number): void {
    const buf = this.buf;
    let p = this.pos;
    for (let i = from; i < to; i++) buf[p++] = b[i]!;
    this.pos = p;
  }

  /** A number: digits of a non-negative safe integer written directly, anything else as JavaScript writes it. */
  private num(n: number): void {
    if (!(Number.isSafeInteger(n) && n >= 0)) {
      this.pos += this.buf.write(String(n), this.pos, 'latin1');
      return;
    }
    // Two halves of at most 8 digits each (a safe integer is below 10^16), each in 32-bit integer arithmetic;
    // the high half's digits are kept for the next number (versions and times of a chunk share them).
    if (n >= 1e8) {
      const hi = Math.floor(n / 1e8);
      const buf = this.buf;
      if (hi === this.hiValue) {
        const hiBytes = this.hiBytes;
        let p = this.pos;
        for (let i = 0; i < this.hiLength; i++) buf[p++] = hiBytes[i]!;
        this.pos = p;
      } else {
        const start = this.pos;
        this.digits(hi, 0);
        this.hiLength = this.pos - start;
        for (let i = 0; i < this.hiLength; i++) this.hiBytes[i] = buf[start + i]!;
        this.hiValue = hi;
      }
      this.digits(n - hi * 1e8, 8);
    } else this.digits(n, 0);
  }

  /** `v` (< 10^8) in decimal, zero-padded to `width` digits (0: as many as it has). */
  private digits(v: number, width: number): void {
    let count = 1;
    for (let bound = 10; v >= bound && count < 8; bound *= 10) count++;
    if (count < width) count = width;
    const buf = this.buf;
    const end = this.pos + count;
    let p = end;
    let x = v | 0;
    while (p > this.pos) {
      const q = (x / 10) | 0;
      buf[--p] = 48 + x - q * 10;
      x = q;
    }
    this.pos = end;
  }

  /** A content digest: 16 hex digits from its two 32-bit halves at digests[i], digests[i + 1]. */
  private digest(digests: Uint32Array, i: number): void {
    this.hex(digests[i]!);
    this.hex(digests[i + 1]!);
  }

  private hex(v: number): void {
    for (let shift = 28; shift >= 0; shift -= 4) this.buf[this.pos++] = HEX[(v >>> shift) & 15]!;
  }
}
