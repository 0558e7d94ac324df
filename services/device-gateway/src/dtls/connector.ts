// A DTLS 1.2 server (RFC 6347) for pre-shared keys (RFC 4279 §2) with the single cipher suite
// TLS_PSK_WITH_AES_128_CCM_8 (RFC 6655, the RFC 7925 / RFC 7252 §9.1.3.1 profile), the extended master
// secret (RFC 7627) when offered, and no renegotiation (RFC 5746) and no compression.
//
// The connector owns the UDP socket and sends each record where it belongs, by peer (address and port) and
// epoch (RFC 6347 §4.1): epoch 0 to the stateless cookie exchange (RFC 6347 §4.2.1, here) or to the peer's
// handshake in progress (server-handshaker.ts), epoch 1 to the handshake (its Finished) or to the established
// session (record-layer.ts protects it). The connection store holds sessions and handshakes with their limits;
// one interval timer drives retransmissions (flight.ts), deadlines, idle sessions and the cookie secret.
import { errorMessage } from '@platform/service-kit';
import type dgram from 'node:dgram';
import type { AddressInfo } from 'node:net';
import { bindUdpSocket, createUdpSocket } from '../net/udp-socket.js';
import {
  AlertDescription,
  AlertLevel,
  ContentType,
  DTLS_1_0,
  DTLS_1_2,
  HandshakeType,
  MAX_PLAINTEXT_BYTES,
  RECORD_HEADER_BYTES,
} from './constants.js';
import type { AlertName } from './constants.js';
import { ConnectionStore } from './connection-store.js';
import type { Evictor } from './connection-store.js';
import {
  CookieJar,
  encodeHandshake,
  helloVerifyRequestBody,
  negotiate,
  parseClientHello,
  parseHandshakeFragments,
} from './handshake.js';
import type { HandshakeFragment } from './handshake.js';
import { defaultDtlsOptions } from './options.js';
import type { DtlsServerInit, DtlsServerOptions, PskCredential } from './options.js';
import { encodeRecord, readRecord } from './record.js';
import type { DtlsRecord } from './record.js';
import { ServerHandshake } from './server-handshaker.js';
import type { HandshakeHost } from './server-handshaker.js';
import { Session } from './session.js';
import type { DtlsSession, DtlsSessionView } from './session.js';
import { failureOfAlert, newStats } from './stats.js';
import type { DtlsDropReason, DtlsHandshakeFailure, DtlsSessionEndReason, DtlsStats } from './stats.js';

/** A DTLS 1.2 PSK server on one UDP socket. See the file header for how it is put together. */
export class DtlsServer implements HandshakeHost, Evictor {
  onApplicationData: (session: DtlsSession, data: Buffer) => void = () => undefined;
  onSessionEnd: (session: DtlsSession, reason: DtlsSessionEndReason) => void = () => undefined;
  onSessionStart?: (session: DtlsSession) => void;
  readonly stats: DtlsStats = newStats();
  readonly options: DtlsServerOptions;

  private readonly store: ConnectionStore;
  private readonly cookies: CookieJar;
  private readonly started = Date.now();
  private socket?: dgram.Socket;
  private timer?: NodeJS.Timeout;
  private nextIdleSweep = 0;
  /** Where the periodic credential check goes on at the next tick (it checks a share of sessions per tick). */
  private credentialCursor?: Iterator<Session>;
  private isBound = false;
  datagramNumber = 0;
  /** ClientHellos seen so far in the datagram being read (onDatagram resets it; see onClientHello). */
  private clientHellosInDatagram = 0;

  constructor(options: DtlsServerInit) {
    this.options = { ...defaultDtlsOptions, ...options };
    this.store = new ConnectionStore(this.options, this);
    this.cookies = new CookieJar(
      this.options.cookieSecretRotationMs,
      this.now(),
      this.options.cookieLifetimeMs,
    );
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
    for (const hs of this.store.handshakes.values()) reassemblyBytes += hs.reassemblyBytes;
    return {
      sessions: this.store.sessions.size,
      handshakes: this.store.handshakes.size,
      addresses: this.store.addresses,
      reassemblyBytes,
    };
  }

