// A DTLS 1.2 server (RFC 6347) for pre-shared keys (RFC 4279 §2) with the single cipher suite
// TLS_PSK_WITH_AES_128_CCM_8 (RFC 6655, the RFC 7925 / RFC 7252 §9.1.3.1 profile), the extended master
// secret (RFC 7627) when offered, and no renegotiation (RFC 5746) and no compression.
//
// Flights (RFC 6347 §4.2.4, Figure 1), server side:
//   ClientHello            -> HelloVerifyRequest (stateless: nothing is kept, RFC 6347 §4.2.1)
//   ClientHello + cookie   -> ServerHello, ServerHelloDone            (flight 4, retransmitted on a timer)
//   ClientKeyExchange, ChangeCipherSpec, Finished -> ChangeCipherSpec, Finished   (flight 6, resent only
//                                                     when the client retransmits its flight 5)
import { errorMessage } from '@platform/service-kit';
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Hash } from 'node:crypto';
import type dgram from 'node:dgram';
import type { AddressInfo } from 'node:net';
import { createUdpSocket } from '../net/udp-socket.js';
import {
  AlertDescription,
  AlertLevel,
  ContentType,
  DTLS_1_0,
  DTLS_1_2,
  HandshakeType,
  MAX_PLAINTEXT_BYTES,
  VERIFY_DATA_BYTES,
} from './constants.js';
import type { AlertName } from './constants.js';
import {
  KeyBlock,
  extendedMasterSecret,
  finishedVerifyData,
  keyBlock,
  masterSecret,
  openCcm8,
  pskPremaster,
  sealCcm8,
} from './crypto.js';
import {
  CookieJar,
  Reassembler,
  encodeHandshake,
  helloVerifyRequestBody,
  negotiate,
  parseClientHello,
  parseHandshakeFragments,
  parsePskClientKeyExchange,
  serverHelloBody,
} from './handshake.js';
import type { HandshakeFragment, ReassemblyResult } from './handshake.js';
import { MAX_SEQ, encodeRecord, newReplayWindow, parseRecords, replayAccept, replayCheck } from './record.js';
import type { DtlsRecord, ReplayWindow } from './record.js';

export interface PskCredential {
  readonly credentialId: string;
  readonly identity: string;
  readonly key: Buffer;
  readonly deviceId: string;
}

export interface DtlsLogger {
  info(message: string, meta?: Record<string, unknown>): unknown;
  warn(message: string, meta?: Record<string, unknown>): unknown;
  error(message: string, meta?: Record<string, unknown>): unknown;
  debug(message: string, meta?: Record<string, unknown>): unknown;
}

export interface DtlsServerOptions {
  /**
   * Synchronous: the current valid credential for this identity (not revoked, within
   * not_before..not_after), else undefined. Called once per handshake, at ClientKeyExchange.
   */
  lookupPsk(identity: string): PskCredential | undefined;
  logger: DtlsLogger;
  /** Established sessions plus handshakes in progress, in all. */
  maxSessions: number;
  /** Established sessions plus handshakes in progress from one source IP address. */
  maxSessionsPerAddress: number;
  /** Handshakes in progress (a cookie-verified ClientHello starts one). */
  maxHandshakes: number;
  /** A session that has received no authenticated record for this long is ended ('idle'), ms. */
  idleTimeoutMs: number;
  /** A handshake not finished this long after its ClientHello is abandoned, ms. */
  handshakeTimeoutMs: number;
  /** The cookie secret is replaced this often; the previous one stays valid for one more period, ms. */
  cookieSecretRotationMs: number;
  /** SO_RCVBUF / SO_SNDBUF request, bytes; undefined leaves the OS default. */
  socketBufferBytes?: number;
  /** First retransmission timeout of our flight, ms (RFC 6347 §4.2.4.1: 1 s). */
  retransmitInitialMs: number;
  /**
   * Upper bound of the doubling retransmission timeout, ms (RFC 6347 §4.2.4.1: "up to no less than" 60 s;
   * handshakeTimeoutMs ends the handshake first with the defaults).
   */
  retransmitMaxMs: number;
  /** Largest handshake message body reassembled, bytes. */
  maxHandshakeMessageBytes: number;
  /** Most fragments accepted for one handshake message. */
  maxFragmentsPerMessage: number;
  /** Most handshake bytes buffered for one peer during reassembly, bytes. */
  maxPendingBytesPerPeer: number;
  /** How often timers (retransmission, handshake deadline, cookie rotation) are checked, ms. */
  timerResolutionMs: number;
  /** How often idle sessions are looked for, ms. */
  idleSweepIntervalMs: number;
  /** How often one session resends its final flight when the client retransmits its Finished. */
  maxFinalFlightResends: number;
}

export const defaultDtlsOptions = {
  maxSessions: 20_000,
  maxSessionsPerAddress: 64,
  maxHandshakes: 2_000,
  idleTimeoutMs: 600_000,
  handshakeTimeoutMs: 30_000,
  cookieSecretRotationMs: 300_000,
  retransmitInitialMs: 1_000,
  retransmitMaxMs: 60_000,
  maxHandshakeMessageBytes: 4_096,
  maxFragmentsPerMessage: 16,
  maxPendingBytesPerPeer: 8_192,
  timerResolutionMs: 100,
  idleSweepIntervalMs: 5_000,
  maxFinalFlightResends: 8,
} as const satisfies Omit<DtlsServerOptions, 'lookupPsk' | 'logger'>;

export type DtlsServerInit = Pick<DtlsServerOptions, 'lookupPsk' | 'logger'> & Partial<DtlsServerOptions>;

export interface DtlsSession {
  /** 'dtls|port|address' */
  readonly key: string;
  readonly address: string;
  readonly port: number;
  readonly identity: string;
  readonly deviceId: string;
  readonly credentialId: string;
}

