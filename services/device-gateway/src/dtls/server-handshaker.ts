// The server side of one DTLS 1.2 PSK handshake in progress (RFC 6347 §4.2, RFC 5246 §7.4, RFC 4279 §2),
// from the ClientHello that carried a valid cookie to the client's Finished:
//
//   ClientHello + cookie   -> ServerHello, ServerHelloDone              (flight 4, retransmitted on a timer)
//   ClientKeyExchange, ChangeCipherSpec, Finished -> ChangeCipherSpec, Finished   (flight 6, sent by the
//                                                     connector when the handshake completes)
//
// The stateless cookie exchange before it is the connector's (no state exists before a valid cookie,
// RFC 6347 §4.2.1). What the handshake cannot decide alone (credentials, sending, ending) goes through its host.
import { createSecretKey, hash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { KeyObject } from 'node:crypto';
import {
  AlertDescription,
  AlertLevel,
  ContentType,
  HANDSHAKE_HEADER_BYTES,
  HandshakeType,
  RANDOM_BYTES,
  VERIFY_DATA_BYTES,
} from './constants.js';
import type { AlertName } from './constants.js';
import { extendedMasterSecret, finishedVerifyData, keyBlock, masterSecret, pskPremaster } from './crypto.js';
import { Flight } from './flight.js';
import {
  Reassembler,
  encodeHandshake,
  parseHandshakeFragments,
  parsePskClientKeyExchange,
  serverHelloBody,
  writeHandshake,
} from './handshake.js';
import type { HandshakeFragment, ReassemblyResult } from './handshake.js';
import type { DtlsServerOptions, PskCredential } from './options.js';
import type { DtlsRecord } from './record.js';
import { ConnectionState } from './record-layer.js';
import type { OpenFailure } from './record-layer.js';
import type { DtlsDropReason, DtlsHandshakeFailure } from './stats.js';

/** What a handshake needs from the connector that runs it. */
export interface HandshakeHost {
  readonly options: DtlsServerOptions;
  /** The credential currently valid for an identity; undefined for none (or if the lookup threw). */
  lookupPsk(identity: string): PskCredential | undefined;
  /** Whether `hs` is still its peer's handshake (a callback may have ended it). */
  isCurrent(hs: ServerHandshake): boolean;
  /** Counts the datagrams received; tells which records arrived together. */
  readonly datagramNumber: number;
  /** The server clock, ms. */
  now(): number;
  /** Sends a fatal alert in epoch 0 and abandons the handshake (counted as `reason`, else by the alert). */
  fail(hs: ServerHandshake, alert: AlertName, reason?: DtlsHandshakeFailure): void;
  abandon(hs: ServerHandshake, reason: DtlsHandshakeFailure): void;
  drop(reason: DtlsDropReason): void;
  /** The client's Finished verified: make the session and send our final flight. */
  establish(
    hs: ServerHandshake,
    credential: PskCredential,
    serverVerify: Buffer,
    clientFinishedSeq: number,
  ): void;
}

export type HandshakeState = 'await_cke' | 'await_ccs' | 'await_finished';

/** A handshake in progress: exists only after a ClientHello with a valid cookie (RFC 6347 §4.2.1). */
export class ServerHandshake {
  state: HandshakeState = 'await_cke';
  /** Epoch 1 records that arrived before the ChangeCipherSpec (RFC 6347 §4.1: may be buffered). */
  early: DtlsRecord[] = [];
  /** Next record sequence number in epoch 0 (ours). */
  epoch0Seq: number;
  /** Next message_seq of ours. */
  nextSeq: number;
  readonly flight: Flight;
  readonly clientRandom: Buffer;
  readonly serverRandom: Buffer;
  /** message_seq of the client's ClientHello (its retransmission means our flight was lost). */
  readonly clientHelloSeq: number;
  /** The cookie-bearing ClientHello body (a view into the transcript): only the very same is a retransmission. */
  readonly clientHelloBody: Buffer;
  /** Server clock (ms) at which the handshake is abandoned if not finished. */
  readonly deadline: number;
  /**
   * Server clock (ms) at which it is abandoned unless it moved on: no ClientKeyExchange within
   * options.unauthenticatedTimeoutMs of the ClientHello, or no authentic Finished within as long after the
   * ClientKeyExchange. A handshake is unauthenticated until its Finished verifies (the ClientKeyExchange only
   * names an identity, and identities travel in clear, RFC 4279 §7.2), and the client sends its Finished with
   * its ClientKeyExchange, so neither step needs the whole handshakeTimeoutMs.
   */
  stepDeadline: number;
  /**
   * The ClientKeyExchanges received, each with the keys it makes. Anyone who can put the client's address on a
   * datagram can send one before the client's own (its message_seq is predictable), so the first is not
   * trusted to be the client's: up to MAX_KEY_EXCHANGES distinct ones are kept, and the client's Finished
   * shows which one it used (the one whose keys authenticate it).
   */
  private readonly candidates: KeyExchangeCandidate[] = [];
  /** The candidate whose keys authenticated an epoch 1 record: the client's. */
  private chosen?: KeyExchangeCandidate;
  /** The datagram in which the client last retransmitted a ClientKeyExchange it had sent before. */
  private retransmittedIn = -1;
  /** Server clock (ms) at which a failed authentication with no authentic Finished since is answered. */
  decryptErrorAt = Infinity;
  /**
   * The handshake messages up to and including ServerHelloDone, as RFC 6347 §4.2.6 hashes them: each candidate
   * hashes it followed by its own ClientKeyExchange. Kept once, as bytes (a few hundred; at most
   * maxHandshakeMessageBytes of ClientHello), and hashed in one call where a digest is needed, not as a running
   * hash object per candidate: fewer native objects per handshake for the garbage collector.
   */
  private readonly transcript: Buffer;
  private readonly reassembler: Reassembler;

  /**
   * Starts from a cookie-verified ClientHello whose parameters `negotiate` accepted, and builds flight 4:
   * ServerHello and ServerHelloDone. No ServerKeyExchange: a psk_identity_hint is optional (RFC 4279 §2) and
   * RFC 7925 §4.2 advises against it.
   */
  constructor(
    private readonly host: HandshakeHost,
    readonly key: string,
    readonly address: string,
    readonly port: number,
    /** The cookie-verified ClientHello (parsed and negotiated by the connector). */
    helloFragment: HandshakeFragment,
    /** Record sequence number of the ClientHello. */
    helloRecordSeq: number,
    readonly ems: boolean,
    secureRenegotiation: boolean,
    now: number,
  ) {
    const options = host.options;
    this.clientHelloSeq = helloFragment.messageSeq;
    this.deadline = now + options.handshakeTimeoutMs;
    this.stepDeadline = now + options.unauthenticatedTimeoutMs;
    // Our epoch 0 record numbers start above the HelloVerifyRequest's (which reused an earlier ClientHello's
    // number), as RFC 6347 §4.2.1 intends.
    this.epoch0Seq = helloRecordSeq;
    this.reassembler = new Reassembler(
      {
        maxMessageBytes: options.maxHandshakeMessageBytes,
        maxFragmentsPerMessage: options.maxFragmentsPerMessage,
        maxPendingBytes: options.maxPendingBytesPerPeer,
        maxMessagesAhead: 2,
      },
      helloFragment.messageSeq + 1,
    );
    // Our message_seq continues from the client's (RFC 6347 §4.2.2; a stateless server cannot know it sent a
    // HelloVerifyRequest, so it takes the ClientHello's): ServerHello = ClientHello's seq.
    const shSeq = helloFragment.messageSeq;
    this.nextSeq = shSeq + 2;
    const shBody = serverHelloBody(randomBytes(RANDOM_BYTES), ems, secureRenegotiation);
    // RFC 6347 §4.2.6: the transcript starts at the ClientHello that carried the cookie; the first ClientHello
    // and the HelloVerifyRequest are not part of it. It is a buffer of the handshake's own (allocUnsafeSlow):
    // a slice of node's shared Buffer pool (64 KiB blocks on Node 24) would keep its whole block alive while
    // the handshake lives, a cold review found up to four blocks a handshake. The ClientHello body, both
    // randoms and our flight 4 are views into it.
    const transcript = Buffer.allocUnsafeSlow(
      3 * HANDSHAKE_HEADER_BYTES + helloFragment.body.length + shBody.length,
    );
    const shAt = writeHandshake(transcript, 0, HandshakeType.clientHello, shSeq, helloFragment.body);
    const shdAt = writeHandshake(transcript, shAt, HandshakeType.serverHello, shSeq, shBody);
    writeHandshake(transcript, shdAt, HandshakeType.serverHelloDone, shSeq + 1, NO_BODY);
    this.transcript = transcript;
    this.clientHelloBody = transcript.subarray(HANDSHAKE_HEADER_BYTES, shAt);
    // ClientHello and ServerHello bodies both start with version(2) random(32) (RFC 5246 §7.4.1.2-3).
    this.clientRandom = this.clientHelloBody.subarray(2, 2 + RANDOM_BYTES);
    this.serverRandom = transcript.subarray(
      shAt + HANDSHAKE_HEADER_BYTES + 2,
      shAt + HANDSHAKE_HEADER_BYTES + 2 + RANDOM_BYTES,
    );
    this.flight = new Flight(
      [transcript.subarray(shAt, shdAt), transcript.subarray(shdAt)],
      options.retransmitInitialMs,
      now,
    );
  }

  get reassemblyBytes(): number {
    return this.reassembler.bufferedBytes;
  }

  /**
   * Drops the key exchanges whose credential the predicate rejects (revoked, expired, changed). Returns false
   * only when that left none: a handshake whose key exchanges named no known identity is kept like any other,
   * so that invalidations cannot tell known identities from unknown ones (design §3.5).
   */
  keepCredentials(valid: (credential: PskCredential) => boolean): boolean {
    let dropped = false;
    for (let i = this.candidates.length - 1; i >= 0; i--) {
      const c = this.candidates[i]!;
      if (c.credential === undefined || valid(c.credential)) continue;
      wipeCandidate(c);
      this.candidates.splice(i, 1);
      if (this.chosen === c) this.chosen = undefined;
      dropped = true;
    }
    return !dropped || this.candidates.length > 0;
  }

  /** The connection state of epoch 1 (the chosen key exchange's), handed to the session when it completes. */
  takeConnection(): ConnectionState {
    const connection = this.chosen!.connection;
    this.chosen!.taken = true;
    return connection;
  }

  /** Overwrites the secrets held (on abandonment, or after the session took the connection state). */
  wipe(): void {
    for (const c of this.candidates) wipeCandidate(c);
  }

  /**
   * Epoch 0 handshake fragments. After the ClientHello, the only message a client sends in epoch 0 is its
   * ClientKeyExchange (RFC 6347 §4.2.4 flight 5; its Finished follows the ChangeCipherSpec, in epoch 1), so
   * nothing else unauthenticated may take a message_seq, least of all the one the Finished must use. Older
   * numbers are the client's retransmissions.
   */
  onEpoch0Fragments(frags: HandshakeFragment[]): void {
    for (const f of frags) {
      if (!this.host.isCurrent(this)) return;
      if (f.messageSeq < this.reassembler.nextSeq) this.onRetransmitted(f);
      else if (
        this.state !== 'await_cke' ||
        f.msgType !== HandshakeType.clientKeyExchange ||
        f.messageSeq !== this.reassembler.nextSeq
      )
        this.host.drop('unexpected');
      else this.feed(f, 0);
    }
  }

  /** RFC 5246 §7.1: ChangeCipherSpec is the single byte 1; after it the client writes epoch 1. */
  onChangeCipherSpec(rec: DtlsRecord): void {
    if (rec.fragment.length !== 1 || rec.fragment[0] !== 1) return this.host.drop('malformed');
    // Before ClientKeyExchange (it was lost or is late) the CCS cannot be used: drop it, the client
    // retransmits its whole flight (RFC 6347 §4.2.4). Once past it, a second CCS is a duplicate.
    if (this.state !== 'await_ccs') return this.host.drop('unexpected');
    this.state = 'await_finished';
    const early = this.early;
    this.early = [];
    for (const r of early) {
      if (!this.host.isCurrent(this)) return;
      this.onEpoch1(r);
    }
  }

  /**
   * An authenticated alert from the peer during the handshake ends it (RFC 5246 §7.2: close_notify or fatal).
   * Unauthenticated (epoch 0) alerts never reach here: anyone could forge one (RFC 6347 §4.1.2.7).
   */
  private onAlert(alert: Buffer): void {
    const level = alert[0];
    const description = alert[1];
    if (level === AlertLevel.fatal || description === AlertDescription.closeNotify) {
      this.host.abandon(this, 'peer_alert');
    }
  }

  /** An epoch 1 record addressed to this handshake (its Finished, or an alert under the new keys). */
  onEpoch1(rec: DtlsRecord): void {
    if (this.state === 'await_ccs') return this.holdEarly(rec);
    const opened = this.openEpoch1(rec);
    if (opened === 'replay') return this.host.drop('replay');
    if (opened === 'mac') {
      // RFC 6347 §4.1.2.7: a record that fails authentication is dropped silently, so that one forged
      // datagram cannot end the handshake. A client whose key is wrong (or whose identity is unknown) shows
      // the same way, and RFC 4279 §2 / RFC 5246 §7.2.2 answer it decrypt_error (in epoch 0: we have not
      // sent our ChangeCipherSpec). We do so at once when the failure cannot be a third party's: the failing
      // record came in the datagram that carried the ClientKeyExchange that made these keys (whoever sent
      // that owns the handshake anyway), or the datagram that repeated a ClientKeyExchange already received
      // (onRetransmitted). Otherwise (a client that sends each record of its flight alone, such as
      // node-dtls-client) only if no authentic Finished follows within authFailureGraceMs: a client sends
      // its Finished right after its ChangeCipherSpec, so a forged record can end a handshake only when the
      // real Finished is lost as well.
      const datagram = this.host.datagramNumber;
      if (
        rec.type === ContentType.handshake &&
        (this.candidates.some((c) => c.datagram === datagram) || this.retransmittedIn === datagram)
      ) {
        return this.host.fail(this, 'decryptError');
      }
      if (rec.type === ContentType.handshake && this.decryptErrorAt === Infinity)
        this.decryptErrorAt = this.host.now() + this.host.options.authFailureGraceMs;
      return this.host.drop('mac');
    }
    switch (rec.type) {
      case ContentType.handshake: {
        const frags = parseHandshakeFragments(opened);
        if (frags === undefined || frags.length === 0) return this.host.fail(this, 'decodeError');
        for (const f of frags) {
          if (!this.host.isCurrent(this)) return;
          this.feed(f, 1);
        }
        return;
      }
      case ContentType.alert:
        if (opened.length !== 2) return this.host.drop('malformed');
        return this.onAlert(opened);
      default:
        return this.host.drop('unexpected');
    }
  }

  /**
   * Epoch 1 records before the ChangeCipherSpec are not authenticated yet: keep copies (a subarray would pin
   * the whole datagram, up to 64 KB) and only within the peer's reassembly budget (RFC 6347 §4.2.3 bounds
   * left to us). What legitimately arrives early is the client's Finished, a record of 40 bytes.
   */
  private holdEarly(rec: DtlsRecord): void {
    const held = this.early.reduce((bytes, r) => bytes + r.fragment.length, 0);
    if (
      this.early.length >= 4 ||
      held + this.reassembler.bufferedBytes + rec.fragment.length > this.host.options.maxPendingBytesPerPeer
    ) {
      return this.host.drop('epoch');
    }
    // Buffer.alloc, not Buffer.from: a small Buffer.from comes out of node's shared pool (64 KiB blocks on
    // Node 24) and pins its block.
    const fragment = Buffer.alloc(rec.fragment.length);
    rec.fragment.copy(fragment);
    this.early.push({ ...rec, fragment });
  }

  /**
   * A ClientKeyExchange at the number of the one processed: the client retransmitting its flight when ours did
   * not come (RFC 6347 §4.2.4), or the client's own after a forged one took the number first. A new one
   * (whole, unfragmented: a PSK ClientKeyExchange is a few dozen bytes) becomes another candidate; a repeated
   * one is noted, and a Finished that fails in the same datagram is then the client's (see onEpoch1).
   */
  private onRetransmitted(f: HandshakeFragment): void {
    const first = this.candidates[0];
    if (
      first === undefined ||
      f.msgType !== HandshakeType.clientKeyExchange ||
      f.messageSeq !== first.seq ||
      f.fragmentOffset !== 0 ||
      f.body.length !== f.length
    ) {
      return this.host.drop('unexpected');
    }
    // The reassembler bounds the first ClientKeyExchange so; a later one skips it.
    if (f.length > this.host.options.maxHandshakeMessageBytes) return this.host.drop('limit');
    if (this.candidates.some((c) => c.message.subarray(HANDSHAKE_HEADER_BYTES).equals(f.body))) {
      this.retransmittedIn = this.host.datagramNumber;
      return;
    }
    if (this.candidates.length >= MAX_KEY_EXCHANGES) return this.host.drop('limit');
    if (parsePskClientKeyExchange(f.body) === undefined) return this.host.drop('malformed');
    this.addCandidate(f.messageSeq, f.body);
  }

  /** Opens an epoch 1 record with the chosen key exchange's keys, or finds the candidate whose keys do. */
  private openEpoch1(rec: DtlsRecord): Buffer | OpenFailure {
    if (this.chosen !== undefined) return this.chosen.connection.open(rec);
    let result: Buffer | OpenFailure = 'mac';
    for (const c of this.candidates) {
      const opened = c.connection.open(rec);
      if (opened === 'mac') continue;
      if (opened !== 'replay') this.chosen = c;
      result = opened;
      break;
    }
    return result;
  }

  private feed(f: HandshakeFragment, epoch: number): void {
    let r: ReassemblyResult = this.reassembler.add(f, epoch);
    for (;;) {
      if (r.kind === 'rejected') return this.host.drop('reassembly');
      if (r.kind !== 'message') return;
      if (!this.onMessage(r.msgType, r.messageSeq, r.epoch, r.body)) return;
      r = this.reassembler.drain();
    }
  }

  /** Processes one complete message in order. Returns false if the handshake ended. */
  private onMessage(msgType: number, seq: number, epoch: number, body: Buffer): boolean {
    if (this.state === 'await_cke' && msgType === HandshakeType.clientKeyExchange && epoch === 0) {
      return this.onClientKeyExchange(seq, body);
    }
    if (this.state === 'await_finished' && msgType === HandshakeType.finished && epoch === 1) {
      this.onFinished(seq, body);
      return false;
    }
    // Anything else out of order is a protocol violation (RFC 5246 §7.4: "unexpected_message").
    this.host.fail(this, 'unexpectedMessage');
    return false;
  }

  /**
   * RFC 4279 §2: the ClientKeyExchange names the PSK identity. An identity we do not know (or one that is
   * not a valid UTF-8 string of at most 128 bytes, RFC 4279 §5.1/§5.3) continues with a random key, so
   * that the Finished check fails exactly as it does for a wrong key: both end in decrypt_error (RFC 4279
   * §2 allows this instead of unknown_psk_identity) and a prober learns nothing.
   */
  private onClientKeyExchange(seq: number, body: Buffer): boolean {
    if (parsePskClientKeyExchange(body) === undefined) {
      this.host.fail(this, 'decodeError');
      return false;
    }
    if (!this.addCandidate(seq, body)) return false;
    this.stepDeadline = this.host.now() + this.host.options.unauthenticatedTimeoutMs;
    this.state = 'await_ccs';
    return true;
  }

  /**
   * Adds a ClientKeyExchange's candidate; false if the handshake ended meanwhile (lookupPsk is the host's
   * callback, and one that re-entered the server may have abandoned it): the candidate is then wiped, not kept.
   */
  private addCandidate(seq: number, body: Buffer): boolean {
    const candidate = this.keyExchangeCandidate(seq, body);
    if (!this.host.isCurrent(this)) {
      wipeCandidate(candidate);
      return false;
    }
    this.candidates.push(candidate);
    return true;
  }

  /**
   * The key schedule of one ClientKeyExchange: its transcript, master secret (RFC 5246 §8.1 or RFC 7627 §4),
   * key block (RFC 5246 §6.3) and the client Finished it implies (RFC 5246 §7.4.9).
   */
  private keyExchangeCandidate(seq: number, body: Buffer): KeyExchangeCandidate {
    const identityBytes = body.subarray(2);
    const identity = identityBytes.toString('utf8');
    const credential =
      identityBytes.length <= 128 && Buffer.from(identity, 'utf8').equals(identityBytes)
        ? this.host.lookupPsk(identity)
        : undefined;
    // The fake key has the length of a typical real one, so the PRF work below is the same.
    const psk = credential?.key ?? randomBytes(32);
    // The message and the client Finished it implies, in a buffer of their own (not the shared pool's, see
    // the constructor).
    const own = Buffer.allocUnsafeSlow(HANDSHAKE_HEADER_BYTES + body.length + VERIFY_DATA_BYTES);
    const verifyAt = writeHandshake(own, 0, HandshakeType.clientKeyExchange, seq, body);
    const message = own.subarray(0, verifyAt);
    // RFC 7627 §3: session_hash = Hash(handshake messages up to and including ClientKeyExchange). The
    // client's Finished (RFC 5246 §7.4.9) covers the same messages, so the one digest serves both.
    const transcriptHash = hash('sha256', Buffer.concat([this.transcript, message]), 'buffer');
    const premaster = pskPremaster(psk);
    const masterBytes = this.ems
      ? extendedMasterSecret(premaster, transcriptHash)
      : masterSecret(premaster, this.clientRandom, this.serverRandom);
    premaster.fill(0);
    // One key object for the key block and both Finished messages (each PRF call would otherwise make its own).
    const master = createSecretKey(masterBytes);
    masterBytes.fill(0);
    const block = keyBlock(master, this.clientRandom, this.serverRandom);
    const connection = new ConnectionState(block);
    block.fill(0);
    const expected = finishedVerifyData(master, 'client', transcriptHash);
    expected.copy(own, verifyAt);
    expected.fill(0);
    return {
      seq,
      message,
      credential,
      master,
      connection,
      expectedClientVerify: own.subarray(verifyAt),
      datagram: this.host.datagramNumber,
      taken: false,
    };
  }

  /** RFC 5246 §7.4.9: check the client's Finished; the host answers ChangeCipherSpec + Finished and goes live. */
  private onFinished(seq: number, body: Buffer): void {
    // A handshake message in epoch 1 opened with the chosen key exchange's keys (openEpoch1); none is chosen
    // only if a re-entrant lookup dropped it while a Finished earlier in the same record was checked (below).
    const chosen = this.chosen;
    if (chosen === undefined) return this.host.fail(this, 'decryptError', 'credential_invalid');
    const expected = chosen.expectedClientVerify;
    const credential = chosen.credential;
    if (
      body.length !== VERIFY_DATA_BYTES ||
      !timingSafeEqual(body, expected) ||
      // An unknown identity cannot get here (its random key cannot produce this Finished); belt and braces.
      credential === undefined
    ) {
      return this.host.fail(this, 'decryptError');
    }
    // The credential must still be valid as the handshake completes, not only at ClientKeyExchange: a
    // handshake can be held open after it, and the key revoked or expired meanwhile. The same answer as a
    // wrong key: the holder of a dead key learns nothing else.
    if (this.host.lookupPsk(credential.identity)?.credentialId !== credential.credentialId)
      return this.host.fail(this, 'decryptError', 'credential_invalid');
    // lookupPsk is the host's callback: one that re-entered the server (revalidate) may have ended this
    // handshake or dropped this key exchange meanwhile (found by cold reviews; the gateway's own is a pure
    // lookup). Then its credential is no longer valid: the handshake ends as above, if it has not already.
    if (!this.host.isCurrent(this)) return;
    if (this.chosen !== chosen || chosen.master === undefined)
      return this.host.fail(this, 'decryptError', 'credential_invalid');
    const transcriptHash = hash(
      'sha256',
      Buffer.concat([this.transcript, chosen.message, encodeHandshake(HandshakeType.finished, seq, body)]),
      'buffer',
    );
    const serverVerify = finishedVerifyData(chosen.master, 'server', transcriptHash);
    this.host.establish(this, credential, serverVerify, seq);
  }
}

const NO_BODY = Buffer.alloc(0);

/** How many distinct ClientKeyExchanges one handshake considers (each costs a key schedule, about 40 µs). */
const MAX_KEY_EXCHANGES = 3;

/** One ClientKeyExchange and the keys it makes (ServerHandshake.candidates). */
interface KeyExchangeCandidate {
  readonly seq: number;
  /** The ClientKeyExchange as the transcript has it (RFC 6347 §4.2.6 header and body). */
  readonly message: Buffer;
  /** Undefined for an identity we do not know (its keys come from a random PSK and never authenticate). */
  readonly credential: PskCredential | undefined;
  /** The master secret; a key object cannot be overwritten, so wipeCandidate drops it. */
  master: KeyObject | undefined;
  readonly connection: ConnectionState;
  readonly expectedClientVerify: Buffer;
  /** host.datagramNumber of the datagram that carried it. */
  readonly datagram: number;
  /** The session took its connection state: not wiped with the handshake. */
  taken: boolean;
}

function wipeCandidate(c: KeyExchangeCandidate): void {
  c.master = undefined;
  c.expectedClientVerify.fill(0);
  if (!c.taken) c.connection.wipe();
}