  /**
   * The established sessions of one device, oldest first, for an operator's view: identity, peer and times,
   * never key material. An index lookup (connection-store.ts), not a scan of the table.
   */
  sessionsOf(deviceId: string): DtlsSessionView[] {
    const views: DtlsSessionView[] = [];
    for (const s of this.store.sessionsOfDevice(deviceId)) {
      views.push({
        identity: s.pub.identity,
        address: s.pub.address,
        port: s.pub.port,
        establishedAt: new Date(this.started + s.establishedAtS * 1000).toISOString(),
        lastRecordAt: new Date(this.started + s.lastRx).toISOString(),
      });
    }
    return views;
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
    return bindUdpSocket(socket, port, host, (err) => {
      this.stats.sendErrors++;
      this.options.logger.warn('dtls socket error', { error: err.message });
    }).then(
      () => {
        this.isBound = true;
        this.timer = setInterval(() => this.tick(), this.options.timerResolutionMs);
        this.timer.unref();
        this.options.logger.info('dtls listening', {
          address: socket.address().address,
          port: socket.address().port,
        });
      },
      (err: unknown) => {
        this.socket = undefined;
        throw err;
      },
    );
  }

  /** Sends one application_data record; a no-op if the session has ended. */
  send(session: DtlsSession, data: Buffer): void {
    const s = this.store.sessions.get(session.key);
    if (s === undefined || s.pub !== session) return;
    if (data.length > MAX_PLAINTEXT_BYTES) throw new RangeError('DTLS record payload over 2^14 bytes');
    this.sendProtected(s, ContentType.applicationData, data);
    this.stats.applicationRecordsSent++;
  }

  /** Ends every session the predicate selects: close_notify to each, then onSessionEnd. Returns the count. */
  endSessions(predicate: (s: DtlsSession) => boolean, reason: DtlsSessionEndReason = 'ended'): number {
    let n = 0;
    for (const s of [...this.store.sessions.values()]) {
      if (!predicate(s.pub)) continue;
      this.endSession(s, reason, true);
      n++;
    }
    return n;
  }

  /**
   * Checks every session and handshake in progress against lookupPsk, which must still return the same
   * credential: those whose credential was revoked, deleted, changed or expired end ('revoked', with
   * close_notify; handshakes 'credential_invalid'). The timer does the same every credentialCheckIntervalMs,
   * a share per tick; call this after an event that invalidated credentials. Returns how many ended.
   */
  revalidate(): number {
    let n = 0;
    for (const s of [...this.store.sessions.values()]) if (this.checkSession(s)) n++;
    for (const hs of [...this.store.handshakes.values()]) {
      const valid = (c: PskCredential): boolean =>
        this.lookupPsk(c.identity)?.credentialId === c.credentialId;
      if (hs.keepCredentials(valid)) continue;
      this.abandon(hs, 'credential_invalid');
      n++;
    }
    return n;
  }

  /** Ends the sessions and handshakes in progress of these credentials (revoked, deleted, changed, expired). */
  invalidateCredentials(credentialIds: Iterable<string>): number {
    const ids = new Set(credentialIds);
    let n = this.endSessions((s) => ids.has(s.credentialId), 'revoked');
    for (const hs of [...this.store.handshakes.values()]) {
      if (hs.keepCredentials((c) => !ids.has(c.credentialId))) continue;
      this.abandon(hs, 'credential_invalid');
      n++;
    }
    return n;
  }

