// CoAP message codec (RFC 7252 section 3, RFC 8974 extended token lengths).
//
// Why the gateway does not use coap-packet / node-coap here: coap-packet's parser is lenient where RFC 7252
// says "message format error" (options running past the datagram end are silently truncated, a payload
// marker followed by nothing is accepted, token lengths 9-12 are accepted), and node-coap's server answers
// such datagrams with a NON 5.00 carrying the exception text. The gateway must answer format errors with RST
// (CON) or silence (NON) and must never allocate per option on the hot path, so the parser below is strict,
// bounds-checked, allocation-light and never throws. Tests cross-check it against coap-packet.

/** Message types (RFC 7252 section 3). */
export const CON = 0;
export const NON = 1;
export const ACK = 2;
export const RST = 3;
export type MessageType = typeof CON | typeof NON | typeof ACK | typeof RST;

/** Codes as the wire byte: class << 5 | detail. */
export const code = (cls: number, detail: number): number => (cls << 5) | detail;
export const EMPTY = 0;
export const GET = 1;
export const POST = 2;
export const PUT = 3;
export const CONTENT = code(2, 5);
export const VALID = code(2, 3);
export const CHANGED = code(2, 4);
export const BAD_REQUEST = code(4, 0);
export const UNAUTHORIZED = code(4, 1);
export const BAD_OPTION = code(4, 2);
export const NOT_FOUND = code(4, 4);
export const METHOD_NOT_ALLOWED = code(4, 5);
export const NOT_ACCEPTABLE = code(4, 6);
/** 4.09 Conflict (registered by RFC 8132): the request conflicts with the state of the resource. */
export const CONFLICT = code(4, 9);
export const REQUEST_ENTITY_TOO_LARGE = code(4, 13);
export const UNSUPPORTED_CONTENT_FORMAT = code(4, 15);
export const INTERNAL_SERVER_ERROR = code(5, 0);
export const NOT_IMPLEMENTED = code(5, 1);
export const SERVICE_UNAVAILABLE = code(5, 3);
export const PROXYING_NOT_SUPPORTED = code(5, 5);

/** Option numbers (RFC 7252 section 5.10, RFC 7641, RFC 7959). Odd numbers are critical. */
export const Opt = {
  IfMatch: 1,
  UriHost: 3,
  ETag: 4,
  IfNoneMatch: 5,
  Observe: 6,
  UriPort: 7,
  UriPath: 11,
  ContentFormat: 12,
  MaxAge: 14,
  UriQuery: 15,
  Accept: 17,
  Block2: 23,
  Block1: 27,
  Size2: 28,
  ProxyUri: 35,
  ProxyScheme: 39,
  Size1: 60,
  NoResponse: 258,
} as const;

/** Content-Format numbers (RFC 7252 section 12.3, RFC 8949). */
export const ContentFormat = { text: 0, linkFormat: 40, json: 50, cbor: 60 } as const;

export interface CoapOption {
  number: number;
  value: Buffer;
}

export interface CoapMessage {
  type: MessageType;
  code: number;
  messageId: number;
  token: Buffer;
  /** In wire order (ascending option number). */
  options: CoapOption[];
  payload: Buffer;
}

/** Why a datagram was rejected; `messageId` is set when the header was readable (an RST is possible). */
export interface ParseFailure {
  reason:
    'short' | 'version' | 'token_length' | 'token_too_long' | 'empty_not_empty' | 'option' | 'payload_marker';
  type?: MessageType;
  messageId?: number;
}

export type ParseResult = { ok: true; message: CoapMessage } | { ok: false; failure: ParseFailure };

/**
 * Parses one datagram. Never throws. `maxTokenLength` bounds RFC 8974 extended tokens the gateway accepts
 * (longer tokens are a format error for this server: it cannot keep or echo them cheaply).
 * The returned buffers are views into `buf`; copy what must outlive the datagram.
 */
