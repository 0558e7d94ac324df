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
const T_NULL = ascii('NULL');
const T_PLAIN = ascii('plain');
const T_DTLS = ascii('dtls');
const T_SOURCES = SOURCES.map(ascii);
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

  /**
   * The snapshot's first `n` rows as columns. Every value is a number, a boolean, a fixed word, a hex digest or
   * a device id of the registry's pattern (quoted), so no element needs escaping.
   */
  build(snap: Snapshot, n: number): DeliveryBatch {
    const columns = this.batch.columns;
    this.batch.rows = n;
    for (let c = 0; c < COLUMNS.length; c++) columns[c] = this.column(snap, n, c);
    return this.batch;
  }

  private column(snap: Snapshot, n: number, c: number): string | null {
    this.pos = 0;
    this.ensure(c === C_D ? snap.idStart[n]! + n + 2 : n * ELEMENT_MAX + 2);
    const buf = this.buf;
    buf[this.pos++] = 0x7b; // {
    let any = false;
    for (let r = 0; r < n; r++) {
      if (r > 0) buf[this.pos++] = 0x2c; // ,
      if (this.value(snap, r, c)) any = true;
      else this.bytes(T_NULL);
    }
    buf[this.pos++] = 0x7d; // }
    return any ? buf.toString('latin1', 0, this.pos) : null;
  }

  /** Writes row r's value of column c; false (nothing written) when the row carries none. */
  private value(snap: Snapshot, r: number, c: number): boolean {
    const parts = snap.bytes[r * 4]!;
    const flags = snap.bytes[r * 4 + 1]!;
    const n = r * N_ROW;
    const g = r * D_STRIDE;
    const nums = snap.nums;
    const digests = snap.digests;
    const desired = (parts & DESIRED) !== 0 && (flags & HAVE_DESIRED) !== 0;
    const sent = (parts & SENT) !== 0 && (flags & HAVE_SENT) !== 0;
    const acked = (parts & ACKED) !== 0 && (flags & HAVE_ACKED) !== 0;
    switch (c) {
      case C_D: {
        const from = snap.idStart[r]!;
        const to = snap.idStart[r + 1]!;
        // A NULL id (outside the registry's pattern) is written as it is: the function skips the row.
        this.copy(snap.idBytes, from, to);
        return true;
      }
      case C_DV:
        if (desired) this.num(nums[n + N_DESIRED_V]!);
        return desired;
      case C_DS:
        if (desired) this.bytes(T_SOURCES[snap.bytes[r * 4 + 2]! & SOURCE_MASK] ?? T_SOURCES[0]!);
        return desired;
      case C_DC:
        if (desired) this.digest(digests, g + D_DESIRED);
        return desired;
      case C_DA:
        if (desired) this.num(nums[n + N_DESIRED_AT]!);
        return desired;
      case C_SV:
        if (sent) this.num(nums[n + N_SENT_V]!);
        return sent;
      case C_SC:
        if (sent) this.digest(digests, g + D_SENT);
        return sent;
      case C_SA:
        if (sent) this.num(nums[n + N_SENT_AT]!);
        return sent;
      case C_ST:
        if (sent) this.bytes(flags & SENT_DTLS ? T_DTLS : T_PLAIN);
        return sent;
      case C_SK:
        if (sent) this.buf[this.pos++] = flags & SENT_CON ? 0x74 : 0x66; // t, f
        return sent;
      case C_AV:
        if (acked) this.num(nums[n + N_ACKED_V]!);
        return acked;
      case C_AC:
        if (acked) this.digest(digests, g + D_ACKED);
        return acked;
      case C_AA:
        if (acked) this.num(nums[n + N_ACKED_AT]!);
        return acked;
      case C_AT:
        if (acked) this.bytes(flags & ACKED_DTLS ? T_DTLS : T_PLAIN);
        return acked;
      case C_H: {
        const heard = (parts & HEARD) !== 0 && nums[n + N_HEARD_AT]! > 0;
        if (heard) this.num(nums[n + N_HEARD_AT]!);
        return heard;
      }
      case C_R:
        if ((parts & RELATIONS) === 0) return false;
        this.num(snap.rel[r]!);
        return true;
      default:
        return false;
    }
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
    // Two halves of at most 8 digits each (a safe integer is below 10^16), each in 32-bit integer arithmetic.
    if (n >= 1e8) {
      const hi = Math.floor(n / 1e8);
      this.digits(hi, 0);
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
