// An established DTLS association (RFC 6347 §4.2.8: one per address and port) and the object callers see.
import type { ConnectionState } from './record-layer.js';

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

  constructor(
    readonly pub: DtlsSession,
    readonly state: ConnectionState,
    /** Our Finished verify_data (RFC 5246 §7.4.9), kept to resend the final flight. */
    readonly serverVerify: Buffer,
    /** The ClientHello.random of the handshake that made it: a replay of that ClientHello is ignored. */
    readonly clientRandom: Buffer,
    now: number,
    /** Next record sequence number in epoch 0 (ours), for the ChangeCipherSpec of a resent final flight. */
    public epoch0Seq: number,
    /** message_seq of our Finished. */
    readonly finishedSeq: number,
    /** message_seq of the client's Finished: a retransmission of it means our final flight was lost. */
    readonly clientFinishedSeq: number,
  ) {
    this.lastRx = now;
  }

  wipe(): void {
    this.state.wipe();
    this.serverVerify.fill(0);
  }
}