export function parseMessage(buf: Buffer, maxTokenLength: number): ParseResult {
  const len = buf.length;
  if (len < 4) return { ok: false, failure: { reason: 'short' } };
  const b0 = buf[0]!;
  // RFC 7252 section 3: unknown versions are silently ignored.
  if (b0 >> 6 !== 1) return { ok: false, failure: { reason: 'version' } };
  const type = ((b0 >> 4) & 3) as MessageType;
  const messageId = (buf[2]! << 8) | buf[3]!;
  const fail = (reason: ParseFailure['reason']): ParseResult => ({
    ok: false,
    failure: { reason, type, messageId },
  });
  const msgCode = buf[1]!;
  let tkl = b0 & 15;
  let pos = 4;
  if (msgCode === EMPTY) {
    // Section 4.1: an Empty message has TKL 0 and nothing after the Message ID.
    if (tkl !== 0 || len !== 4) return fail('empty_not_empty');
    return {
      ok: true,
      message: { type, code: EMPTY, messageId, token: EMPTY_BUF, options: [], payload: EMPTY_BUF },
    };
  }
  if (tkl > 8) {
    // RFC 8974: 13 and 14 announce 1 or 2 extra length bytes; 9-12 and 15 remain format errors.
    if (tkl === 13) {
      if (pos + 1 > len) return fail('token_length');
      tkl = buf[pos]! + 13;
      pos += 1;
    } else if (tkl === 14) {
      if (pos + 2 > len) return fail('token_length');
      tkl = ((buf[pos]! << 8) | buf[pos + 1]!) + 269;
      pos += 2;
    } else {
      return fail('token_length');
    }
  }
  if (pos + tkl > len) return fail('token_length');
  if (tkl > maxTokenLength) return fail('token_too_long');
  const token = buf.subarray(pos, pos + tkl);
  pos += tkl;
  const options: CoapOption[] = [];
  let number = 0;
  while (pos < len) {
    const byte = buf[pos]!;
    if (byte === 0xff) {
      // Section 3: a marker followed by a zero-length payload is a format error.
      if (pos + 1 >= len) return fail('payload_marker');
      return {
        ok: true,
        message: { type, code: msgCode, messageId, token, options, payload: buf.subarray(pos + 1) },
      };
    }
    pos += 1;
    let delta = byte >> 4;
    let optLen = byte & 15;
    if (delta === 15 || optLen === 15) return fail('option');
    if (delta === 13) {
      if (pos + 1 > len) return fail('option');
      delta = buf[pos]! + 13;
      pos += 1;
    } else if (delta === 14) {
      if (pos + 2 > len) return fail('option');
      delta = ((buf[pos]! << 8) | buf[pos + 1]!) + 269;
      pos += 2;
    }
    if (optLen === 13) {
      if (pos + 1 > len) return fail('option');
      optLen = buf[pos]! + 13;
      pos += 1;
    } else if (optLen === 14) {
      if (pos + 2 > len) return fail('option');
      optLen = ((buf[pos]! << 8) | buf[pos + 1]!) + 269;
      pos += 2;
    }
    number += delta;
    if (number > 65535 || pos + optLen > len) return fail('option');
    options.push({ number, value: buf.subarray(pos, pos + optLen) });
    pos += optLen;
  }
  return { ok: true, message: { type, code: msgCode, messageId, token, options, payload: EMPTY_BUF } };
}

export const EMPTY_BUF = Buffer.alloc(0);

/** Reads an unsigned option value (network byte order, 0-4 bytes); -1 when longer than `maxBytes`. */
export function readUint(value: Buffer, maxBytes = 4): number {
  if (value.length > maxBytes) return -1;
  let n = 0;
  for (let i = 0; i < value.length; i++) n = n * 256 + value[i]!;
  return n;
}

