// An established DTLS association (RFC 6347 §4.2.8: one per address and port) and the object callers see.
import { VERIFY_DATA_BYTES } from './constants.js';
import type { ConnectionState } from './record-layer.js';

/** RFC 5246 §7.4.1.2: Random is 32 bytes. */
const RANDOM_BYTES = 32;

/** What the gateway sees of a session: the same frozen object for every callback of one session. */
export interface DtlsSession {
  /** 'dtls|port|address' */
  readonly key: string;
  readonly address: string;
  readonly port: number;
  readonly identity: string;
  readonly deviceId: string;
  readonly credentialId: string;
}

/**
 * An established session. Kept small on purpose (many thousands are held idle): no closures, no timers; the
 * keys live in the connection state, the replay window in three numbers there.
 */
export class Session {
  /** Server clock (ms since the server started) of the last authenticated record from the client. */
  lastRx: number;
  finalResends = 0;
  /**
   * Our Finished verify_data (RFC 5246 §7.4.9, 12 bytes), kept to resend the final flight, then the
   * ClientHello.random of the handshake that made the session (32 bytes): a replay of that ClientHello is
   * ignored. One buffer of its own (Buffer.alloc): pooled slices would keep 8 KB pool slabs alive.
   */
  private readonly memo: Buffer;

  constructor(
    readonly pub: DtlsSession,
    readonly state: ConnectionState,
    serverVerify: Buffer,
    clientRandom: Buffer,
    now: number,
    /** Next record sequence number in epoch 0 (ours), for the ChangeCipherSpec of a resent final flight. */
    public epoch0Seq: number,
    /** message_seq of our Finished. */
    readonly finishedSeq: number,
    /** message_seq of the client's Finished: a retransmission of it means our final flight was lost. */
    readonly clientFinishedSeq: number,
  ) {
    this.lastRx = now;
    this.memo = Buffer.alloc(VERIFY_DATA_BYTES + RANDOM_BYTES);
    serverVerify.copy(this.memo, 0, 0, VERIFY_DATA_BYTES);
    clientRandom.copy(this.memo, VERIFY_DATA_BYTES, 0, RANDOM_BYTES);
  }

  get serverVerify(): Buffer {
    return this.memo.subarray(0, VERIFY_DATA_BYTES);
  }

  isClientRandom(random: Buffer): boolean {
    return (
      random.length === RANDOM_BYTES && this.memo.compare(random, 0, RANDOM_BYTES, VERIFY_DATA_BYTES) === 0
    );
  }

  wipe(): void {
    this.state.wipe();
    this.memo.fill(0);
  }
}
