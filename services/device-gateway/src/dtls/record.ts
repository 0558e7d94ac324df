// DTLS 1.2 record layer framing (RFC 6347 §4.1) and the anti-replay window (RFC 6347 §4.1.2.6).
import { DTLS_1_0, DTLS_1_2, MAX_CIPHERTEXT_BYTES, RECORD_HEADER_BYTES } from './constants.js';

export interface DtlsRecord {
  readonly type: number;
  readonly version: number;
  readonly epoch: number;
  /** 48-bit sequence_number; exact in a double (2^48 < 2^53). */
  readonly seq: number;
  readonly fragment: Buffer;
}

/**
 * Reads the record that starts at `offset` of a datagram (RFC 6347 §4.1.1: several records may share a
 * datagram, a record never spans two), or undefined when its header or length does not fit, or its version is
 * not DTLS: RFC 6347 §4.1.2.7 says invalid records are silently discarded, and past a broken length the rest of
 * the datagram cannot be framed. The next record, if any, starts at offset + RECORD_HEADER_BYTES +
 * fragment.length. The connector reads a datagram record by record with this (no array per datagram).
 */
export function readRecord(datagram: Buffer, offset: number): DtlsRecord | undefined {
  if (datagram.length - offset < RECORD_HEADER_BYTES) return undefined;
  const version = (datagram[offset + 1]! << 8) | datagram[offset + 2]!;
  // RFC 6347 §4.1: DTLS 1.2 records carry {254, 253}; a first ClientHello may carry {254, 255}
  // (RFC 6347 §4.2.1), which the caller checks for epoch 0 only.
  if (version !== DTLS_1_2 && version !== DTLS_1_0) return undefined;
  const length = (datagram[offset + 11]! << 8) | datagram[offset + 12]!;
  const end = offset + RECORD_HEADER_BYTES + length;
  if (end > datagram.length || length > MAX_CIPHERTEXT_BYTES) return undefined;
  return {
    type: datagram[offset]!,
    version,
    epoch: (datagram[offset + 3]! << 8) | datagram[offset + 4]!,
    seq: datagram.readUIntBE(offset + 5, 6),
    fragment: datagram.subarray(offset + RECORD_HEADER_BYTES, end),
  };
}

/**
 * Splits one datagram into records (see readRecord). Parsing stops at the first record that cannot be read.
 * Returns the records and whether anything was cut off.
 */
export function parseRecords(datagram: Buffer): { records: DtlsRecord[]; malformed: boolean } {
  const records: DtlsRecord[] = [];
  let offset = 0;
  while (offset < datagram.length) {
    const rec = readRecord(datagram, offset);
    if (rec === undefined) return { records, malformed: true };
    records.push(rec);
    offset += RECORD_HEADER_BYTES + rec.fragment.length;
  }
  return { records, malformed: false };
}

/** Writes one record: header (RFC 6347 §4.1) and fragment. */
export function encodeRecord(
  type: number,
  version: number,
  epoch: number,
  seq: number,
  fragment: Buffer,
): Buffer {
  const out = Buffer.allocUnsafe(RECORD_HEADER_BYTES + fragment.length);
  out[0] = type;
  out.writeUInt16BE(version, 1);
  out.writeUInt16BE(epoch, 3);
  out.writeUIntBE(seq, 5, 6);
  out.writeUInt16BE(fragment.length, 11);
  fragment.copy(out, RECORD_HEADER_BYTES);
  return out;
}

/** The largest sequence number of RFC 6347 §4.1: 2^48 - 1. */
export const MAX_SEQ = 2 ** 48 - 1;

/**
 * The 64-record sliding window of RFC 6347 §4.1.2.6 (after RFC 4303 §3.4.3), kept in three numbers so
 * that it lives inside the session object without allocations: `top` is the highest sequence number
 * accepted so far (-1 before the first), and bit i of (hi:lo) says whether top - i was received.
 *
 * `check` says whether a sequence number may be processed; `accept` records it and must be called only
 * after the record has authenticated (§4.1.2.6: "the receive window is updated only if the MAC
 * verification succeeds").
 */
export interface ReplayWindow {
  top: number;
  lo: number;
  hi: number;
}

export const REPLAY_WINDOW_SIZE = 64;

export function newReplayWindow(): ReplayWindow {
  return { top: -1, lo: 0, hi: 0 };
}

export function replayCheck(w: ReplayWindow, seq: number): boolean {
  if (seq > w.top) return true;
  const diff = w.top - seq;
  if (diff >= REPLAY_WINDOW_SIZE) return false;
  const bit = diff < 32 ? (w.lo >>> diff) & 1 : (w.hi >>> (diff - 32)) & 1;
  return bit === 0;
}

export function replayAccept(w: ReplayWindow, seq: number): void {
  if (seq > w.top) {
    const shift = w.top < 0 ? REPLAY_WINDOW_SIZE : seq - w.top;
    if (shift >= REPLAY_WINDOW_SIZE) {
      w.lo = 0;
      w.hi = 0;
    } else if (shift >= 32) {
      w.hi = (w.lo << (shift - 32)) | 0;
      w.lo = 0;
    } else {
      w.hi = (w.hi << shift) | (w.lo >>> (32 - shift)) | 0;
      w.lo = (w.lo << shift) | 0;
    }
    w.lo |= 1;
    w.top = seq;
    return;
  }
  const diff = w.top - seq;
  if (diff >= REPLAY_WINDOW_SIZE) return;
  if (diff < 32) w.lo |= 1 << diff;
  else w.hi |= 1 << (diff - 32);
}
