// A flight of ours and its retransmission timer (RFC 6347 §4.2.4, §4.2.4.1).
import { ContentType, DTLS_1_2, RECORD_HEADER_BYTES } from './constants.js';

/** Where a flight's records take their epoch 0 sequence numbers from (the handshake's counter). */
export interface Epoch0Counter {
  epoch0Seq: number;
}

/**
 * Handshake messages sent together and resent together until the peer's next flight shows they arrived.
 * Each message travels in its own record (several messages in one record are legal, RFC 6347 §4.2.3, but
 * small stacks such as node-dtls-client read one message per record); all records share one datagram.
 */
export class Flight {
  /** Current timeout, ms: doubles on each retransmission up to a bound (RFC 6347 §4.2.4.1). */
  private delay: number;
  /** Server clock (ms) at which the flight is resent if nothing arrived. */
  private dueAt: number;

  constructor(
    private readonly messages: readonly Buffer[],
    initialDelayMs: number,
    now: number,
  ) {
    this.delay = initialDelayMs;
    this.dueAt = now + initialDelayMs;
    this.sentAt = now;
  }

  /**
   * The flight as one datagram. Every sending takes new record sequence numbers (RFC 6347 §4.2.4: a
   * retransmission is a new record; §4.1.2.6: numbers are never reused).
   */
  datagram(counter: Epoch0Counter): Buffer {
    let bytes = 0;
    for (const m of this.messages) bytes += RECORD_HEADER_BYTES + m.length;
    const out = Buffer.allocUnsafe(bytes);
    let at = 0;
    for (const m of this.messages) {
      out[at] = ContentType.handshake;
      out.writeUInt16BE(DTLS_1_2, at + 1);
      out.writeUInt16BE(0, at + 3);
      out.writeUIntBE(counter.epoch0Seq++, at + 5, 6);
      out.writeUInt16BE(m.length, at + 11);
      m.copy(out, at + RECORD_HEADER_BYTES);
      at += RECORD_HEADER_BYTES + m.length;
    }
    return out;
  }

  /** Server clock (ms) of the last sending (see mayResend). */
  private sentAt = -Infinity;

  /**
   * Whether a resend asked for by the peer (a retransmitted flight of its own) may go now: at most one per
   * `minGapMs`. Records the sending when it may.
   */
  mayResend(now: number, minGapMs: number): boolean {
    if (now - this.sentAt < minGapMs) return false;
    this.sentAt = now;
    return true;
  }

  /** Whether the timer ran out at `now`; if so it is rearmed with the doubled timeout, up to `maxDelayMs`. */
  due(now: number, maxDelayMs: number): boolean {
    if (now < this.dueAt) return false;
    this.delay = Math.min(this.delay * 2, maxDelayMs);
    this.dueAt = now + this.delay;
    this.sentAt = now;
    return true;
  }
}
