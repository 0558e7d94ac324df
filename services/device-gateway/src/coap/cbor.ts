// A strict decoder for the subset of CBOR (RFC 8949) a device's report uses: one data item of definite length
// made of maps with text keys, arrays, text strings, integers, floating-point numbers, true, false and null,
// which is exactly what JSON can say. Anything else is refused, not approximated: byte strings, tags, undefined
// and other simple values, indefinite lengths, duplicate map keys, integers outside ±(2^53 − 1), non-shortest
// length arguments are allowed (RFC 8949 §4.2 makes shortest form a rule of deterministic encoding, not of
// validity), text that is not valid UTF-8, nesting deeper than `MAX_DEPTH`, and bytes after the item.
// cbor-x (a dependency, used to encode documents) decodes far more than this (tags to Dates and typed arrays,
// Maps, undefined, indefinite lengths), so a device's body is not given to it.

/** Nesting of maps and arrays a report needs (settings.thresholds.<name>.min is 3 deep). */
export const MAX_DEPTH = 8;

/** What the decoder returns: JSON's values. */
export type CborValue = null | boolean | number | string | CborValue[] | { [key: string]: CborValue };

export class CborError extends Error {}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Decodes exactly one data item filling all of `bytes` (RFC 8949 §5.1: a well-formed, complete item). */
export function decodeCbor(bytes: Uint8Array): CborValue {
  const r = new Reader(bytes);
  const value = r.item(0);
  if (r.at !== bytes.length) throw new CborError('bytes after the data item');
  return value;
}

class Reader {
  at = 0;
  constructor(private readonly b: Uint8Array) {}

  private byte(): number {
    if (this.at >= this.b.length) throw new CborError('truncated');
    return this.b[this.at++]!;
  }

  /**
   * The argument of an initial byte's additional information (RFC 8949 §3: 0–23 in the byte itself, 24–27
   * followed by 1, 2, 4 or 8 bytes; 28–30 reserved; 31 indefinite length, §3.2, refused here).
   */
  private argument(info: number): number {
    if (info < 24) return info;
    const len = info === 24 ? 1 : info === 25 ? 2 : info === 26 ? 4 : info === 27 ? 8 : 0;
    if (len === 0) throw new CborError(info === 31 ? 'indefinite length' : 'reserved additional information');
    if (this.at + len > this.b.length) throw new CborError('truncated');
    let v = 0;
    for (let i = 0; i < len; i++) v = v * 256 + this.b[this.at++]!;
    // A 64-bit argument above 2^53 − 1 cannot be held exactly in a number: refused, never rounded.
    if (v > Number.MAX_SAFE_INTEGER) throw new CborError('integer out of range');
    return v;
  }

  item(depth: number): CborValue {
    const ib = this.byte();
    const major = ib >> 5;
    const info = ib & 0x1f;
    switch (major) {
      case 0: // §3.1 major type 0: an unsigned integer
        return this.argument(info);
      case 1: {
        // §3.1 major type 1: a negative integer, −1 − argument
        const n = this.argument(info);
        if (n === Number.MAX_SAFE_INTEGER) throw new CborError('integer out of range');
        return -1 - n;
      }
      case 2: // §3.1 major type 2: a byte string, which JSON cannot hold
        throw new CborError('byte string');
      case 3: {
        // §3.1 major type 3: a text string, UTF-8 (§5.3.1: invalid UTF-8 is not valid CBOR)
        const len = this.argument(info);
        if (this.at + len > this.b.length) throw new CborError('truncated');
        const start = this.at;
        this.at += len;
        try {
          return utf8.decode(this.b.subarray(start, this.at));
        } catch {
          throw new CborError('invalid UTF-8');
        }
      }
      case 4: {
        // §3.1 major type 4: an array of `argument` items
        if (depth >= MAX_DEPTH) throw new CborError('nested too deep');
        const len = this.argument(info);
        // Each item takes at least one byte: a length the rest cannot hold is refused before allocating.
        if (len > this.b.length - this.at) throw new CborError('truncated');
        const out: CborValue[] = [];
        for (let i = 0; i < len; i++) out.push(this.item(depth + 1));
        return out;
      }
      case 5: {
        // §3.1 major type 5: a map of `argument` pairs. Keys must be text (JSON's); a duplicate key makes the
        // map invalid for this decoder (§5.6: such a map is not valid CBOR for most applications).
        if (depth >= MAX_DEPTH) throw new CborError('nested too deep');
        const len = this.argument(info);
        if (len * 2 > this.b.length - this.at) throw new CborError('truncated');
        // No prototype: a key named __proto__ or constructor is an ordinary key.
        const out = Object.create(null) as { [key: string]: CborValue };
        for (let i = 0; i < len; i++) {
          if (this.at < this.b.length && this.b[this.at]! >> 5 !== 3) throw new CborError('map key not text');
          const key = this.item(depth + 1) as string;
          if (Object.hasOwn(out, key)) throw new CborError('duplicate map key');
          out[key] = this.item(depth + 1);
        }
        return out;
      }
      case 6: // §3.4 tags: none is part of this subset
        throw new CborError('tag');
      default:
        return this.simpleOrFloat(info);
    }
  }

  /** §3.3 major type 7: false (20), true (21), null (22), and half (25), single (26), double (27) floats. */
  private simpleOrFloat(info: number): CborValue {
    switch (info) {
      case 20:
        return false;
      case 21:
        return true;
      case 22:
        return null;
      case 25: {
        if (this.at + 2 > this.b.length) throw new CborError('truncated');
        const v = halfToNumber((this.b[this.at]! << 8) | this.b[this.at + 1]!);
        this.at += 2;
        return finite(v);
      }
      case 26: {
        if (this.at + 4 > this.b.length) throw new CborError('truncated');
        const v = new DataView(this.b.buffer, this.b.byteOffset + this.at, 4).getFloat32(0);
        this.at += 4;
        return finite(v);
      }
      case 27: {
        if (this.at + 8 > this.b.length) throw new CborError('truncated');
        const v = new DataView(this.b.buffer, this.b.byteOffset + this.at, 8).getFloat64(0);
        this.at += 8;
        return finite(v);
      }
      case 31:
        // §3.2.1: the "break" stop code, only meaningful inside an indefinite-length item.
        throw new CborError('unexpected break');
      default:
        // undefined (23), other simple values (0–19, 24 + byte), reserved (28–30).
        throw new CborError('simple value not in JSON');
    }
  }
}

/** JSON has no Infinity or NaN (RFC 8949 §6.1 maps them to null; a report must not carry them at all). */
function finite(v: number): number {
  if (!Number.isFinite(v)) throw new CborError('not a finite number');
  return v;
}

/** IEEE 754 binary16 to a number (RFC 8949 Appendix D gives this decoder in C). */
function halfToNumber(half: number): number {
  const exp = (half >> 10) & 0x1f;
  const mant = half & 0x3ff;
  let val: number;
  if (exp === 0) val = mant * 2 ** -24;
  else if (exp !== 31) val = (mant + 1024) * 2 ** (exp - 25);
  else val = mant === 0 ? Infinity : NaN;
  return half & 0x8000 ? -val : val;
}
