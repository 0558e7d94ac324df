// DTLS 1.2 handshake messages (RFC 6347 §4.2-4.3, RFC 5246 §7.4) and bounded fragment reassembly
// (RFC 6347 §4.2.3). The stateless cookie is in cookie.ts.
import {
  DTLS_1_0,
  DTLS_1_2,
  EXT_EXTENDED_MASTER_SECRET,
  EXT_RENEGOTIATION_INFO,
  HANDSHAKE_HEADER_BYTES,
  HandshakeType,
  TLS_EMPTY_RENEGOTIATION_INFO_SCSV,
  TLS_PSK_WITH_AES_128_CCM_8,
} from './constants.js';

/** One handshake fragment as it appears in a record (RFC 6347 §4.2.2). */
export interface HandshakeFragment {
  readonly msgType: number;
  /** Length of the whole message body, bytes. */
  readonly length: number;
  readonly messageSeq: number;
  readonly fragmentOffset: number;
  readonly body: Buffer;
}

/**
 * Splits a handshake record into fragments. A record may carry several (RFC 6347 §4.2.3 lets
 * handshake messages share a record). Returns undefined if any header is inconsistent: the whole record
 * is then dropped, since its framing cannot be trusted.
 */
export function parseHandshakeFragments(fragment: Buffer): HandshakeFragment[] | undefined {
  const out: HandshakeFragment[] = [];
  let offset = 0;
  while (offset < fragment.length) {
    if (fragment.length - offset < HANDSHAKE_HEADER_BYTES) return undefined;
    const msgType = fragment[offset]!;
    const length = fragment.readUIntBE(offset + 1, 3);
    const messageSeq = fragment.readUInt16BE(offset + 4);
    const fragmentOffset = fragment.readUIntBE(offset + 6, 3);
    const fragmentLength = fragment.readUIntBE(offset + 9, 3);
    const start = offset + HANDSHAKE_HEADER_BYTES;
    if (start + fragmentLength > fragment.length) return undefined;
    if (fragmentOffset + fragmentLength > length) return undefined;
    out.push({
      msgType,
      length,
      messageSeq,
      fragmentOffset,
      body: fragment.subarray(start, start + fragmentLength),
    });
    offset = start + fragmentLength;
  }
  return out;
}

/**
 * A whole handshake message with its DTLS header as RFC 6347 §4.2.6 hashes it: fragment_offset = 0,
 * fragment_length = length, "as if each handshake message had been sent as a single fragment".
 */
export function encodeHandshake(msgType: number, messageSeq: number, body: Buffer): Buffer {
  const out = Buffer.allocUnsafe(HANDSHAKE_HEADER_BYTES + body.length);
  writeHandshake(out, 0, msgType, messageSeq, body);
  return out;
}

/** Writes what encodeHandshake returns into `out` at `at`; returns the offset after it. */
export function writeHandshake(
  out: Buffer,
  at: number,
  msgType: number,
  messageSeq: number,
  body: Buffer,
): number {
  out[at] = msgType;
  out.writeUIntBE(body.length, at + 1, 3);
  out.writeUInt16BE(messageSeq, at + 4);
  out.writeUIntBE(0, at + 6, 3);
  out.writeUIntBE(body.length, at + 9, 3);
  body.copy(out, at + HANDSHAKE_HEADER_BYTES);
  return at + HANDSHAKE_HEADER_BYTES + body.length;
}

export interface ClientHello {
  readonly clientVersion: number;
  readonly random: Buffer;
  readonly sessionId: Buffer;
  readonly cookie: Buffer;
  readonly cipherSuites: number[];
  readonly compressionMethods: Buffer;
  /** The extension types the client sent, with their bodies. */
  readonly extensions: Map<number, Buffer>;
  /** Offsets of the cookie vector (length byte included) inside the body, for the cookie MAC. */
  readonly cookieStart: number;
  readonly cookieEnd: number;
}

/**
 * Parses a ClientHello body (RFC 6347 §4.2.1 / RFC 5246 §7.4.1.2):
 *   client_version(2) random(32) session_id<0..32> cookie<0..2^8-1> cipher_suites<2..2^16-2>
 *   compression_methods<1..2^8-1> [extensions<0..2^16-1>]
 * Returns undefined on any decoding problem (the caller answers decode_error or drops).
 */
