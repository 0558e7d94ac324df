// The protected half of the record layer (RFC 6347 §4.1): the connection state of epoch 1 for one peer, with
// its record protection (TLS_PSK_WITH_AES_128_CCM_8, RFC 6655 §3), its write sequence numbers and the
// receive window of RFC 6347 §4.1.2.6. Epoch 0 (unprotected) records are framed by record.ts alone.
//
// Keys reach node:crypto as KeyObjects (crypto.createSecretKey): with a Buffer key, every
// createCipheriv/createDecipheriv first tries isKeyObject()/isCryptoKey() on it, and on Node 24 each of those
// throws and catches an exception internally (measured 12-16 µs per call against 1-2.5 µs with a KeyObject).
import { createSecretKey, type KeyObject } from 'node:crypto';
import { DTLS_1_2, KEY_BYTES } from './constants.js';
import { KeyBlock, openCcm8, sealCcm8Record } from './crypto.js';
import { MAX_SEQ, newReplayWindow, replayAccept, replayCheck } from './record.js';
import type { DtlsRecord, ReplayWindow } from './record.js';

/** Why an epoch 1 record was not opened: a replay (§4.1.2.6) or a failed authentication (§4.1.2.7). */
export type OpenFailure = 'replay' | 'mac';

/**
 * Epoch 1 of one peer, server side: we write with server_write_key/IV and read with client_write_key/IV
 * (RFC 5246 §6.3). The read window is the connection's: it is made during the handshake (the client's Finished
 * is the first epoch 1 record) and carries over to the session.
 *
 * Memory, for a fleet of mostly idle sessions: the key block is held in ten int32 fields, not a Buffer (a
 * Buffer is two objects and a malloc'ed store); the key objects (about 1.1 KB of native memory each) are made
 * on first use and dropped when the session has been quiet for a while (the connector's idle sweep calls
 * `releaseIfUnused`), and remaking the pair costs about 1.3 µs.
 */
export class ConnectionState implements ReplayWindow {
  // client_write_key (4 × int32), server_write_key (4), client_write_IV (1), server_write_IV (1).
  private c0: number;
  private c1: number;
  private c2: number;
  private c3: number;
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;
  private readonly clientIv: number;
  private readonly serverIv: number;
  private keys?: { read: KeyObject; write: KeyObject };
  /** Whether a record was sealed or opened since the last `releaseIfUnused` (see there). */
  private used = true;
  /** Next record sequence number of ours in epoch 1 (RFC 6347 §4.1: never reused, never wrapped). */
  private writeSeq = 0;
  /** The receive window (RFC 6347 §4.1.2.6, record.ts), in three numbers so that it needs no object. */
  top: number;
  lo: number;
  hi: number;

  /** `keyBlock` is the 40-byte key block of RFC 5246 §6.3 (read; the caller wipes its own). */
  constructor(keyBlock: Buffer) {
    const c = KeyBlock.clientWriteKey;
    const s = KeyBlock.serverWriteKey;
    this.c0 = keyBlock.readInt32BE(c);
    this.c1 = keyBlock.readInt32BE(c + 4);
    this.c2 = keyBlock.readInt32BE(c + 8);
    this.c3 = keyBlock.readInt32BE(c + 12);
    this.s0 = keyBlock.readInt32BE(s);
    this.s1 = keyBlock.readInt32BE(s + 4);
    this.s2 = keyBlock.readInt32BE(s + 8);
    this.s3 = keyBlock.readInt32BE(s + 12);
    this.clientIv = keyBlock.readInt32BE(KeyBlock.clientWriteIv);
    this.serverIv = keyBlock.readInt32BE(KeyBlock.serverWriteIv);
    const window = newReplayWindow();
    this.top = window.top;
    this.lo = window.lo;
    this.hi = window.hi;
  }

  /**
   * RFC 6347 §4.1.2.6: check the window, authenticate, and only then mark the number received. Returns the
   * plaintext, or why the record is dropped (silently, §4.1.2.7).
   */
  open(rec: DtlsRecord): Buffer | OpenFailure {
    if (!replayCheck(this, rec.seq)) return 'replay';
    const plaintext = openCcm8(
      this.keyObjects().read,
      this.clientIv,
      rec.epoch,
      rec.seq,
      rec.type,
      rec.version,
      rec.fragment,
    );
    if (plaintext === undefined) return 'mac';
    replayAccept(this, rec.seq);
    return plaintext;
  }

  /** One whole epoch 1 record, header included; undefined once the sequence numbers are used up. */
  seal(type: number, plaintext: Buffer): Buffer | undefined {
    if (this.writeSeq >= MAX_SEQ) return undefined; // RFC 6347 §4.1: never wrap; practically unreachable
    const seq = this.writeSeq++;
    return sealCcm8Record(this.keyObjects().write, this.serverIv, 1, seq, type, DTLS_1_2, plaintext);
  }

  /**
   * Drops the key objects if no record was sealed or opened since the previous call; the connector calls
   * this from its idle sweep, so a session quiet for one to two sweep intervals holds none.
   */
  releaseIfUnused(): void {
    if (!this.used) this.keys = undefined;
    this.used = false;
  }

  /** Drops the key objects now (they are made again by the next record). */
  release(): void {
    this.keys = undefined;
    this.used = false;
  }

  /** Overwrites the keys (key objects cannot be wiped; they are dropped with this object). */
  wipe(): void {
    this.c0 = this.c1 = this.c2 = this.c3 = 0;
    this.s0 = this.s1 = this.s2 = this.s3 = 0;
    this.keys = undefined;
  }

  private keyObjects(): { read: KeyObject; write: KeyObject } {
    this.used = true;
    return (this.keys ??= {
      read: keyObject(this.c0, this.c1, this.c2, this.c3),
      write: keyObject(this.s0, this.s1, this.s2, this.s3),
    });
  }
}

/** createSecretKey copies the bytes it is given, so one scratch buffer serves every call (and is wiped). */
const scratch = Buffer.alloc(KEY_BYTES);

function keyObject(w0: number, w1: number, w2: number, w3: number): KeyObject {
  scratch.writeInt32BE(w0, 0);
  scratch.writeInt32BE(w1, 4);
  scratch.writeInt32BE(w2, 8);
  scratch.writeInt32BE(w3, 12);
  const key = createSecretKey(scratch);
  scratch.fill(0);
  return key;
}
