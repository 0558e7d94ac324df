// The protected half of the record layer (RFC 6347 §4.1): the connection state of epoch 1 for one peer, with
// its record protection (TLS_PSK_WITH_AES_128_CCM_8, RFC 6655 §3), its write sequence numbers and the
// receive window of RFC 6347 §4.1.2.6. Epoch 0 (unprotected) records are framed by record.ts alone.
//
// Keys are KeyObjects made once per connection (crypto.createSecretKey): with a Buffer key, every
// createCipheriv/createDecipheriv first tries isKeyObject()/isCryptoKey() on it, and on Node 24 each of those
// throws and catches an exception internally (measured 12-16 µs per call against 1-2.5 µs with a KeyObject).
import { createSecretKey, type KeyObject } from 'node:crypto';
import { DTLS_1_2, FIXED_IV_BYTES, KEY_BYTES } from './constants.js';
import { KeyBlock, openCcm8, sealCcm8Record } from './crypto.js';
import { MAX_SEQ, newReplayWindow, replayAccept, replayCheck } from './record.js';
import type { DtlsRecord, ReplayWindow } from './record.js';

/** Why an epoch 1 record was not opened: a replay (§4.1.2.6) or a failed authentication (§4.1.2.7). */
export type OpenFailure = 'replay' | 'mac';

/**
 * Epoch 1 of one peer, server side: we write with server_write_key/IV and read with client_write_key/IV
 * (RFC 5246 §6.3). The read window is the connection's: it is made during the handshake (the client's Finished
 * is the first epoch 1 record) and carries over to the session.
 */
export class ConnectionState {
  private readonly readKey: KeyObject;
  private readonly writeKey: KeyObject;
  /** client_write_IV | server_write_IV: the implicit CCM salts (RFC 6655 §3). */
  private readonly salts: Buffer;
  private readonly window: ReplayWindow = newReplayWindow();
  /** Next record sequence number of ours in epoch 1 (RFC 6347 §4.1: never reused, never wrapped). */
  private writeSeq = 0;

  /** `keyBlock` is the 40-byte key block of RFC 5246 §6.3; the caller may wipe it afterwards. */
  constructor(keyBlock: Buffer) {
    this.readKey = createSecretKey(
      keyBlock.subarray(KeyBlock.clientWriteKey, KeyBlock.clientWriteKey + KEY_BYTES),
    );
    this.writeKey = createSecretKey(
      keyBlock.subarray(KeyBlock.serverWriteKey, KeyBlock.serverWriteKey + KEY_BYTES),
    );
    this.salts = Buffer.alloc(2 * FIXED_IV_BYTES);
    keyBlock.copy(this.salts, 0, KeyBlock.clientWriteIv, KeyBlock.clientWriteIv + 2 * FIXED_IV_BYTES);
  }

  /**
   * RFC 6347 §4.1.2.6: check the window, authenticate, and only then mark the number received. Returns the
   * plaintext, or why the record is dropped (silently, §4.1.2.7).
   */
  open(rec: DtlsRecord): Buffer | OpenFailure {
    if (!replayCheck(this.window, rec.seq)) return 'replay';
    const plaintext = openCcm8(
      this.readKey,
      this.salts.subarray(0, FIXED_IV_BYTES),
      rec.epoch,
      rec.seq,
      rec.type,
      rec.version,
      rec.fragment,
    );
    if (plaintext === undefined) return 'mac';
    replayAccept(this.window, rec.seq);
    return plaintext;
  }

  /** One whole epoch 1 record, header included; undefined once the sequence numbers are used up. */
  seal(type: number, plaintext: Buffer): Buffer | undefined {
    if (this.writeSeq >= MAX_SEQ) return undefined; // RFC 6347 §4.1: never wrap; practically unreachable
    const seq = this.writeSeq++;
    return sealCcm8Record(
      this.writeKey,
      this.salts.subarray(FIXED_IV_BYTES),
      1,
      seq,
      type,
      DTLS_1_2,
      plaintext,
    );
  }

  /** Overwrites what can be overwritten (KeyObjects cannot be wiped; they are dropped with this object). */
  wipe(): void {
    this.salts.fill(0);
  }
}