export function parseClientHello(body: Buffer): ClientHello | undefined {
  let p = 0;
  const need = (n: number): boolean => p + n <= body.length;
  if (!need(34)) return undefined;
  const clientVersion = body.readUInt16BE(0);
  const random = body.subarray(2, 34);
  p = 34;
  if (!need(1)) return undefined;
  const sidLen = body[p]!;
  if (sidLen > 32 || !need(1 + sidLen)) return undefined;
  const sessionId = body.subarray(p + 1, p + 1 + sidLen);
  p += 1 + sidLen;
  if (!need(1)) return undefined;
  const cookieStart = p;
  const cookieLen = body[p]!;
  if (!need(1 + cookieLen)) return undefined;
  const cookie = body.subarray(p + 1, p + 1 + cookieLen);
  p += 1 + cookieLen;
  const cookieEnd = p;
  if (!need(2)) return undefined;
  const suitesLen = body.readUInt16BE(p);
  if (suitesLen < 2 || suitesLen % 2 !== 0 || !need(2 + suitesLen)) return undefined;
  const cipherSuites: number[] = [];
  for (let i = 0; i < suitesLen; i += 2) cipherSuites.push(body.readUInt16BE(p + 2 + i));
  p += 2 + suitesLen;
  if (!need(1)) return undefined;
  const compLen = body[p]!;
  if (compLen < 1 || !need(1 + compLen)) return undefined;
  const compressionMethods = body.subarray(p + 1, p + 1 + compLen);
  p += 1 + compLen;
  const extensions = new Map<number, Buffer>();
  // RFC 5246 §7.4.1.2: the extensions block is optional; if present it must fill the message exactly.
  if (p < body.length) {
    if (!need(2)) return undefined;
    const extLen = body.readUInt16BE(p);
    p += 2;
    if (p + extLen !== body.length) return undefined;
    while (p < body.length) {
      if (!need(4)) return undefined;
      const type = body.readUInt16BE(p);
      const len = body.readUInt16BE(p + 2);
      if (!need(4 + len)) return undefined;
      // RFC 5246 §7.4.1.4: "There MUST NOT be more than one extension of the same type."
      if (extensions.has(type)) return undefined;
      extensions.set(type, body.subarray(p + 4, p + 4 + len));
      p += 4 + len;
    }
  }
  return {
    clientVersion,
    random,
    sessionId,
    cookie,
    cipherSuites,
    compressionMethods,
    extensions,
    cookieStart,
    cookieEnd,
  };
}

/** What the server takes from a ClientHello, or why it refuses it. */
export type HelloNegotiation =
  | { ok: true; extendedMasterSecret: boolean; secureRenegotiation: boolean }
  | { ok: false; alert: 'protocolVersion' | 'handshakeFailure' | 'illegalParameter' };

export function negotiate(hello: ClientHello): HelloNegotiation {
  // RFC 6347 §4.1: DTLS versions count down; {254, 253} = 1.2 is the only one we speak. A client whose
  // highest version is 1.0 ({254, 255}) gets protocol_version (RFC 5246 §E.1).
  if (
    hello.clientVersion > DTLS_1_2 ||
    (hello.clientVersion >> 8 !== 0xfe && hello.clientVersion !== DTLS_1_0)
  ) {
    return { ok: false, alert: 'protocolVersion' };
  }
  // RFC 5246 §7.4.1.2: the server picks one suite the client offered, else handshake_failure.
  if (!hello.cipherSuites.includes(TLS_PSK_WITH_AES_128_CCM_8))
    return { ok: false, alert: 'handshakeFailure' };
  // RFC 5246 §7.4.1.2: the null method (0) must be offered; we never compress (RFC 7525 §3.3).
  if (!hello.compressionMethods.includes(0)) return { ok: false, alert: 'illegalParameter' };
  const reneg = hello.extensions.get(EXT_RENEGOTIATION_INFO);
  // RFC 5746 §3.6: on an initial handshake renegotiated_connection must be empty (one zero length byte).
  if (reneg && !(reneg.length === 1 && reneg[0] === 0)) return { ok: false, alert: 'handshakeFailure' };
  const ems = hello.extensions.get(EXT_EXTENDED_MASTER_SECRET);
  // RFC 7627 §5.1: extension_data is empty.
  if (ems && ems.length !== 0) return { ok: false, alert: 'illegalParameter' };
  return {
    ok: true,
    extendedMasterSecret: ems !== undefined,
    secureRenegotiation:
      reneg !== undefined || hello.cipherSuites.includes(TLS_EMPTY_RENEGOTIATION_INFO_SCSV),
  };
}