export type DtlsSessionEndReason =
  'close_notify' | 'idle' | 'replaced' | 'ended' | 'revoked' | 'fatal_alert' | 'server_close';

export type DtlsHandshakeFailure =
  | 'decrypt_error'
  | 'handshake_failure'
  | 'protocol_version'
  | 'illegal_parameter'
  | 'decode_error'
  | 'unexpected_message'
  | 'peer_alert'
  | 'timeout'
  | 'superseded'
  | 'server_close';

export type DtlsDropReason =
  | 'malformed'
  | 'mac'
  | 'replay'
  | 'epoch'
  | 'version'
  | 'no_state'
  | 'fragmented_client_hello'
  | 'reassembly'
  | 'unexpected'
  | 'limit';

export interface DtlsStats {
  datagramsReceived: number;
  recordsReceived: number;
  /** HelloVerifyRequests sent. */
  cookiesSent: number;
  /** ClientHellos whose cookie was present but wrong or expired. */
  badCookies: number;
  handshakesStarted: number;
  handshakesCompleted: number;
  handshakeFailures: Record<DtlsHandshakeFailure, number>;
  /** Cookie-verified ClientHellos refused by a limit. */
  limitRejections: { sessions: number; sessionsPerAddress: number; handshakes: number };
  recordsDropped: Record<DtlsDropReason, number>;
  alertsSent: Record<AlertName, number>;
  sessionsEnded: Record<DtlsSessionEndReason, number>;
  /** Flights sent again (timer or peer retransmission). */
  retransmissions: number;
  applicationRecordsReceived: number;
  applicationRecordsSent: number;
  /** Exceptions thrown by onApplicationData / onSessionStart / onSessionEnd / lookupPsk. */
  callbackErrors: number;
  /** Exceptions caught at the socket handler: each one is a bug, never a crash. */
  internalErrors: number;
  sendErrors: number;
}

function zeroRecord<K extends string>(keys: readonly K[]): Record<K, number> {
  return Object.fromEntries(keys.map((k) => [k, 0])) as Record<K, number>;
}

function newStats(): DtlsStats {
  return {
    datagramsReceived: 0,
    recordsReceived: 0,
    cookiesSent: 0,
    badCookies: 0,
    handshakesStarted: 0,
    handshakesCompleted: 0,
    handshakeFailures: zeroRecord<DtlsHandshakeFailure>([
      'decrypt_error',
      'handshake_failure',
      'protocol_version',
      'illegal_parameter',
      'decode_error',
      'unexpected_message',
      'peer_alert',
      'timeout',
      'superseded',
      'server_close',
    ]),
    limitRejections: { sessions: 0, sessionsPerAddress: 0, handshakes: 0 },
    recordsDropped: zeroRecord<DtlsDropReason>([
      'malformed',
      'mac',
      'replay',
      'epoch',
      'version',
      'no_state',
      'fragmented_client_hello',
      'reassembly',
      'unexpected',
      'limit',
    ]),
    alertsSent: zeroRecord(Object.keys(AlertDescription) as AlertName[]),
    sessionsEnded: zeroRecord<DtlsSessionEndReason>([
      'close_notify',
      'idle',
      'replaced',
      'ended',
      'revoked',
      'fatal_alert',
      'server_close',
    ]),
    retransmissions: 0,
    applicationRecordsReceived: 0,
    applicationRecordsSent: 0,
    callbackErrors: 0,
    internalErrors: 0,
    sendErrors: 0,
  };
}

/** Alert names as stats keys, in the snake_case of RFC 5246 §7.2 for failures. */
const failureOfAlert: Partial<Record<AlertName, DtlsHandshakeFailure>> = {
  decryptError: 'decrypt_error',
  handshakeFailure: 'handshake_failure',
  protocolVersion: 'protocol_version',
  illegalParameter: 'illegal_parameter',
  decodeError: 'decode_error',
  unexpectedMessage: 'unexpected_message',
};

/**
 * An established session. Kept small on purpose (the target is under 2 KB of heap per idle session):
 * no closures, no timers, all key material in one Buffer, the replay window in three numbers.
 */
class Session implements ReplayWindow {
  /** client_write_key | server_write_key | client_write_IV | server_write_IV | our Finished verify_data. */
  readonly keys: Buffer;
  /** Next record sequence number in epoch 1 (ours). */
  writeSeq = 0;
  /** Replay window of the client's epoch 1 (RFC 6347 §4.1.2.6). */
  top: number;
  lo: number;
  hi: number;
  /** Server clock (ms since the server started) of the last authenticated record from the client. */
  lastRx: number;
  finalResends = 0;

  constructor(
    readonly pub: DtlsSession,
    keys: Buffer,
    window: ReplayWindow,
    now: number,
    /** Next record sequence number in epoch 0 (ours), for the ChangeCipherSpec of a resent final flight. */
    public epoch0Seq: number,
    /** message_seq of our Finished. */
    readonly finishedSeq: number,
    /** message_seq of the client's Finished: a retransmission of it means our final flight was lost. */
    readonly clientFinishedSeq: number,
  ) {
    this.keys = keys;
    this.top = window.top;
    this.lo = window.lo;
    this.hi = window.hi;
    this.lastRx = now;
  }
}

type HandshakeState = 'await_cke' | 'await_ccs' | 'await_finished';

/** A handshake in progress: exists only after a ClientHello with a valid cookie (RFC 6347 §4.2.1). */
class Handshake {
  state: HandshakeState = 'await_cke';
  readonly transcript: Hash = createHash('sha256');
  readonly window: ReplayWindow = newReplayWindow();
  /** Epoch 1 records that arrived before the ChangeCipherSpec (RFC 6347 §4.1: may be buffered). */
  early: DtlsRecord[] = [];
  /** Our current flight, one handshake message per record when sent. */
  flight: Buffer[] = [];
  retransmitDelay: number;
  retransmitAt: number;
  master?: Buffer;
  keys?: Buffer;
  expectedClientVerify?: Buffer;
  credential?: PskCredential;