  /** Sends close_notify to every session, ends them ('server_close'), abandons handshakes, closes the socket. */
  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    for (const s of [...this.store.sessions.values()]) this.endSession(s, 'server_close', true);
    for (const hs of [...this.store.handshakes.values()]) this.abandon(hs, 'server_close');
    const socket = this.socket;
    this.socket = undefined;
    this.isBound = false;
    if (socket) await new Promise<void>((resolve) => socket.close(() => resolve()));
  }

  /** The handshakes in progress, by peer (tests look inside; nothing else should). */
  private get handshakes(): ReadonlyMap<string, ServerHandshake> {
    return this.store.handshakes;
  }

  // ---------------------------------------------------------------------------------------------
  // Receiving: demultiplexing by peer and epoch (RFC 6347 §4.1)

  private onDatagram(msg: Buffer, address: string, port: number): void {
    this.stats.datagramsReceived++;
    this.datagramNumber++;
    // RFC 768: source port 0 means the sender expects no reply, and no DTLS peer can receive on it. Nothing
    // can be answered (dgram throws on a send to port 0), so such a datagram is dropped before any work.
    if (port === 0) return this.drop('malformed');
    // Record by record, with no array per datagram; the peer's key is built once, at the first valid record.
    let key: string | undefined;
    let offset = 0;
    while (offset < msg.length) {
      const rec = readRecord(msg, offset);
      // RFC 6347 §4.1.2.7: what cannot be framed is discarded silently; the records before it stand.
      if (rec === undefined) return this.drop('malformed');
      offset += RECORD_HEADER_BYTES + rec.fragment.length;
      if (key === undefined) {
        key = `dtls|${port}|${address}`;
        this.clientHellosInDatagram = 0;
      }
      this.stats.recordsReceived++;
      if (rec.epoch === 0) this.onEpoch0(key, address, port, rec);
      else if (rec.epoch === 1) this.onEpoch1(key, rec);
      // We never renegotiate, so no epoch above 1 exists (RFC 6347 §4.1: discard other epochs).
      else this.drop('epoch');
    }
  }

  private onEpoch0(key: string, address: string, port: number, rec: DtlsRecord): void {
    const hs = this.store.handshakes.get(key);
    switch (rec.type) {
      case ContentType.handshake: {
        const frags = parseHandshakeFragments(rec.fragment);
        if (frags === undefined || frags.length === 0) return this.drop('malformed');
        const first = frags[0]!;
        if (first.msgType === HandshakeType.clientHello) {
          // A ClientHello travels alone (RFC 6347 §4.2.1 / §4.2.4: it is a flight of its own).
          if (frags.length !== 1) return this.drop('malformed');
          return this.onClientHello(key, address, port, rec, first);
        }
        if (rec.version !== DTLS_1_2) return this.drop('version');
        if (hs !== undefined) return hs.onEpoch0Fragments(frags);
        // Epoch 0 handshake data for an established session is the client's retransmitted flight
        // (ClientKeyExchange); its Finished, which authenticates, is what triggers our resend.
        return this.drop(this.store.sessions.has(key) ? 'unexpected' : 'no_state');
      }
      case ContentType.changeCipherSpec:
        if (hs === undefined) return this.drop(this.store.sessions.has(key) ? 'unexpected' : 'no_state');
        return hs.onChangeCipherSpec(rec);
      case ContentType.alert:
        // An unauthenticated alert ends nothing: anyone who can put this peer's address on a datagram could
        // forge it (RFC 6347 §4.1.2.7). A handshake it was meant for ends at its deadline.
        return this.drop(hs !== undefined || this.store.sessions.has(key) ? 'unexpected' : 'no_state');
      default:
        // Application data is never sent unprotected (RFC 5246 §7.4.9: only after Finished).
        return this.drop('epoch');
    }
  }

  private onEpoch1(key: string, rec: DtlsRecord): void {
    if (rec.version !== DTLS_1_2) return this.drop('version');
    // Most epoch 1 records are an established session's, while no handshake is in progress: no lookup then.
    const handshakes = this.store.handshakes;
    const hs = handshakes.size === 0 ? undefined : handshakes.get(key);
    const s = this.store.sessions.get(key);
    // A new handshake from the address of a live session (RFC 6347 §4.2.8) shares epoch 1 with it: the
    // handshake takes its Finished, the old session keeps everything else until the handshake completes.
    if (
      hs !== undefined &&
      hs.state !== 'await_cke' &&
      (s === undefined || rec.type === ContentType.handshake)
    ) {
      return hs.onEpoch1(rec);
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
  ): void {
    // The stateless exchange cannot reassemble; a fragmented ClientHello is dropped. A PSK ClientHello is
    // a few hundred bytes and fits any path MTU.
    if (f.fragmentOffset !== 0 || f.body.length !== f.length) return this.drop('fragmented_client_hello');
    // No larger than any handshake message we reassemble: a handshake keeps its ClientHello (transcript,
    // retransmission check) for as long as it lives, and a record alone would allow about 18 KB.
    if (f.length > this.options.maxHandshakeMessageBytes) return this.drop('limit');
    const hello = parseClientHello(f.body);
    if (hello === undefined) return this.drop('malformed');
    // RFC 6347 §4.2.1: the answer to an unverified ClientHello must not amplify. A datagram may carry
    // several records (§4.1.1), but a client sends one ClientHello per flight, so only the first of a
    // datagram is answered; otherwise one spoofed datagram would draw hundreds of HelloVerifyRequests.
    if (this.clientHellosInDatagram++ > 0) return this.drop('malformed');
    const hs = this.store.handshakes.get(key);
    if (hs !== undefined && hs.clientRandom.equals(hello.random)) {
      // The client retransmitted its ClientHello: our flight was lost (RFC 6347 §4.2.4). Only the very same
      // ClientHello, and at most once per half initial timeout: this runs before any cookie check, and an
      // on-path copy of the random must not turn the server into a reflector towards the client.
      if (
        hs.state === 'await_cke' &&
        f.messageSeq === hs.clientHelloSeq &&
        hs.clientHelloBody.equals(f.body) &&
        hs.flight.mayResend(this.now(), this.options.retransmitInitialMs / 2)
      )
        this.resendFlight(hs);
      return;
    }
    // The ClientHello that made this peer's live session, again: a client starting a new handshake makes a
    // new random (RFC 5246 §7.4.1.2), so this is a replay, possibly meant to replace the session with one of
    // the replayer's (RFC 6347 §4.2.8). Ignored.
    if (this.store.sessions.get(key)?.isClientRandom(hello.random) === true) return this.drop('replay');
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
    // Our epoch 0 record numbers continue from the ClientHello's; a client starts near 0, so a number near
    // 2^48 is bogus and would leave us no numbers to send with (RFC 6347 §4.1: never wrap).
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
    const refusal = this.store.admitHandshake(key, address);
    if (refusal !== undefined) {
      this.stats.limitRejections[refusal]++;
      return this.drop('limit');
    }
    const next = new ServerHandshake(
      this,
      key,
      address,
      port,
      f,
      rec.seq,
      neg.extendedMasterSecret,
      neg.secureRenegotiation,
      this.now(),
    );
    // The previous handshake of this peer is replaced only now, so that it keeps the peer's slot until its
    // successor holds it.
    const previous = this.store.addHandshake(next);
    if (previous !== undefined) this.discard(previous, 'superseded');
    this.stats.handshakesStarted++;
    this.sendRaw(next.flight.datagram(next), address, port);
  }

  private onSessionRecord(s: Session, rec: DtlsRecord): void {
    const plaintext = s.state.open(rec);
    if (typeof plaintext === 'string') return this.drop(plaintext); // silently (RFC 6347 §4.1.2.7)
    // RFC 5246 §6.2.1: a record never carries more than 2^14 bytes; an authentic one that does is invalid,
    // and RFC 6347 §4.1.2.7 lets DTLS discard invalid records silently instead of ending the session.
    if (plaintext.length > MAX_PLAINTEXT_BYTES) return this.drop('malformed');
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
  // The handshake's host (server-handshaker.ts)

  lookupPsk(identity: string): PskCredential | undefined {
    try {
      return this.options.lookupPsk(identity);
    } catch (err) {
      this.stats.callbackErrors++;
      this.options.logger.error('dtls: lookupPsk threw', { error: errorMessage(err) });
      return undefined;
    }
  }

  isCurrent(hs: ServerHandshake): boolean {
    return this.store.handshakes.get(hs.key) === hs;
  }

  /** Ends a handshake with a fatal alert in epoch 0 (we have not changed our write state yet). */
  fail(hs: ServerHandshake, alert: AlertName, reason?: DtlsHandshakeFailure): void {
    if (!this.isCurrent(hs)) return;
    this.sendAlertRaw(alert, hs.address, hs.port, hs.epoch0Seq++);
    this.abandon(hs, reason ?? failureOfAlert[alert] ?? 'handshake_failure');
  }

  abandon(hs: ServerHandshake, reason: DtlsHandshakeFailure): void {
    if (this.store.deleteHandshake(hs)) this.discard(hs, reason);
  }

  drop(reason: DtlsDropReason): void {
    this.stats.recordsDropped[reason]++;
  }

  establish(
    hs: ServerHandshake,
    credential: PskCredential,
    serverVerify: Buffer,
    clientFinishedSeq: number,
  ): void {
    const pub: DtlsSession = Object.freeze({
      key: hs.key,
      address: hs.address,
      port: hs.port,
      identity: credential.identity,
      deviceId: credential.deviceId,
      credentialId: credential.credentialId,
    });
    const session = new Session(
      pub,
      hs.takeConnection(),
      serverVerify,
      hs.clientRandom,
      this.now(),
      hs.epoch0Seq,
      hs.nextSeq,
      clientFinishedSeq,
    );
    hs.wipe();
    const old = this.store.establish(hs, session);
    if (old !== undefined) {
      // RFC 6347 §4.2.8: the new handshake completed, so the old association goes. The client has
      // already dropped its old state, so no close_notify is sent under the old keys. The address count
      // was taken by the handshake and carries over to the new session.
      old.wipe();
      this.notifyEnd(old, 'replaced');
    }
    this.stats.handshakesCompleted++;
    this.sendFinalFlight(session);
    // Until its first record the session is as quiet as an idle one: it need not hold key objects meanwhile.
    session.state.release();
    this.options.logger.debug('dtls session established', { peer: hs.key, identity: credential.identity });
    if (this.onSessionStart) {
      try {
        this.onSessionStart(pub);
      } catch (err) {
        this.stats.callbackErrors++;
        this.options.logger.error('dtls: onSessionStart threw', { error: errorMessage(err) });
      }
    }
  }

  // The connection store's evictions (connection-store.ts)

  evictHandshake(hs: ServerHandshake): void {
    this.abandon(hs, 'evicted');
  }

  evictSession(s: Session): void {
    this.endSession(s, 'evicted', true);
  }

  // ---------------------------------------------------------------------------------------------
  // Sending

  private sendProtected(s: Session, type: number, plaintext: Buffer): void {
    const record = s.state.seal(type, plaintext);
    if (record !== undefined) this.sendRaw(record, s.pub.address, s.pub.port);
    // RFC 6347 §4.1: abandon the association rather than wrap the sequence number (2^48 records).
    else this.endSession(s, 'ended', false);
  }

  private resendFlight(hs: ServerHandshake): void {
    this.stats.retransmissions++;
    this.sendRaw(hs.flight.datagram(hs), hs.address, hs.port);
  }

  /** ChangeCipherSpec (epoch 0) and our Finished (epoch 1, freshly sealed) in one datagram. */
  private sendFinalFlight(s: Session): void {
    const ccs = encodeRecord(ContentType.changeCipherSpec, DTLS_1_2, 0, s.epoch0Seq++, Buffer.from([1]));
    const finished = s.state.seal(
      ContentType.handshake,
      encodeHandshake(HandshakeType.finished, s.finishedSeq, s.serverVerify()),
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
    // No callback (a closure per send): a failed send surfaces as the socket's 'error' event, which counts it.
    socket.send(datagram, port, address);
  }

  // ---------------------------------------------------------------------------------------------
  // Ending

  /** Counts and wipes a handshake that is no longer in the store. */
  private discard(hs: ServerHandshake, reason: DtlsHandshakeFailure): void {
    hs.wipe();
    this.stats.handshakeFailures[reason]++;
    this.options.logger.debug('dtls handshake ended', { peer: hs.key, reason });
  }

  private endSession(s: Session, reason: DtlsSessionEndReason, sendCloseNotify: boolean): void {
    // Out of the store first: a close_notify that cannot be sealed must not end the session twice.
    if (!this.store.deleteSession(s)) return;
    if (sendCloseNotify) {
      const record = s.state.seal(
        ContentType.alert,
        Buffer.from([AlertLevel.warning, AlertDescription.closeNotify]),
      );
      if (record !== undefined) {
        this.sendRaw(record, s.pub.address, s.pub.port);
        this.stats.alertsSent.closeNotify++;
      }
    }
    s.wipe();
    // Cut off by its key (revoked, expired, deleted, or its device disabled): say whose, never the key.
    if (reason === 'revoked')
      this.options.logger.info('dtls session ended: key no longer valid', {
        device_id: s.pub.deviceId,
        identity: s.pub.identity,
        peer: s.pub.key,
      });
    this.notifyEnd(s, reason);
  }

  /** Ends `s` ('revoked') unless lookupPsk still returns its credential. Returns whether it ended. */
  private checkSession(s: Session): boolean {
    if (this.lookupPsk(s.pub.identity)?.credentialId === s.pub.credentialId) return false;
    this.endSession(s, 'revoked', true);
    return true;
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

  // ---------------------------------------------------------------------------------------------
  // Time: one interval timer for every handshake and session (no per-session timers).

  /** Milliseconds since the server was made: small integers, so V8 keeps them unboxed. */
  now(): number {
    return Date.now() - this.started;
  }

  /**
   * The periodic credential check: each tick checks the share of sessions that makes one pass per
   * credentialCheckIntervalMs, so a large table costs a little every tick, never a long pause. Whatever
   * event was missed (a reload that failed, a notification lost, an expiry between reloads), a session whose
   * credential is no longer valid ends within about one interval.
   */
  private checkCredentials(): void {
    const sessions = this.store.sessions;
    if (sessions.size === 0) return;
    const share = Math.ceil(
      (sessions.size * this.options.timerResolutionMs) / this.options.credentialCheckIntervalMs,
    );
    // A Map iterator stays valid while entries are added and deleted (ECMA-262 §24.1.3.5).
    this.credentialCursor ??= sessions.values();
    for (let i = 0; i < share; i++) {
      const next = this.credentialCursor.next();
      if (next.done === true) {
        this.credentialCursor = undefined;
        return;
      }
      this.checkSession(next.value);
    }
  }

  private tick(): void {
    try {
      const now = this.now();
      this.cookies.maybeRotate(now);
      for (const hs of [...this.store.handshakes.values()]) {
        if (now >= hs.deadline) this.abandon(hs, 'timeout');
        else if (now >= hs.stepDeadline) this.abandon(hs, 'unauthenticated_timeout');
        else if (now >= hs.decryptErrorAt) this.fail(hs, 'decryptError');
        // RFC 6347 §4.2.4.1: resend on expiry, doubling the timer each time up to a bound.
        else if (hs.flight.due(now, this.options.retransmitMaxMs)) this.resendFlight(hs);
      }
      this.checkCredentials();
      if (now >= this.nextIdleSweep) {
        this.nextIdleSweep = now + this.options.idleSweepIntervalMs;
        const cutoff = now - this.options.idleTimeoutMs;
        // Deleting the current entry while iterating a Map is well defined (ECMA-262 Map.prototype.forEach).
        for (const s of this.store.sessions.values()) {
          if (s.lastRx < cutoff) this.endSession(s, 'idle', true);
          else s.state.releaseIfUnused();
        }
      }
    } catch (err) {
      this.stats.internalErrors++;
      this.options.logger.error('dtls: internal error in the timer', { error: errorMessage(err) });
    }
  }
}