/**
 * ServerHello body (RFC 5246 §7.4.1.3): server_version, random, an empty session_id (the session cannot
 * be resumed), the suite, compression null, and the extensions we agreed to: extended_master_secret
 * (RFC 7627 §5.2) and an empty renegotiation_info (RFC 5746 §3.6).
 */
export function serverHelloBody(random: Buffer, ems: boolean, secureRenegotiation: boolean): Buffer {
  const exts: Buffer[] = [];
  if (ems) exts.push(Buffer.from([EXT_EXTENDED_MASTER_SECRET >> 8, EXT_EXTENDED_MASTER_SECRET & 0xff, 0, 0]));
  if (secureRenegotiation) exts.push(Buffer.from([0xff, 0x01, 0, 1, 0]));
  const extBytes = Buffer.concat(exts);
  const head = Buffer.allocUnsafe(2 + 32 + 1 + 2 + 1);
  head.writeUInt16BE(DTLS_1_2, 0);
  random.copy(head, 2);
  head[34] = 0;
  head.writeUInt16BE(TLS_PSK_WITH_AES_128_CCM_8, 35);
  head[37] = 0;
  if (extBytes.length === 0) return head;
  const len = Buffer.allocUnsafe(2);
  len.writeUInt16BE(extBytes.length, 0);
  return Buffer.concat([head, len, extBytes]);
}

/**
 * HelloVerifyRequest body (RFC 6347 §4.2.1): server_version, cookie<0..2^8-1>. RFC 6347 §4.2.1 says the
 * server_version here SHOULD be DTLS 1.0 ({254, 255}) whatever the version negotiated later.
 */
export function helloVerifyRequestBody(cookie: Buffer): Buffer {
  const out = Buffer.allocUnsafe(3 + cookie.length);
  out.writeUInt16BE(DTLS_1_0, 0);
  out[2] = cookie.length;
  cookie.copy(out, 3);
  return out;
}

/** RFC 4279 §2: ClientKeyExchange for plain PSK is psk_identity<0..2^16-1>, and nothing after it. */
export function parsePskClientKeyExchange(body: Buffer): Buffer | undefined {
  if (body.length < 2) return undefined;
  const len = body.readUInt16BE(0);
  if (2 + len !== body.length) return undefined;
  return body.subarray(2);
}

/** Bounds for reassembly (RFC 6347 §4.2.3 leaves them to the implementation). */
export interface ReassemblyLimits {
  /** Largest handshake message body accepted, bytes. */
  maxMessageBytes: number;
  /** Most fragments accepted for one message. */
  maxFragmentsPerMessage: number;
  /** Most bytes buffered for one peer across all messages being reassembled. */
  maxPendingBytes: number;
  /** How far ahead of the next expected message_seq a message may be buffered. */
  maxMessagesAhead: number;
}

interface Pending {
  readonly msgType: number;
  readonly epoch: number;
  readonly body: Buffer;
  /** Sorted, non-overlapping [start, end) ranges received. */
  ranges: [number, number][];
  fragments: number;
}

export type ReassemblyResult =
  | { kind: 'none' }
  | { kind: 'message'; msgType: number; messageSeq: number; epoch: number; body: Buffer }
  | { kind: 'old'; messageSeq: number; msgType: number; fragmentOffset: number }
  | {
      kind: 'rejected';
      reason: 'too_large' | 'too_many_fragments' | 'pending_bytes' | 'too_far_ahead' | 'inconsistent';
    };