  constructor(
    readonly key: string,
    readonly address: string,
    readonly port: number,
    readonly clientRandom: Buffer,
    readonly serverRandom: Buffer,
    readonly ems: boolean,
    readonly reassembler: Reassembler,
    /** message_seq of the client's ClientHello (its retransmission means our flight was lost). */
    readonly clientHelloSeq: number,
    /** Next message_seq of ours. */
    public nextSeq: number,
    /** Next record sequence number in epoch 0 (ours). */
    public epoch0Seq: number,
    readonly deadline: number,
    now: number,
    initialDelay: number,
  ) {
    this.retransmitDelay = initialDelay;
    this.retransmitAt = now + initialDelay;
  }
}

/** A DTLS 1.2 PSK server on one UDP socket. See the file header for the protocol it speaks. */
export class DtlsServer {
  onApplicationData: (session: DtlsSession, data: Buffer) => void = () => undefined;
  onSessionEnd: (session: DtlsSession, reason: DtlsSessionEndReason) => void = () => undefined;
  onSessionStart?: (session: DtlsSession) => void;
  readonly stats: DtlsStats = newStats();

  private readonly options: DtlsServerOptions;
  private readonly sessions = new Map<string, Session>();
  private readonly handshakes = new Map<string, Handshake>();
  /** Sessions plus handshakes per source IP address. */
  private readonly perAddress = new Map<string, number>();
  private readonly cookies: CookieJar;
  private readonly started = Date.now();
  private socket?: dgram.Socket;
  private timer?: NodeJS.Timeout;
  private nextIdleSweep = 0;
  private isBound = false;

  constructor(options: DtlsServerInit) {
    this.options = { ...defaultDtlsOptions, ...options };
    this.cookies = new CookieJar(this.options.cookieSecretRotationMs, this.now());
  }

  get bound(): boolean {
    return this.isBound;
  }

  address(): AddressInfo {
    if (this.socket === undefined) throw new Error('DTLS server is not listening');
    return this.socket.address();
  }

  snapshot(): { sessions: number; handshakes: number; addresses: number; reassemblyBytes: number } {
    let reassemblyBytes = 0;
    for (const hs of this.handshakes.values()) reassemblyBytes += hs.reassembler.bufferedBytes;
    return {
      sessions: this.sessions.size,
      handshakes: this.handshakes.size,
      addresses: this.perAddress.size,
      reassemblyBytes,
    };
  }

