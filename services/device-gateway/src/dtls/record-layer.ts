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
 * The key objects are made on first use and dropped by `release()` when the session has been quiet for a
 * while (the connector's idle sweep): they cost about 1.1 KB of native memory each, the raw key block 40
 * bytes, and remaking the pair costs about 1.3 µs. An idle session of a large fleet so keeps only its key
 * block; a busy one keeps its key objects.
 */
export class ConnectionState implements ReplayWindow {
  /** client_write_key | server_write_key | client_write_IV | server_write_IV: the key block without MAC keys. */
  private readonly block: Buffer;
  private keys?: { read: KeyObject; write: KeyObject };
  /** Whether a record was sealed or opened since the last `releaseIfUnused` (see there). */
  private used = true;
  /** Next record sequence number of ours in epoch 1 (RFC 6347 §4.1: never reused, never wrapped). */
  private writeSeq = 0;
  /** The receive window (RFC 6347 §4.1.2.6, record.ts), in three numbers so that it needs no object. */
  top: number;
  lo: number;
  hi: number;

  /** `keyBlock` is the 40-byte key block of RFC 5246 §6.3 (copied; the caller wipes its own). */
  constructor(keyBlock: Buffer) {
    // Buffer.alloc, not allocUnsafe: a pooled slice would keep a whole 8 KB pool slab alive per session.
    this.block = Buffer.alloc(KeyBlock.length);
    keyBlock.copy(this.block, 0, 0, KeyBlock.length);
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
      this.block,
      rec.epoch,
      rec.seq,
      rec.type,
      rec.version,
      rec.fragment,
      KeyBlock.clientWriteIv,
    );
    if (plaintext === undefined) return 'mac';
    replayAccept(this, rec.seq);
    return plaintext;
  }

  /** One whole epoch 1 record, header included; undefined once the sequence numbers are used up. */
  seal(type: number, plaintext: Buffer): Buffer | undefined {
    if (this.writeSeq >= MAX_SEQ) return undefined; // RFC 6347 §4.1: never wrap; practically unreachable
    const seq = this.writeSeq++;
    return sealCcm8Record(
      this.keyObjects().write,
      this.block,
      KeyBlock.serverWriteIv,
      1,
      seq,
      type,
      DTLS_1_2,
      plaintext,
    );
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

  /** Overwrites the key block (key objects cannot be wiped; they are dropped with this object). */
  wipe(): void {
    this.block.fill(0);
    this.keys = undefined;
  }

  private keyObjects(): { read: KeyObject; write: KeyObject } {
    this.used = true;
    return (this.keys ??= {
      read: createSecretKey(
        this.block.subarray(KeyBlock.clientWriteKey, KeyBlock.clientWriteKey + KEY_BYTES),
      ),
      write: createSecretKey(
        this.block.subarray(KeyBlock.serverWriteKey, KeyBlock.serverWriteKey + KEY_BYTES),
      ),
    });
  }
}
