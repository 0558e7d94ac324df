// An established DTLS association (RFC 6347 §4.2.8: one per address and port) and the object callers see.
import { RANDOM_BYTES, VERIFY_DATA_BYTES } from './constants.js';
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
 * What an operator may see of a session (DtlsServer.sessionsOf): who, from where, since when. Never key
 * material: no field here is derived from a key.
 */
export interface DtlsSessionView {
  /** The PSK identity the session authenticated with (RFC 4279 §2; sent in clear by the client). */
  identity: string;
  address: string;
  port: number;
  /** When the handshake completed (ISO 8601, whole seconds). */
  establishedAt: string;
  /** When the last authenticated record from the client arrived (ISO 8601); the client's Finished at first. */
  lastRecordAt: string;
}

/**
 * An established session. Kept small on purpose (many thousands are held idle): no closures, no timers; the
 * keys live in the connection state, the replay window in three numbers there.
 */
export class Session {
  /** Server clock (ms since the server started) of the last authenticated record from the client. */
  lastRx: number;
  /**
   * Server clock in whole seconds at which the session was established (for the operator's view only). In
   * seconds, not ms, so it stays a small integer (an unboxed Smi, one 8-byte field) for 68 years of uptime,
   * where ms pass 2^31 after 24.8 days and would be boxed (a 16-byte HeapNumber more per session).
   */
  readonly establishedAtS: number;
  finalResends = 0;
  // Our Finished verify_data (RFC 5246 §7.4.9, 12 bytes), kept to resend the final flight, and the first and
  // last 4 bytes of the ClientHello.random of the handshake that made the session (a replay of that
  // ClientHello is ignored; 64 bits of a random tell it from a new client's with odds of 2^-64). As int32
  // fields, not Buffers: a Buffer costs two objects and a malloc'ed store, and the fleet holds many sessions.
  private readonly verify0: number;
  private readonly verify1: number;
  private readonly verify2: number;
  private readonly randomHead: number;
  private readonly randomTail: number;

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
    this.establishedAtS = Math.floor(now / 1000);
    this.verify0 = serverVerify.readInt32BE(0);
    this.verify1 = serverVerify.readInt32BE(4);
    this.verify2 = serverVerify.readInt32BE(8);
    this.randomHead = clientRandom.readInt32BE(0);
    this.randomTail = clientRandom.readInt32BE(RANDOM_BYTES - 4);
  }

  /** Our Finished verify_data, for a resent final flight (rare: a new buffer each time). */
  serverVerify(): Buffer {
    const out = Buffer.alloc(VERIFY_DATA_BYTES);
    out.writeInt32BE(this.verify0, 0);
    out.writeInt32BE(this.verify1, 4);
    out.writeInt32BE(this.verify2, 8);
    return out;
  }

  isClientRandom(random: Buffer): boolean {
    return (
      random.length === RANDOM_BYTES &&
      random.readInt32BE(0) === this.randomHead &&
      random.readInt32BE(RANDOM_BYTES - 4) === this.randomTail
    );
  }

  wipe(): void {
    this.state.wipe();
  }
}