  /** Binds the one UDP socket of this server. Resolves once bound; rejects if the port cannot be bound. */
  listen(port: number, host = '0.0.0.0'): Promise<void> {
    if (this.socket !== undefined) return Promise.reject(new Error('DTLS server is already listening'));
    const socket = createUdpSocket(host, this.options.socketBufferBytes);
    this.socket = socket;
    socket.on('message', (msg, rinfo) => {
      // Nothing a peer sends may throw out of here (it would take the process down).
      try {
        this.onDatagram(msg, rinfo.address, rinfo.port);
      } catch (err) {
        this.stats.internalErrors++;
        this.options.logger.error('dtls: internal error on a datagram', { error: errorMessage(err) });
      }
    });
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => {
        this.socket = undefined;
        reject(err);
      };
      socket.once('error', onError);
      socket.bind(port, host, () => {
        socket.off('error', onError);
        socket.on('error', (err) => {
          this.stats.sendErrors++;
          this.options.logger.warn('dtls socket error', { error: err.message });
        });
        this.isBound = true;
        this.timer = setInterval(() => this.tick(), this.options.timerResolutionMs);
        this.timer.unref();
        this.options.logger.info('dtls listening', {
          address: socket.address().address,
          port: socket.address().port,
        });
        resolve();
      });
    });
  }

  /** Sends one application_data record; a no-op if the session has ended. */
  send(session: DtlsSession, data: Buffer): void {
    const s = this.sessions.get(session.key);
    if (s === undefined || s.pub !== session) return;
    if (data.length > MAX_PLAINTEXT_BYTES) throw new RangeError('DTLS record payload over 2^14 bytes');
    this.sendProtected(s, ContentType.applicationData, data);
    this.stats.applicationRecordsSent++;
  }

  /** Ends every session the predicate selects: close_notify to each, then onSessionEnd. Returns the count. */
  endSessions(predicate: (s: DtlsSession) => boolean, reason: DtlsSessionEndReason = 'ended'): number {
    let n = 0;
    for (const s of [...this.sessions.values()]) {
      if (!predicate(s.pub)) continue;
      this.endSession(s, reason, true);
      n++;
    }
    return n;
  }

  /** Sends close_notify to every session, ends them ('server_close'), abandons handshakes, closes the socket. */
  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    for (const s of [...this.sessions.values()]) this.endSession(s, 'server_close', true);
    for (const hs of [...this.handshakes.values()]) this.abandon(hs, 'server_close');
    const socket = this.socket;
    this.socket = undefined;
    this.isBound = false;
    if (socket) await new Promise<void>((resolve) => socket.close(() => resolve()));
  }

  // ---------------------------------------------------------------------------------------------
  // Receiving

  private onDatagram(msg: Buffer, address: string, port: number): void {
    this.stats.datagramsReceived++;
    // RFC 768: source port 0 means the sender expects no reply, and no DTLS peer can receive on it. Nothing
    // can be answered (dgram throws on a send to port 0), so such a datagram is dropped before any work.
    if (port === 0) return this.drop('malformed');
    const { records, malformed } = parseRecords(msg);
    if (malformed) this.drop('malformed');
    if (records.length === 0) return;
    const key = `dtls|${port}|${address}`;
    const datagram = { clientHellos: 0 };
    for (const rec of records) {
      this.stats.recordsReceived++;
      if (rec.epoch === 0) this.onEpoch0(key, address, port, rec, datagram);
      else if (rec.epoch === 1) this.onEpoch1(key, rec);
      // We never renegotiate, so no epoch above 1 exists (RFC 6347 §4.1: discard other epochs).
      else this.drop('epoch');
    }
  }

  private onEpoch0(
    key: string,
    address: string,
    port: number,
    rec: DtlsRecord,
    datagram: { clientHellos: number },
  ): void {
    const hs = this.handshakes.get(key);
    switch (rec.type) {
      case ContentType.handshake: {
        const frags = parseHandshakeFragments(rec.fragment);
        if (frags === undefined || frags.length === 0) return this.drop('malformed');
        const first = frags[0]!;
        if (first.msgType === HandshakeType.clientHello) {
          // A ClientHello travels alone (RFC 6347 §4.2.1 / §4.2.4: it is a flight of its own).
          if (frags.length !== 1) return this.drop('malformed');
          return this.onClientHello(key, address, port, rec, first, datagram);
        }
        if (rec.version !== DTLS_1_2) return this.drop('version');
        if (hs !== undefined) return this.feedHandshake(hs, frags, 0);
        // Epoch 0 handshake data for an established session is the client's retransmitted flight
        // (ClientKeyExchange); its Finished, which authenticates, is what triggers our resend.
        return this.drop(this.sessions.has(key) ? 'unexpected' : 'no_state');
      }
      case ContentType.changeCipherSpec:
        if (hs === undefined) return this.drop(this.sessions.has(key) ? 'unexpected' : 'no_state');
        return this.onChangeCipherSpec(hs, rec);
      case ContentType.alert:
        // An unauthenticated alert may only end a handshake, never an established session.
        if (hs === undefined) return this.drop(this.sessions.has(key) ? 'unexpected' : 'no_state');
        if (rec.fragment.length !== 2) return this.drop('malformed');
        return this.onHandshakeAlert(hs, rec.fragment);
      default:
        // Application data is never sent unprotected (RFC 5246 §7.4.9: only after Finished).
        return this.drop('epoch');
    }
  }

  private onEpoch1(key: string, rec: DtlsRecord): void {
    if (rec.version !== DTLS_1_2) return this.drop('version');
    const hs = this.handshakes.get(key);
    const s = this.sessions.get(key);
    // A new handshake from the address of a live session (RFC 6347 §4.2.8) shares epoch 1 with it: the
    // handshake takes its Finished, the old session keeps everything else until the handshake completes.
    if (
      hs !== undefined &&
      hs.state !== 'await_cke' &&
      (s === undefined || rec.type === ContentType.handshake)
    ) {
      return this.onHandshakeEpoch1(hs, rec);
    }
    if (s !== undefined) return this.onSessionRecord(s, rec);
    this.drop(hs !== undefined ? 'epoch' : 'no_state');
  }

  /**
   * RFC 6347 §4.2.1: without a valid cookie, answer HelloVerifyRequest and keep nothing; with one, start
   * a handshake. The cookie binds the source address, port and every ClientHello field but the cookie.
   */
  private onClientHello(
    key: string,
    address: string,
    port: number,
    rec: DtlsRecord,
    f: HandshakeFragment,
    datagram: { clientHellos: number },
  ): void {
    // The stateless exchange cannot reassemble; a fragmented ClientHello is dropped. A PSK ClientHello is
    // a few hundred bytes and fits any path MTU.
    if (f.fragmentOffset !== 0 || f.body.length !== f.length) return this.drop('fragmented_client_hello');
    const hello = parseClientHello(f.body);
    if (hello === undefined) return this.drop('malformed');
    // RFC 6347 §4.2.1: the answer to an unverified ClientHello must not amplify. A datagram may carry
    // several records (§4.1.1), but a client sends one ClientHello per flight, so only the first of a
    // datagram is answered; otherwise one spoofed datagram would draw hundreds of HelloVerifyRequests.
    if (datagram.clientHellos++ > 0) return this.drop('malformed');
    const hs = this.handshakes.get(key);
    if (hs !== undefined && hs.clientRandom.equals(hello.random)) {
      // The client retransmitted its ClientHello: our flight was lost (RFC 6347 §4.2.4).
      if (hs.state === 'await_cke' && f.messageSeq === hs.clientHelloSeq) this.resendFlight(hs);
      return;
    }
    if (hello.cookie.length === 0 || !this.cookies.verify(address, port, f.body, hello)) {
      if (hello.cookie.length > 0) this.stats.badCookies++;
      const cookie = this.cookies.make(address, port, f.body, hello);
      const hvr = encodeHandshake(HandshakeType.helloVerifyRequest, 0, helloVerifyRequestBody(cookie));
      // RFC 6347 §4.2.1: the HelloVerifyRequest reuses the ClientHello's record sequence number, and its
      // record version is DTLS 1.0 so that a client of either version accepts it.
      this.sendRaw(encodeRecord(ContentType.handshake, DTLS_1_0, 0, rec.seq, hvr), address, port);
      this.stats.cookiesSent++;
      return;
    }
    // Our epoch 0 record numbers continue from the ClientHello's (below); a client starts near 0, so a
    // number near 2^48 is bogus and would leave us no numbers to send with (RFC 6347 §4.1: never wrap).
    if (rec.seq > 2 ** 32) return this.drop('malformed');
    // Likewise message_seq (RFC 6347 §4.2.2, 16 bits, never wraps within a handshake): ServerHello takes the
    // ClientHello's number and ServerHelloDone and both Finished messages the next two, so a ClientHello
    // above 2^16 - 3 leaves the handshake no numbers to finish with.
    if (f.messageSeq > 0xffff - 2) return this.drop('malformed');
    const neg = negotiate(hello);
    if (!neg.ok) {
      // The address is proven by the cookie, so a fatal alert is worth sending (RFC 5246 §7.4.1.3 /
      // §7.2.2). It reuses the ClientHello's record sequence number as a HelloVerifyRequest would.
      this.sendAlertRaw(neg.alert, address, port, rec.seq);
      this.stats.handshakeFailures[failureOfAlert[neg.alert] ?? 'handshake_failure']++;
      this.options.logger.debug('dtls handshake refused', { peer: key, alert: neg.alert });
      return;
    }
    // Limits count peers (address:port) that hold a session or a handshake; a peer already known
    // replaces its own state and takes no new slot.
    const known = this.sessions.has(key) || hs !== undefined;
    if (hs === undefined && this.handshakes.size >= this.options.maxHandshakes) {
      this.stats.limitRejections.handshakes++;
      return this.drop('limit');
    }
    if (!known) {
      if (this.sessions.size + this.handshakes.size >= this.options.maxSessions) {
        this.stats.limitRejections.sessions++;
        return this.drop('limit');
      }
      if ((this.perAddress.get(address) ?? 0) >= this.options.maxSessionsPerAddress) {
        this.stats.limitRejections.sessionsPerAddress++;
        return this.drop('limit');
      }
    }
    const now = this.now();
    const serverRandom = randomBytes(32);
    // Our message_seq continues from the client's (RFC 6347 §4.2.2; a stateless server cannot know it
    // sent a HelloVerifyRequest, so it takes the ClientHello's): ServerHello = ClientHello's seq.
    const shSeq = f.messageSeq;
    const next = new Handshake(
      key,
      address,
      port,
      Buffer.from(hello.random),
      serverRandom,
      neg.extendedMasterSecret,
      new Reassembler(
        {
          maxMessageBytes: this.options.maxHandshakeMessageBytes,
          maxFragmentsPerMessage: this.options.maxFragmentsPerMessage,
          maxPendingBytes: this.options.maxPendingBytesPerPeer,
          maxMessagesAhead: 2,
        },
        f.messageSeq + 1,
      ),
      f.messageSeq,
      shSeq + 2,
      // Our epoch 0 record numbers start above the HelloVerifyRequest's (which reused an earlier
      // ClientHello's number), as RFC 6347 §4.2.1 intends.
      rec.seq,
      now + this.options.handshakeTimeoutMs,
      now,
      this.options.retransmitInitialMs,
    );
    // RFC 6347 §4.2.6: the transcript starts at the ClientHello that carried the cookie; the first
    // ClientHello and the HelloVerifyRequest are not part of it.
    next.transcript.update(encodeHandshake(HandshakeType.clientHello, f.messageSeq, f.body));
    const sh = encodeHandshake(
      HandshakeType.serverHello,
      shSeq,
      serverHelloBody(serverRandom, neg.extendedMasterSecret, neg.secureRenegotiation),
    );
    // No ServerKeyExchange: a psk_identity_hint is optional (RFC 4279 §2) and RFC 7925 §4.2 advises
    // against it.
    const shd = encodeHandshake(HandshakeType.serverHelloDone, shSeq + 1, Buffer.alloc(0));
    next.transcript.update(sh);
    next.transcript.update(shd);
    next.flight = [sh, shd];
    // The previous handshake of this peer goes only now, so that it keeps its address slot until its
    // successor holds it.
    if (hs !== undefined) this.abandon(hs, 'superseded', true);
    this.handshakes.set(key, next);
    if (!known) this.perAddress.set(address, (this.perAddress.get(address) ?? 0) + 1);
    this.stats.handshakesStarted++;
    this.sendFlight(next);
  }

  private feedHandshake(hs: Handshake, frags: HandshakeFragment[], epoch: number): void {
    for (const f of frags) {
      let r: ReassemblyResult = hs.reassembler.add(f, epoch);
      for (;;) {
        if (r.kind === 'rejected') {
          this.drop('reassembly');
          break;
        }
        if (r.kind !== 'message') break;
        if (!this.onHandshakeMessage(hs, r.msgType, r.messageSeq, r.epoch, r.body)) return;
        r = hs.reassembler.drain();
      }
    }
  }

  /** Processes one complete message in order. Returns false if the handshake ended. */
  private onHandshakeMessage(
    hs: Handshake,
    msgType: number,
    seq: number,
    epoch: number,
    body: Buffer,
  ): boolean {
    if (hs.state === 'await_cke' && msgType === HandshakeType.clientKeyExchange && epoch === 0) {
      return this.onClientKeyExchange(hs, seq, body);
    }
    if (hs.state === 'await_finished' && msgType === HandshakeType.finished && epoch === 1) {
      return this.onFinished(hs, seq, body);
    }
    // Anything else out of order is a protocol violation (RFC 5246 §7.4: "unexpected_message").
    this.fail(hs, 'unexpectedMessage');
    return false;
  }

  /**
   * RFC 4279 §2: the ClientKeyExchange names the PSK identity. An identity we do not know (or one that is
   * not a valid UTF-8 string of at most 128 bytes, RFC 4279 §5.1/§5.3) continues with a random key, so
   * that the Finished check fails exactly as it does for a wrong key: both end in decrypt_error (RFC 4279
   * §2 allows this instead of unknown_psk_identity) and a prober learns nothing.
   */
  private onClientKeyExchange(hs: Handshake, seq: number, body: Buffer): boolean {
    const identityBytes = parsePskClientKeyExchange(body);
    if (identityBytes === undefined) {
      this.fail(hs, 'decodeError');
      return false;
    }
    const identity = identityBytes.toString('utf8');
    let credential: PskCredential | undefined;
    if (identityBytes.length <= 128 && Buffer.from(identity, 'utf8').equals(identityBytes)) {
      try {
        credential = this.options.lookupPsk(identity);
      } catch (err) {
        this.stats.callbackErrors++;
        this.options.logger.error('dtls: lookupPsk threw', { error: errorMessage(err) });
      }
    }
    // The fake key has the length of a typical real one, so the PRF work below is the same.
    const psk = credential?.key ?? randomBytes(32);
    hs.credential = credential;
    hs.transcript.update(encodeHandshake(HandshakeType.clientKeyExchange, seq, body));
    // RFC 7627 §3: session_hash = Hash(handshake messages up to and including ClientKeyExchange). The
    // client's Finished (RFC 5246 §7.4.9) covers the same messages, so the one digest serves both.
    const transcriptHash = hs.transcript.copy().digest();
    const premaster = pskPremaster(psk);
    const master = hs.ems
      ? extendedMasterSecret(premaster, transcriptHash)
      : masterSecret(premaster, hs.clientRandom, hs.serverRandom);
    premaster.fill(0);
    hs.master = master;
    hs.keys = keyBlock(master, hs.clientRandom, hs.serverRandom);
    hs.expectedClientVerify = finishedVerifyData(master, 'client', transcriptHash);
    hs.state = 'await_ccs';
    return true;
  }

  /** RFC 5246 §7.1: ChangeCipherSpec is the single byte 1; after it the client writes epoch 1. */
  private onChangeCipherSpec(hs: Handshake, rec: DtlsRecord): void {
    if (rec.fragment.length !== 1 || rec.fragment[0] !== 1) return this.drop('malformed');
    // Before ClientKeyExchange (it was lost or is late) the CCS cannot be used: drop it, the client
    // retransmits its whole flight (RFC 6347 §4.2.4). Once past it, a second CCS is a duplicate.
    if (hs.state !== 'await_ccs') return this.drop('unexpected');
    hs.state = 'await_finished';
    const early = hs.early;
    hs.early = [];
    for (const r of early) {
      if (this.handshakes.get(hs.key) !== hs) return;
      this.onHandshakeEpoch1(hs, r);
    }
  }

  private onHandshakeEpoch1(hs: Handshake, rec: DtlsRecord): void {
    if (hs.state === 'await_ccs') {
      // These records are not authenticated yet: keep copies (a subarray would pin the whole datagram, up
      // to 64 KB) and only within the peer's reassembly budget (RFC 6347 §4.2.3 bounds left to us). What
      // legitimately arrives early is the client's Finished, a record of 40 bytes.
      const held = hs.early.reduce((bytes, r) => bytes + r.fragment.length, 0);
      if (
        hs.early.length >= 4 ||
        held + hs.reassembler.bufferedBytes + rec.fragment.length > this.options.maxPendingBytesPerPeer
      ) {
        return this.drop('epoch');
      }
      // Buffer.alloc, not Buffer.from: a small Buffer.from comes out of node's shared 8 KB pool and pins it.
      const fragment = Buffer.alloc(rec.fragment.length);
      rec.fragment.copy(fragment);
      hs.early.push({ ...rec, fragment });
      return;
    }
    const keys = hs.keys!;
    if (!replayCheck(hs.window, rec.seq)) return this.drop('replay');
    const plaintext = this.open(keys, rec);
    if (plaintext === undefined) {
      if (rec.type === ContentType.handshake) {
        // The client's Finished did not authenticate: with a wrong or unknown PSK its keys differ from
        // ours, so this is how both show. RFC 4279 §2 names decrypt_error for "the key was incorrect"
        // and RFC 5246 §7.2.2 for a Finished that cannot be verified; we follow them here rather than
        // RFC 6347 §4.1.2.7 (drop, or bad_record_mac), which is about records of an established
        // connection. Cost: an attacker who can spoof this client's address and port during the
        // handshake can end it, which an on-path attacker can do anyway by dropping datagrams.
        // The alert goes in epoch 0: we have not sent our ChangeCipherSpec.
        this.fail(hs, 'decryptError');
        return;
      }
      return this.drop('mac');
    }
    replayAccept(hs.window, rec.seq);
    switch (rec.type) {
      case ContentType.handshake: {
        const frags = parseHandshakeFragments(plaintext);
        if (frags === undefined || frags.length === 0) {
          this.fail(hs, 'decodeError');
          return;
        }
        return this.feedHandshake(hs, frags, 1);
      }
      case ContentType.alert:
        if (plaintext.length !== 2) return this.drop('malformed');
        return this.onHandshakeAlert(hs, plaintext);
      default:
        return this.drop('unexpected');
    }
  }

  /** RFC 5246 §7.4.9: check the client's Finished, answer ChangeCipherSpec + Finished, and go live. */
  private onFinished(hs: Handshake, seq: number, body: Buffer): boolean {
    const expected = hs.expectedClientVerify!;
    if (
      body.length !== VERIFY_DATA_BYTES ||
      !timingSafeEqual(body, expected) ||
      // An unknown identity cannot get here (its random key cannot produce this Finished); belt and braces.
      hs.credential === undefined
    ) {
      this.fail(hs, 'decryptError');
      return false;
    }
    const credential = hs.credential;
    hs.transcript.update(encodeHandshake(HandshakeType.finished, seq, body));
    const serverVerify = finishedVerifyData(hs.master!, 'server', hs.transcript.digest());
    hs.master!.fill(0);
    const keys = Buffer.alloc(KeyBlock.length + VERIFY_DATA_BYTES);
    hs.keys!.copy(keys, 0);
    serverVerify.copy(keys, KeyBlock.length);
    hs.keys!.fill(0);
    this.handshakes.delete(hs.key);
    const old = this.sessions.get(hs.key);
    const pub: DtlsSession = Object.freeze({
      key: hs.key,
      address: hs.address,
      port: hs.port,
      identity: credential.identity,
      deviceId: credential.deviceId,
      credentialId: credential.credentialId,
    });
    const session = new Session(pub, keys, hs.window, this.now(), hs.epoch0Seq, hs.nextSeq, seq);
    if (old !== undefined) {
      // RFC 6347 §4.2.8: the new handshake completed, so the old association goes. The client has
      // already dropped its old state, so no close_notify is sent under the old keys. The address count
      // was taken by the handshake and carries over to the new session.
      this.sessions.delete(hs.key);
      old.keys.fill(0);
      this.notifyEnd(old, 'replaced');
    }
    this.sessions.set(hs.key, session);
    this.stats.handshakesCompleted++;
    this.sendFinalFlight(session);
    this.options.logger.debug('dtls session established', { peer: hs.key, identity: credential.identity });
    if (this.onSessionStart) {
      try {
        this.onSessionStart(pub);
      } catch (err) {
        this.stats.callbackErrors++;
        this.options.logger.error('dtls: onSessionStart threw', { error: errorMessage(err) });
      }
    }
    return false;
  }

  /** An alert from the peer during the handshake ends it (RFC 5246 §7.2: close_notify or fatal). */
  private onHandshakeAlert(hs: Handshake, alert: Buffer): void {
    const level = alert[0];
    const description = alert[1];
    if (level === AlertLevel.fatal || description === AlertDescription.closeNotify) {
      this.abandon(hs, 'peer_alert');
    }
  }

  private onSessionRecord(s: Session, rec: DtlsRecord): void {
    // RFC 6347 §4.1.2.6: check the window first, authenticate, then update the window.
    if (!replayCheck(s, rec.seq)) return this.drop('replay');
    const plaintext = this.open(s.keys, rec);
    if (plaintext === undefined) return this.drop('mac'); // silently (RFC 6347 §4.1.2.7)
    // RFC 5246 §6.2.1: a record never carries more than 2^14 bytes; an authentic one that does is invalid,
    // and RFC 6347 §4.1.2.7 lets DTLS discard invalid records silently instead of ending the session.
    if (plaintext.length > MAX_PLAINTEXT_BYTES) return this.drop('malformed');
    replayAccept(s, rec.seq);
    s.lastRx = this.now();
    switch (rec.type) {
      case ContentType.applicationData:
        this.stats.applicationRecordsReceived++;
        try {
          this.onApplicationData(s.pub, plaintext);
        } catch (err) {
          this.stats.callbackErrors++;
          this.options.logger.error('dtls: onApplicationData threw', { error: errorMessage(err) });
        }
        return;
      case ContentType.alert: {
        if (plaintext.length !== 2) return this.drop('malformed');
        const [level, description] = [plaintext[0], plaintext[1]];
        // RFC 5246 §7.2.1: answer close_notify with close_notify and end the session.
        if (description === AlertDescription.closeNotify) return this.endSession(s, 'close_notify', true);
        // RFC 5246 §7.2.2: after a fatal alert the connection is over; no answer.
        if (level === AlertLevel.fatal) return this.endSession(s, 'fatal_alert', false);
        return; // other warnings change nothing
      }
      case ContentType.handshake: {
        const frags = parseHandshakeFragments(plaintext);
        if (frags === undefined || frags.length === 0) return this.drop('malformed');
        const f = frags[0]!;
        if (f.msgType === HandshakeType.clientHello) {
          // RFC 5746 §4.4 / RFC 5246 §7.2.2: we never renegotiate; a warning no_renegotiation says so.
          this.sendProtected(
            s,
            ContentType.alert,
            Buffer.from([AlertLevel.warning, AlertDescription.noRenegotiation]),
          );
          this.stats.alertsSent.noRenegotiation++;
          return;
        }
        if (f.msgType === HandshakeType.finished && f.messageSeq === s.clientFinishedSeq) {
          // The client retransmitted its final flight: ours was lost (RFC 6347 §4.2.4). Bounded.
          if (s.finalResends < this.options.maxFinalFlightResends) {
            s.finalResends++;
            this.stats.retransmissions++;
            this.sendFinalFlight(s);
          }
          return;
        }
        return this.drop('unexpected');
      }
      default:
        return this.drop('unexpected');
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Sending

  private open(keys: Buffer, rec: DtlsRecord): Buffer | undefined {
    return openCcm8(
      keys.subarray(KeyBlock.clientWriteKey, KeyBlock.clientWriteKey + 16),
      keys.subarray(KeyBlock.clientWriteIv, KeyBlock.clientWriteIv + 4),
      rec.epoch,
      rec.seq,
      rec.type,
      rec.version,
      rec.fragment,
    );
  }

  private seal(s: Session, type: number, plaintext: Buffer): Buffer | undefined {
    if (s.writeSeq >= MAX_SEQ) return undefined; // RFC 6347 §4.1: never wrap; practically unreachable
    const seq = s.writeSeq++;
    const fragment = sealCcm8(
      s.keys.subarray(KeyBlock.serverWriteKey, KeyBlock.serverWriteKey + 16),
      s.keys.subarray(KeyBlock.serverWriteIv, KeyBlock.serverWriteIv + 4),
      1,
      seq,
      type,
      DTLS_1_2,
      plaintext,
    );
    return encodeRecord(type, DTLS_1_2, 1, seq, fragment);
  }

  private sendProtected(s: Session, type: number, plaintext: Buffer): void {
    const record = this.seal(s, type, plaintext);
    if (record !== undefined) this.sendRaw(record, s.pub.address, s.pub.port);
    // RFC 6347 §4.1: abandon the association rather than wrap the sequence number (2^48 records).
    else this.endSession(s, 'ended', false);
  }

  /**
   * ServerHello and ServerHelloDone, each in its own record (several messages in one record are legal,
   * RFC 6347 §4.2.3, but small stacks such as node-dtls-client read one message per record), both in
   * one datagram. A resend gets new record sequence numbers (RFC 6347 §4.2.4 / §4.1.2.6).
   */
  private sendFlight(hs: Handshake): void {
    const records = hs.flight.map((m) => encodeRecord(ContentType.handshake, DTLS_1_2, 0, hs.epoch0Seq++, m));
    this.sendRaw(Buffer.concat(records), hs.address, hs.port);
  }

  private resendFlight(hs: Handshake): void {
    this.stats.retransmissions++;
    this.sendFlight(hs);
  }

  /** ChangeCipherSpec (epoch 0) and our Finished (epoch 1, freshly sealed) in one datagram. */
  private sendFinalFlight(s: Session): void {
    const ccs = encodeRecord(ContentType.changeCipherSpec, DTLS_1_2, 0, s.epoch0Seq++, Buffer.from([1]));
    const finished = this.seal(
      s,
      ContentType.handshake,
      encodeHandshake(HandshakeType.finished, s.finishedSeq, s.keys.subarray(KeyBlock.length)),
    );
    if (finished === undefined) return;
    this.sendRaw(Buffer.concat([ccs, finished]), s.pub.address, s.pub.port);
  }

  /** An unprotected fatal alert (epoch 0). */
  private sendAlertRaw(name: AlertName, address: string, port: number, seq: number): void {
    const alert = Buffer.from([AlertLevel.fatal, AlertDescription[name]]);
    this.sendRaw(encodeRecord(ContentType.alert, DTLS_1_2, 0, seq, alert), address, port);
    this.stats.alertsSent[name]++;
  }

  private sendRaw(datagram: Buffer, address: string, port: number): void {
    const socket = this.socket;
    if (socket === undefined) return;
    socket.send(datagram, port, address, (err) => {
      if (err) this.stats.sendErrors++;
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Ending

  /** Ends a handshake with a fatal alert in epoch 0 (we have not changed our write state yet). */
  private fail(hs: Handshake, alert: AlertName): void {
    if (this.handshakes.get(hs.key) !== hs) return;
    this.sendAlertRaw(alert, hs.address, hs.port, hs.epoch0Seq++);
    this.abandon(hs, failureOfAlert[alert] ?? 'handshake_failure');
  }

  /** Drops a handshake; `keepSlot` when a new handshake of the same peer takes its place at once. */
  private abandon(hs: Handshake, reason: DtlsHandshakeFailure, keepSlot = false): void {
    if (this.handshakes.get(hs.key) !== hs) return;
    this.handshakes.delete(hs.key);
    hs.master?.fill(0);
    hs.keys?.fill(0);
    // A handshake beside a live session of the same peer shares that session's address slot.
    if (!keepSlot && !this.sessions.has(hs.key)) this.releaseAddress(hs.address);
    this.stats.handshakeFailures[reason]++;
    this.options.logger.debug('dtls handshake ended', { peer: hs.key, reason });
  }

  private endSession(s: Session, reason: DtlsSessionEndReason, sendCloseNotify: boolean): void {
    if (this.sessions.get(s.pub.key) !== s) return;
    // Out of the map first: a close_notify that cannot be sealed must not end the session twice.
    this.sessions.delete(s.pub.key);
    if (sendCloseNotify) {
      const record = this.seal(
        s,
        ContentType.alert,
        Buffer.from([AlertLevel.warning, AlertDescription.closeNotify]),
      );
      if (record !== undefined) {
        this.sendRaw(record, s.pub.address, s.pub.port);
        this.stats.alertsSent.closeNotify++;
      }
    }
    // A handshake in progress from the same address:port keeps the address slot.
    if (!this.handshakes.has(s.pub.key)) this.releaseAddress(s.pub.address);
    s.keys.fill(0);
    this.notifyEnd(s, reason);
  }

  private notifyEnd(s: Session, reason: DtlsSessionEndReason): void {
    this.stats.sessionsEnded[reason]++;
    try {
      this.onSessionEnd(s.pub, reason);
    } catch (err) {
      this.stats.callbackErrors++;
      this.options.logger.error('dtls: onSessionEnd threw', { error: errorMessage(err) });
    }
  }

  private releaseAddress(address: string): void {
    const n = (this.perAddress.get(address) ?? 1) - 1;
    if (n <= 0) this.perAddress.delete(address);
    else this.perAddress.set(address, n);
  }

  private drop(reason: DtlsDropReason): void {
    this.stats.recordsDropped[reason]++;
  }

  // ---------------------------------------------------------------------------------------------
  // Time: one interval timer for every handshake and session (no per-session timers).

  /** Milliseconds since the server was made: small integers, so V8 keeps them unboxed. */
  private now(): number {
    return Date.now() - this.started;
  }

  private tick(): void {
    try {
      const now = this.now();
      this.cookies.maybeRotate(now);
      for (const hs of [...this.handshakes.values()]) {
        if (now >= hs.deadline) {
          this.abandon(hs, 'timeout');
          continue;
        }
        if (now >= hs.retransmitAt) {
          // RFC 6347 §4.2.4.1: double the timer on each retransmission, up to a bound.
          hs.retransmitDelay = Math.min(hs.retransmitDelay * 2, this.options.retransmitMaxMs);
          hs.retransmitAt = now + hs.retransmitDelay;
          this.resendFlight(hs);
        }
      }
      if (now >= this.nextIdleSweep) {
        this.nextIdleSweep = now + this.options.idleSweepIntervalMs;
        const cutoff = now - this.options.idleTimeoutMs;
        // Deleting the current entry while iterating a Map is well defined (ECMA-262 Map.prototype.forEach).
        for (const s of this.sessions.values()) {
          if (s.lastRx < cutoff) this.endSession(s, 'idle', true);
        }
      }
    } catch (err) {
      this.stats.internalErrors++;
      this.options.logger.error('dtls: internal error in the timer', { error: errorMessage(err) });
    }
  }
}