/**
 * Reassembles the peer's handshake messages in message_seq order (RFC 6347 §4.2.2: messages are
 * processed in order; future ones may be buffered, past ones are retransmissions). Each message is
 * bounded in length and fragment count, and the buffered bytes of a peer are bounded overall.
 */
export class Reassembler {
  private readonly pending = new Map<number, Pending>();
  private pendingBytes = 0;

  constructor(
    private readonly limits: ReassemblyLimits,
    public nextSeq: number,
  ) {}

  get bufferedBytes(): number {
    return this.pendingBytes;
  }

  add(f: HandshakeFragment, epoch: number): ReassemblyResult {
    if (f.messageSeq < this.nextSeq) {
      return { kind: 'old', messageSeq: f.messageSeq, msgType: f.msgType, fragmentOffset: f.fragmentOffset };
    }
    if (f.messageSeq > this.nextSeq + this.limits.maxMessagesAhead)
      return { kind: 'rejected', reason: 'too_far_ahead' };
    if (f.length > this.limits.maxMessageBytes) return { kind: 'rejected', reason: 'too_large' };
    // Unfragmented and in order: the common case needs no copy. A whole message needs none of the fragments
    // held for its number either, so fragments that disagree with it (a forged first fragment of another
    // length, RFC 6347 §4.2.3) cannot keep it out.
    if (f.fragmentOffset === 0 && f.body.length === f.length && f.messageSeq === this.nextSeq) {
      this.drop(f.messageSeq);
      this.nextSeq++;
      return { kind: 'message', msgType: f.msgType, messageSeq: f.messageSeq, epoch, body: f.body };
    }
    let p = this.pending.get(f.messageSeq);
    if (!p) {
      if (this.pendingBytes + f.length > this.limits.maxPendingBytes)
        return { kind: 'rejected', reason: 'pending_bytes' };
      p = { msgType: f.msgType, epoch, body: Buffer.alloc(f.length), ranges: [], fragments: 0 };
      this.pending.set(f.messageSeq, p);
      this.pendingBytes += f.length;
    } else if (p.msgType !== f.msgType || p.body.length !== f.length || p.epoch !== epoch) {
      // RFC 6347 §4.2.3: all fragments of a message carry the same type and length.
      return { kind: 'rejected', reason: 'inconsistent' };
    }
    if (++p.fragments > this.limits.maxFragmentsPerMessage) {
      this.drop(f.messageSeq);
      return { kind: 'rejected', reason: 'too_many_fragments' };
    }
    f.body.copy(p.body, f.fragmentOffset);
    p.ranges = mergeRange(p.ranges, f.fragmentOffset, f.fragmentOffset + f.body.length);
    return this.drain();
  }

  /** Delivers the next expected message if it is complete. */
  drain(): ReassemblyResult {
    const p = this.pending.get(this.nextSeq);
    if (!p) return { kind: 'none' };
    const r = p.ranges[0];
    const complete =
      p.body.length === 0 ||
      (p.ranges.length === 1 && r !== undefined && r[0] === 0 && r[1] === p.body.length);
    if (!complete) return { kind: 'none' };
    const seq = this.nextSeq;
    this.drop(seq);
    this.nextSeq++;
    return { kind: 'message', msgType: p.msgType, messageSeq: seq, epoch: p.epoch, body: p.body };
  }

  private drop(seq: number): void {
    const p = this.pending.get(seq);
    if (!p) return;
    this.pendingBytes -= p.body.length;
    this.pending.delete(seq);
  }
}

function mergeRange(ranges: [number, number][], start: number, end: number): [number, number][] {
  if (end <= start) return ranges;
  const out: [number, number][] = [];
  let s = start;
  let e = end;
  for (const [a, b] of ranges) {
    if (b < s || a > e) out.push([a, b]);
    else {
      s = Math.min(s, a);
      e = Math.max(e, b);
    }
  }
  out.push([s, e]);
  out.sort((x, y) => x[0] - y[0]);
  return out;
}

export { HandshakeType };
export { CookieJar } from './cookie.js';