/** Minimal-length unsigned encoding (RFC 7252 section 3.2: leading zero bytes are omitted). */
export function uintBytes(n: number): Buffer {
  if (n === 0) return EMPTY_BUF;
  if (n < 0x100) return Buffer.from([n]);
  if (n < 0x10000) return Buffer.from([n >> 8, n & 0xff]);
  if (n < 0x1000000) return Buffer.from([n >> 16, (n >> 8) & 0xff, n & 0xff]);
  return Buffer.from([Math.floor(n / 0x1000000) & 0xff, (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff]);
}

/** Bytes needed to encode an option header for this delta and length. */
function optionHeaderSize(delta: number, length: number): number {
  return 1 + (delta < 13 ? 0 : delta < 269 ? 1 : 2) + (length < 13 ? 0 : length < 269 ? 1 : 2);
}

/** Writes one option header at `pos`; returns the new position. */
function writeOptionHeader(out: Buffer, pos: number, delta: number, length: number): number {
  const dn = delta < 13 ? delta : delta < 269 ? 13 : 14;
  const ln = length < 13 ? length : length < 269 ? 13 : 14;
  out[pos++] = (dn << 4) | ln;
  if (dn === 13) out[pos++] = delta - 13;
  else if (dn === 14) {
    out.writeUInt16BE(delta - 269, pos);
    pos += 2;
  }
  if (ln === 13) out[pos++] = length - 13;
  else if (ln === 14) {
    out.writeUInt16BE(length - 269, pos);
    pos += 2;
  }
  return pos;
}

/**
 * Encodes options (sorted ascending by number by the caller) starting after option number `base`.
 * Used to pre-build the constant parts of responses and notifications once per representation.
 */
export function encodeOptions(options: readonly CoapOption[], base = 0): Buffer {
  let size = 0;
  let prev = base;
  for (const o of options) {
    size += optionHeaderSize(o.number - prev, o.value.length) + o.value.length;
    prev = o.number;
  }
  const out = Buffer.allocUnsafe(size);
  let pos = 0;
  prev = base;
  for (const o of options) {
    pos = writeOptionHeader(out, pos, o.number - prev, o.value.length);
    o.value.copy(out, pos);
    pos += o.value.length;
    prev = o.number;
  }
  return out;
}

function tokenHeaderExtra(tkl: number): number {
  return tkl < 13 ? 0 : tkl < 269 ? 1 : 2;
}

/**
 * Encodes a full message. `options` must be sorted by number. `tokenLatin1` lets the observe path keep tokens
 * as compact latin1 strings instead of Buffers.
 */
export function encodeMessage(
  type: MessageType,
  msgCode: number,
  messageId: number,
  token: Buffer | string,
  options: readonly CoapOption[],
  payload: Buffer = EMPTY_BUF,
): Buffer {
  const opts = options.length === 0 ? EMPTY_BUF : encodeOptions(options);
  return encodeWithParts(type, msgCode, messageId, token, opts, EMPTY_BUF, payload);
}

/**
 * Encodes header + token + `head` (pre-encoded options) + optional Observe option spliced between `head`
 * (which must end at an option number < 6) and `tail` (pre-encoded options that start relative to 6 when an
 * Observe option is present, else relative to `tailBase`). Kept generic enough for notifications: the head
 * holds ETag (4), the tail holds Content-Format (12) and Max-Age (14) and the payload.
 */
export function encodeWithParts(
  type: MessageType,
  msgCode: number,
  messageId: number,
  token: Buffer | string,
  head: Buffer,
  tail: Buffer,
  payload: Buffer,
): Buffer {
  const tkl = token.length;
  const size =
    4 +
    tokenHeaderExtra(tkl) +
    tkl +
    head.length +
    tail.length +
    (payload.length > 0 ? 1 + payload.length : 0);
  const out = Buffer.allocUnsafe(size);
  let pos = writeHeader(out, type, msgCode, messageId, tkl);
  if (typeof token === 'string') pos += out.write(token, pos, 'latin1');
  else pos += token.copy(out, pos);
  pos += head.copy(out, pos);
  pos += tail.copy(out, pos);
  if (payload.length > 0) {
    out[pos++] = 0xff;
    payload.copy(out, pos);
  }
  return out;
}

function writeHeader(out: Buffer, type: number, msgCode: number, messageId: number, tkl: number): number {
  const tklNibble = tkl < 13 ? tkl : tkl < 269 ? 13 : 14;
  out[0] = 0x40 | (type << 4) | tklNibble;
  out[1] = msgCode;
  out[2] = (messageId >> 8) & 0xff;
  out[3] = messageId & 0xff;
  if (tklNibble === 13) {
    out[4] = tkl - 13;
    return 5;
  }
  if (tklNibble === 14) {
    out.writeUInt16BE(tkl - 269, 4);
    return 6;
  }
  return 4;
}

/**
 * A notification from a pre-built observe form (see `observeForm` in representations.ts): header, token, the form's first
 * `splitAt` bytes (options numbered below 6, encoded from 0), the Observe option (24-bit `observe`), then the
 * rest of the form (options encoded from 6, payload marker, payload). One allocation and two copies per
 * datagram: the fan-out hot path.
 */
export function encodeFromObserveForm(
  type: MessageType,
  msgCode: number,
  messageId: number,
  token: string,
  form: Buffer,
  splitAt: number,
  observe: number,
): Buffer {
  const tkl = token.length;
  const obsLen = observe === 0 ? 0 : observe < 0x100 ? 1 : observe < 0x10000 ? 2 : 3;
  const out = Buffer.allocUnsafe(4 + tokenHeaderExtra(tkl) + tkl + form.length + 1 + obsLen);
  let pos = writeHeader(out, type, msgCode, messageId, tkl);
  if (tkl > 0) pos += out.write(token, pos, 'latin1');
  pos += form.copy(out, pos, 0, splitAt);
  out[pos++] = ((splitAt > 0 ? Opt.Observe - Opt.ETag : Opt.Observe) << 4) | obsLen;
  if (obsLen === 3) out[pos++] = (observe >> 16) & 0xff;
  if (obsLen >= 2) out[pos++] = (observe >> 8) & 0xff;
  if (obsLen >= 1) out[pos++] = observe & 0xff;
  form.copy(out, pos, splitAt);
  return out;
}

/** Builds the constant tail of a response (options after `base`, payload marker, payload). */
export function encodeTail(options: readonly CoapOption[], base: number, payload: Buffer): Buffer {
  const opts = encodeOptions(options, base);
  if (payload.length === 0) return opts;
  const out = Buffer.allocUnsafe(opts.length + 1 + payload.length);
  opts.copy(out, 0);
  out[opts.length] = 0xff;
  payload.copy(out, opts.length + 1);
  return out;
}
