// The delivery record's rows (design §3.8), built from a snapshot of the recorder's facts: at a flush the event
// loop copies each device's unwritten parts into the snapshot (a few dozen stores a device, nothing allocated)
// and builds the chunk's JSON text from it byte by byte, into one reused buffer.

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

/** Bytes of device id (as JSON text, quotes included) a snapshot holds per row on average before a chunk ends. */
const ID_BYTES_PER_ROW = 140;

/**
 * One chunk's facts, copied out of the recorder at the flush (and their parts marked written there): what the
 * builder reads. Row r: parts, flags and meta at bytes[4r..4r+2], numbers at nums[7r..], digests at
 * digests[6r..], the relation count at rel[r], the device id's JSON text at idBytes[idStart[r]..idStart[r+1]).
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
   * Writes row r's device id (JSON text) after row r-1's; false (nothing written) when the id area is full, so
   * the chunk ends before this row.
   */
  putId(r: number, d: string, plain: boolean): boolean {
    const start = r === 0 ? 0 : this.idStart[r]!;
    if (r === 0) this.idStart[0] = 0;
    const out = this.idBytes;
    if (plain) {
      if (start + d.length + 2 > out.length) return false;
      let p = start;
      out[p++] = 0x22;
      for (let i = 0; i < d.length; i++) out[p++] = d.charCodeAt(i);
      out[p++] = 0x22;
      this.idStart[r + 1] = p;
      return true;
    }
    const json = Buffer.from(JSON.stringify(d), 'utf8');
    if (start + json.length > out.length) return false;
    out.set(json, start);
    this.idStart[r + 1] = start + json.length;
    return true;
  }
}

const ascii = (text: string): Uint8Array => Uint8Array.from(Buffer.from(text, 'latin1'));
const HEX = ascii('0123456789abcdef');
const T_OPEN = ascii('{"d":');
const T_DV = ascii(',"dv":');
const T_DS = ascii(',"ds":"');
const T_DC = ascii('","dc":"');
const T_DA = ascii('","da":');
const T_SV = ascii(',"sv":');
const T_SC = ascii(',"sc":"');
const T_SA = ascii('","sa":');
const T_ST = ascii(',"st":"');
const T_SK_TRUE = ascii('","sk":true');
const T_SK_FALSE = ascii('","sk":false');
const T_AV = ascii(',"av":');
const T_AC = ascii(',"ac":"');
const T_AA = ascii('","aa":');
const T_AT = ascii(',"at":"');
const T_H = ascii(',"h":');
const T_R = ascii(',"r":');
const T_PLAIN = ascii('plain');
const T_DTLS = ascii('dtls');
const T_SOURCES = SOURCES.map(ascii);
/** The most one row takes besides its device id. */
const ROW_MAX = 400;

/**
 * A chunk's JSON text built in one reused buffer, written byte by byte: one string per chunk, none per row or
 * per number.
 */
export class RowBuffer {
  private buf = Buffer.allocUnsafe(1 << 20);
  private pos = 0;

  /**
   * The JSON array (DeliveryRow[]) of the snapshot's first `n` rows. Every value is a number, a boolean, a fixed
   * word, a hex digest or a device id's JSON text.
   */
  build(snap: Snapshot, n: number): string {
    this.pos = 0;
    this.ensure(2);
    this.buf[this.pos++] = 0x5b; // [
    for (let r = 0; r < n; r++) {
      const idLength = snap.idStart[r + 1]! - snap.idStart[r]!;
      this.ensure(idLength);
      if (r > 0) this.buf[this.pos++] = 0x2c; // ,
      this.row(snap, r);
    }
    this.ensure(1);
    this.buf[this.pos++] = 0x5d; // ]
    return this.buf.toString('utf8', 0, this.pos);
  }

  private row(snap: Snapshot, r: number): void {
    const parts = snap.bytes[r * 4]!;
    const flags = snap.bytes[r * 4 + 1]!;
    const meta = snap.bytes[r * 4 + 2]!;
    const n = r * N_ROW;
    const g = r * D_STRIDE;
    const nums = snap.nums;
    const digests = snap.digests;
    this.bytes(T_OPEN);
    this.copy(snap.idBytes, snap.idStart[r]!, snap.idStart[r + 1]!);
    if (parts & DESIRED && flags & HAVE_DESIRED) {
      this.bytes(T_DV);
      this.num(nums[n + N_DESIRED_V]!);
      this.bytes(T_DS);
      this.bytes(T_SOURCES[meta & SOURCE_MASK] ?? T_SOURCES[0]!);
      this.bytes(T_DC);
      this.hex(digests[g + D_DESIRED]!);
      this.hex(digests[g + D_DESIRED + 1]!);
      this.bytes(T_DA);
      this.num(nums[n + N_DESIRED_AT]!);
    }
    if (parts & SENT && flags & HAVE_SENT) {
      this.bytes(T_SV);
      this.num(nums[n + N_SENT_V]!);
      this.bytes(T_SC);
      this.hex(digests[g + D_SENT]!);
      this.hex(digests[g + D_SENT + 1]!);
      this.bytes(T_SA);
      this.num(nums[n + N_SENT_AT]!);
      this.bytes(T_ST);
      this.bytes(flags & SENT_DTLS ? T_DTLS : T_PLAIN);
      this.bytes(flags & SENT_CON ? T_SK_TRUE : T_SK_FALSE);
    }
    if (parts & ACKED && flags & HAVE_ACKED) {
      this.bytes(T_AV);
      this.num(nums[n + N_ACKED_V]!);
      this.bytes(T_AC);
      this.hex(digests[g + D_ACKED]!);
      this.hex(digests[g + D_ACKED + 1]!);
      this.bytes(T_AA);
      this.num(nums[n + N_ACKED_AT]!);
      this.bytes(T_AT);
      this.bytes(flags & ACKED_DTLS ? T_DTLS : T_PLAIN);
      this.buf[this.pos++] = 0x22;
    }
    if (parts & HEARD && nums[n + N_HEARD_AT]! > 0) {
      this.bytes(T_H);
      this.num(nums[n + N_HEARD_AT]!);
    }
    if (parts & RELATIONS) {
      this.bytes(T_R);
      this.num(snap.rel[r]!);
    }
    this.buf[this.pos++] = 0x7d; // }
  }

  /** Room for one more row with a device id `idLength` bytes long. */
  private ensure(idLength: number): void {
    const need = this.pos + ROW_MAX + idLength + 2;
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

  private hex(v: number): void {
    for (let shift = 28; shift >= 0; shift -= 4) this.buf[this.pos++] = HEX[(v >>> shift) & 15]!;
  }
}
