// A scriptable DTLS 1.2 PSK client over a real UDP socket, for the gateway's attack tests (dtls-attacks.test.ts)
// and for bench:gateway's DTLS observers that answer at once, as its plain ones do (scripts/src/bench-gateway-dtls.ts).
//
// It is written from the RFCs with node:crypto alone and imports nothing from src/dtls, so that a mistake in
// the server's key schedule, transcript or record protection cannot be mirrored here and go unnoticed:
//   - PRF: RFC 5246 §5, P_SHA256; premaster: RFC 4279 §2; master secret: RFC 5246 §8.1; extended master
//     secret: RFC 7627 §4; key block: RFC 5246 §6.3; Finished: RFC 5246 §7.4.9;
//   - records and handshake headers: RFC 6347 §4.1 / §4.2.2; the transcript starts at the ClientHello that
//     carries the cookie (RFC 6347 §4.2.6) and hashes each message with its 12-byte DTLS header, unfragmented;
//   - TLS_PSK_WITH_AES_128_CCM_8 (0xC0A8) records: RFC 6655 §3 (nonce = 4-byte salt + 8-byte explicit nonce,
//     the explicit nonce being epoch and sequence number; AAD = seq_num(8) type(1) version(2) length(2)).
//
// Every step is its own call, so that a test can stop anywhere (hold the Finished back after ClientKeyExchange,
// replay a recorded ClientHello, send a forged record from the client's own address and port), and the client
// can bind any 127.0.0.0/8 address so that the server sees distinct source addresses. It never retransmits:
// on loopback nothing is lost, and a test wants to see exactly what it sent.
import {
  createCipheriv,
  createDecipheriv,
  createHash,
  createHmac,
  createSecretKey,
  randomBytes,
  type KeyObject,
} from 'node:crypto';
import dgram from 'node:dgram';

export const ContentType = { changeCipherSpec: 20, alert: 21, handshake: 22, applicationData: 23 } as const;
export const HandshakeType = {
  clientHello: 1,
  serverHello: 2,
  helloVerifyRequest: 3,
  serverHelloDone: 14,
  clientKeyExchange: 16,
  finished: 20,
} as const;
export const AlertLevel = { warning: 1, fatal: 2 } as const;
/** The alert descriptions a test looks for (RFC 5246 §7.2). */
export const AlertDescription = {
  closeNotify: 0,
  unexpectedMessage: 10,
  badRecordMac: 20,
  handshakeFailure: 40,
  decryptError: 51,
} as const;

const DTLS_1_2 = 0xfefd;
const TLS_PSK_WITH_AES_128_CCM_8 = 0xc0a8;
const EXT_EXTENDED_MASTER_SECRET = 0x0017;
const RECORD_HEADER_BYTES = 13;
const HANDSHAKE_HEADER_BYTES = 12;
const EXPLICIT_NONCE_BYTES = 8;
const TAG_BYTES = 8;

// ---------------------------------------------------------------------------------------------------------
// Key schedule (RFC 5246 §5, §6.3, §8.1; RFC 4279 §2; RFC 7627 §4)

const hmacSha256 = (key: Buffer, data: Buffer): Buffer => createHmac('sha256', key).update(data).digest();
const sha256 = (parts: Buffer[]): Buffer => {
  const h = createHash('sha256');
  for (const p of parts) h.update(p);
  return h.digest();
};

/** P_SHA256(secret, seed) = HMAC(secret, A(1) + seed) + HMAC(secret, A(2) + seed) + …, A(i) = HMAC(secret, A(i-1)). */
export function pSha256(secret: Buffer, seed: Buffer, length: number): Buffer {
  const blocks: Buffer[] = [];
  let produced = 0;
  let a = seed;
  while (produced < length) {
    a = hmacSha256(secret, a);
    const block = hmacSha256(secret, Buffer.concat([a, seed]));
    blocks.push(block);
    produced += block.length;
  }
  return Buffer.concat(blocks).subarray(0, length);
}

/** PRF(secret, label, seed) = P_SHA256(secret, label + seed) (RFC 5246 §5). */
export function prf(secret: Buffer, label: string, seed: Buffer, length: number): Buffer {
  return pSha256(secret, Buffer.concat([Buffer.from(label, 'ascii'), seed]), length);
}

/** RFC 4279 §2: uint16 N, N zero bytes, uint16 N, the PSK. */
export function pskPremasterSecret(psk: Buffer): Buffer {
  const out = Buffer.alloc(4 + 2 * psk.length);
  out.writeUInt16BE(psk.length, 0);
  out.writeUInt16BE(psk.length, 2 + psk.length);
  psk.copy(out, 4 + psk.length);
  return out;
}

interface RecordKeys {
  /** A KeyObject, made once per session: a Buffer key costs node two thrown exceptions per cipher made. */
  writeKey: KeyObject;
  /** The 4-byte implicit part of the CCM nonce (client_write_IV / server_write_IV). */
  salt: Buffer;
}

// ---------------------------------------------------------------------------------------------------------
// Wire formats (RFC 6347 §4.1, §4.2.2)

function seqNum(epoch: number, seq: number): Buffer {
  const out = Buffer.alloc(8);
  out.writeUInt16BE(epoch, 0);
  out.writeUIntBE(seq, 2, 6);
  return out;
}

/** A DTLSPlaintext/DTLSCiphertext record: type(1) version(2) epoch(2) sequence_number(6) length(2) fragment. */
export function encodeRecord(
  type: number,
  epoch: number,
  seq: number,
  fragment: Buffer,
  version = DTLS_1_2,
): Buffer {
  const head = Buffer.alloc(RECORD_HEADER_BYTES);
  head[0] = type;
  head.writeUInt16BE(version, 1);
  seqNum(epoch, seq).copy(head, 3);
  head.writeUInt16BE(fragment.length, 11);
  return Buffer.concat([head, fragment]);
}

/**
 * An unfragmented handshake message: msg_type(1) length(3) message_seq(2) fragment_offset(3) = 0
 * fragment_length(3) = length, body. This is also the form the transcript hashes (RFC 6347 §4.2.6).
 */
export function encodeHandshake(msgType: number, messageSeq: number, body: Buffer): Buffer {
  const head = Buffer.alloc(HANDSHAKE_HEADER_BYTES);
  head[0] = msgType;
  head.writeUIntBE(body.length, 1, 3);
  head.writeUInt16BE(messageSeq, 4);
  head.writeUIntBE(0, 6, 3);
  head.writeUIntBE(body.length, 9, 3);
  return Buffer.concat([head, body]);
}

export interface WireRecord {
  type: number;
  version: number;
  epoch: number;
  seq: number;
  /** The header's epoch and sequence number as sent (the AEAD's seq_num). */
  seqNum: Buffer;
  fragment: Buffer;
}

/** The records of a datagram; stops at the first that does not fit. */
export function parseRecords(datagram: Buffer): WireRecord[] {
  const records: WireRecord[] = [];
  let at = 0;
  while (at + RECORD_HEADER_BYTES <= datagram.length) {
    const length = datagram.readUInt16BE(at + 11);
    if (at + RECORD_HEADER_BYTES + length > datagram.length) break;
    records.push({
      type: datagram[at]!,
      version: datagram.readUInt16BE(at + 1),
      epoch: datagram.readUInt16BE(at + 3),
      seq: datagram.readUIntBE(at + 5, 6),
      seqNum: Buffer.from(datagram.subarray(at + 3, at + 11)),
      fragment: Buffer.from(datagram.subarray(at + RECORD_HEADER_BYTES, at + RECORD_HEADER_BYTES + length)),
    });
    at += RECORD_HEADER_BYTES + length;
  }
  return records;
}

export interface HandshakeMessage {
  msgType: number;
  messageSeq: number;
  body: Buffer;
  /** The message as encodeHandshake writes it (the transcript's form). */
  whole: Buffer;
}

/** The complete handshake messages of a record's fragment (a fragmented message is skipped: ours never are). */
export function parseHandshakes(fragment: Buffer): HandshakeMessage[] {
  const out: HandshakeMessage[] = [];
  let at = 0;
  while (at + HANDSHAKE_HEADER_BYTES <= fragment.length) {
    const length = fragment.readUIntBE(at + 1, 3);
    const messageSeq = fragment.readUInt16BE(at + 4);
    const offset = fragment.readUIntBE(at + 6, 3);
    const fragmentLength = fragment.readUIntBE(at + 9, 3);
    const end = at + HANDSHAKE_HEADER_BYTES + fragmentLength;
    if (end > fragment.length) break;
    if (offset === 0 && fragmentLength === length) {
      const body = Buffer.from(fragment.subarray(at + HANDSHAKE_HEADER_BYTES, end));
      out.push({
        msgType: fragment[at]!,
        messageSeq,
        body,
        whole: encodeHandshake(fragment[at]!, messageSeq, body),
      });
    }
    at = end;
  }
  return out;
}

/**
 * RFC 6655 §3 for DTLS: AES-128-CCM with an 8-byte tag, explicit nonce = epoch + sequence number. Returns the
 * whole record (RFC 6347 §4.1: header, explicit nonce, ciphertext, tag), written into one buffer.
 */
function sealCcm8Record(
  keys: RecordKeys,
  epoch: number,
  seq: number,
  type: number,
  plaintext: Buffer,
): Buffer {
  const length = EXPLICIT_NONCE_BYTES + plaintext.length + TAG_BYTES;
  const out = Buffer.allocUnsafe(RECORD_HEADER_BYTES + length);
  out[0] = type;
  out.writeUInt16BE(DTLS_1_2, 1);
  out.writeUInt16BE(epoch, 3);
  out.writeUIntBE(seq, 5, 6);
  out.writeUInt16BE(length, 11);
  out.copy(out, RECORD_HEADER_BYTES, 3, 11); // the explicit nonce: epoch and sequence number again
  // AAD = seq_num(8) type(1) version(2) length(2) of the plaintext; the header's first 11 bytes, reordered.
  const aad = Buffer.allocUnsafe(13);
  out.copy(aad, 0, 3, 11);
  aad[8] = type;
  aad.writeUInt16BE(DTLS_1_2, 9);
  aad.writeUInt16BE(plaintext.length, 11);
  const nonce = Buffer.allocUnsafe(12);
  keys.salt.copy(nonce, 0);
  out.copy(nonce, 4, 3, 11);
  const cipher = createCipheriv('aes-128-ccm', keys.writeKey, nonce, { authTagLength: TAG_BYTES });
  cipher.setAAD(aad, { plaintextLength: plaintext.length });
  let at = RECORD_HEADER_BYTES + EXPLICIT_NONCE_BYTES;
  at += cipher.update(plaintext).copy(out, at);
  at += cipher.final().copy(out, at);
  cipher.getAuthTag().copy(out, at);
  return out;
}

function openCcm8(keys: RecordKeys, rec: WireRecord): Buffer | undefined {
  const length = rec.fragment.length - EXPLICIT_NONCE_BYTES - TAG_BYTES;
  if (length < 0) return undefined;
  const explicit = rec.fragment.subarray(0, EXPLICIT_NONCE_BYTES);
  const aad = Buffer.alloc(13);
  rec.seqNum.copy(aad, 0);
  aad[8] = rec.type;
  aad.writeUInt16BE(rec.version, 9);
  aad.writeUInt16BE(length, 11);
  const decipher = createDecipheriv('aes-128-ccm', keys.writeKey, Buffer.concat([keys.salt, explicit]), {
    authTagLength: TAG_BYTES,
  });
  decipher.setAuthTag(rec.fragment.subarray(rec.fragment.length - TAG_BYTES));
  decipher.setAAD(aad, { plaintextLength: length });
  const plaintext = decipher.update(
    rec.fragment.subarray(EXPLICIT_NONCE_BYTES, EXPLICIT_NONCE_BYTES + length),
  );
  try {
    decipher.final();
  } catch {
    return undefined; // the tag does not verify
  }
  return plaintext;
}

/** The extension types of a hello body whose extensions block (uint16 length, then extensions) starts at `at`. */
function extensionTypes(body: Buffer, at: number): Set<number> {
  const types = new Set<number>();
  if (at + 2 > body.length) return types;
  const end = Math.min(body.length, at + 2 + body.readUInt16BE(at));
  for (let p = at + 2; p + 4 <= end; p += 4 + body.readUInt16BE(p + 2)) types.add(body.readUInt16BE(p));
  return types;
}

// ---------------------------------------------------------------------------------------------------------
// The client

export interface ReceivedAlert {
  /** 0: sent in the clear; 1: under the session's keys (and it verified). */
  epoch: number;
  level: number;
  description: number;
}

export interface PskClientOptions {
  /** The server's UDP port (on `host`, 127.0.0.1 unless told). */
  port: number;
  host?: string;
  /** Any 127.0.0.0/8 address on Linux: the server sees it as a source address of its own. */
  bindAddress?: string;
  bindPort?: number;
  /**
   * Share this socket instead of binding one: a second client on the same address and port (an attacker on
   * the path, who can send from and receive at the victim's address). close() leaves a shared socket open.
   */
  socket?: dgram.Socket;
  /**
   * Keep every datagram sent and received in `sent` and `received` (default true). A benchmark holding
   * thousands of sessions for many notifications turns it off.
   */
  keepDatagrams?: boolean;
}

type Result<T> = { done: T } | undefined;

export class PskClient {
  /** Every datagram sent, in order. */
  readonly sent: Buffer[] = [];
  /** Every datagram received, in order. */
  readonly received: Buffer[] = [];
  /** Alerts received: epoch 0 ones as they came, epoch 1 ones once they verified under our keys. */
  readonly alerts: ReceivedAlert[] = [];
  /** Application data received (epoch 1, verified), unless onApplicationData takes it. */
  readonly appData: Buffer[] = [];
  /** When set, verified application data goes here as it arrives instead of into `appData`. */
  onApplicationData: ((plaintext: Buffer) => void) | undefined;
  random: Buffer = randomBytes(32);
  cookie: Buffer = Buffer.alloc(0);
  /** The ClientHello datagram that carried the cookie, as sent (a replay test sends it again). */
  cookieHello?: Buffer;
  /** Whether the server agreed to the extended master secret (RFC 7627). */
  extendedMasterSecret = false;
  /** message_seq of the Finished once made (finishedDatagram). */
  finishedMessageSeq?: number;

  private readonly handshakes0: HandshakeMessage[] = [];
  private readonly handshakes1: HandshakeMessage[] = [];
  private offerEms = false;
  private epoch0Seq = 0;
  private epoch1Seq = 0;
  private messageSeq = 0;
  private transcript: Buffer[] = [];
  private serverRandom?: Buffer;
  private master?: Buffer;
  private clientKeys?: RecordKeys;
  private serverKeys?: RecordKeys;
  private finished?: Buffer;
  private expectedServerVerify?: Buffer;
  private appRead = 0;
  private connected = false;
  private readonly onMessage = (m: Buffer): void => this.receive(m);

  private constructor(
    readonly socket: dgram.Socket,
    private readonly serverPort: number,
    private readonly serverHost: string,
    private readonly ownsSocket: boolean,
    private readonly keepDatagrams: boolean,
  ) {
    socket.on('message', this.onMessage);
  }

  static async open(opts: PskClientOptions): Promise<PskClient> {
    const host = opts.host ?? '127.0.0.1';
    const keep = opts.keepDatagrams ?? true;
    if (opts.socket !== undefined) return new PskClient(opts.socket, opts.port, host, false, keep);
    const socket = dgram.createSocket('udp4');
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject);
      socket.bind(opts.bindPort ?? 0, opts.bindAddress ?? '127.0.0.1', () => {
        socket.off('error', reject);
        resolve();
      });
    });
    return new PskClient(socket, opts.port, host, true, keep);
  }

  get address(): { address: string; port: number } {
    return this.socket.address();
  }

  /** Whether a close_notify came under the session's keys. */
  get closeNotified(): boolean {
    return this.alerts.some((a) => a.epoch === 1 && a.description === AlertDescription.closeNotify);
  }

  /** Sends raw bytes to the server from this client's address and port. */
  send(datagram: Buffer): void {
    if (this.keepDatagrams) this.sent.push(datagram);
    if (this.connected) this.socket.send(datagram);
    else this.socket.send(datagram, this.serverPort, this.serverHost);
  }

  /**
   * Connects this client's own socket to the server, so that a send resolves no address and the kernel
   * delivers it only the server's datagrams (a benchmark's many sessions; not for a shared socket).
   */
  async connectSocket(): Promise<void> {
    if (!this.ownsSocket) throw new Error('a shared socket is not connected');
    await new Promise<void>((resolve) => this.socket.connect(this.serverPort, this.serverHost, resolve));
    this.connected = true;
  }

  /** An epoch 0 record with this client's next epoch 0 sequence number (not sent). */
  record(type: number, fragment: Buffer): Buffer {
    return encodeRecord(type, 0, this.epoch0Seq++, fragment);
  }

  /** An epoch 1 record under this client's keys with its next epoch 1 sequence number (not sent). */
  protect(type: number, plaintext: Buffer): Buffer {
    if (this.clientKeys === undefined) throw new Error('no keys yet: keyExchange() first');
    return sealCcm8Record(this.clientKeys, 1, this.epoch1Seq++, type, plaintext);
  }

  /** ClientHello without a cookie → HelloVerifyRequest (RFC 6347 §4.2.1). Returns the cookie. */
  async requestCookie(opts: { ems?: boolean; random?: Buffer; timeoutMs?: number } = {}): Promise<Buffer> {
    if (opts.random !== undefined) this.random = Buffer.from(opts.random);
    this.offerEms = opts.ems ?? false;
    this.cookie = Buffer.alloc(0);
    this.messageSeq = 0;
    const from = this.handshakes0.length;
    this.send(this.record(ContentType.handshake, this.clientHello()));
    const hvr = await this.awaitHandshake([HandshakeType.helloVerifyRequest], from, opts.timeoutMs ?? 3000);
    this.cookie = Buffer.from(hvr.body.subarray(3, 3 + hvr.body[2]!));
    return this.cookie;
  }

  /**
   * The ClientHello with the cookie → ServerHello, ServerHelloDone. Rejects if a HelloVerifyRequest answers
   * instead (the cookie was refused; its new cookie is taken, so calling again retries). Returns the datagram.
   */
  async helloWithCookie(opts: { timeoutMs?: number } = {}): Promise<Buffer> {
    const ch = this.clientHello();
    const datagram = this.record(ContentType.handshake, ch);
    this.cookieHello = datagram;
    const from = this.handshakes0.length;
    this.send(datagram);
    await this.awaitServerHello(ch, from, opts.timeoutMs ?? 3000);
    return datagram;
  }

  /** requestCookie + helloWithCookie. Returns the cookie-bearing ClientHello datagram. */
  async hello(opts: { ems?: boolean; random?: Buffer; timeoutMs?: number } = {}): Promise<Buffer> {
    await this.requestCookie(opts);
    return this.helloWithCookie(opts);
  }

  /**
   * Sends a recorded cookie-bearing ClientHello datagram (someone else's) as it is, and goes on from it as if
   * it were this client's own: its random, its cookie, its message_seq; resolves on the server's flight.
   */
  async replayHello(datagram: Buffer, opts: { timeoutMs?: number } = {}): Promise<void> {
    const rec = parseRecords(datagram).find((r) => r.type === ContentType.handshake && r.epoch === 0);
    const ch = rec && parseHandshakes(rec.fragment).find((m) => m.msgType === HandshakeType.clientHello);
    if (ch === undefined) throw new Error('not a ClientHello datagram');
    const body = ch.body;
    this.random = Buffer.from(body.subarray(2, 34));
    const sessionIdEnd = 35 + body[34]!;
    const cookieEnd = sessionIdEnd + 1 + body[sessionIdEnd]!;
    this.cookie = Buffer.from(body.subarray(sessionIdEnd + 1, cookieEnd));
    const suitesEnd = cookieEnd + 2 + body.readUInt16BE(cookieEnd);
    const compressionEnd = suitesEnd + 1 + body[suitesEnd]!;
    this.offerEms = extensionTypes(body, compressionEnd).has(EXT_EXTENDED_MASTER_SECRET);
    this.messageSeq = ch.messageSeq + 1;
    this.cookieHello = datagram;
    const from = this.handshakes0.length;
    this.send(datagram);
    await this.awaitServerHello(ch.whole, from, opts.timeoutMs ?? 3000);
  }

  /**
   * ClientKeyExchange (RFC 4279 §2: the identity) and ChangeCipherSpec in one datagram; derives the master
   * secret and the keys. Returns the datagram.
   */
  keyExchange(identity: string, key: Buffer): Buffer {
    if (this.serverRandom === undefined) throw new Error('no ServerHello yet');
    const id = Buffer.from(identity, 'utf8');
    const body = Buffer.alloc(2 + id.length);
    body.writeUInt16BE(id.length, 0);
    id.copy(body, 2);
    const cke = encodeHandshake(HandshakeType.clientKeyExchange, this.messageSeq++, body);
    this.transcript.push(cke);
    const premaster = pskPremasterSecret(key);
    this.master = this.extendedMasterSecret
      ? prf(premaster, 'extended master secret', sha256(this.transcript), 48)
      : prf(premaster, 'master secret', Buffer.concat([this.random, this.serverRandom]), 48);
    // RFC 5246 §6.3: the AEAD suite has no MAC keys; keys 16 bytes, fixed IVs 4 (RFC 6655 §3).
    const block = prf(this.master, 'key expansion', Buffer.concat([this.serverRandom, this.random]), 40);
    this.clientKeys = { writeKey: createSecretKey(block.subarray(0, 16)), salt: block.subarray(32, 36) };
    this.serverKeys = { writeKey: createSecretKey(block.subarray(16, 32)), salt: block.subarray(36, 40) };
    this.epoch1Seq = 0;
    this.finished = undefined;
    const datagram = Buffer.concat([
      this.record(ContentType.handshake, cke),
      this.record(ContentType.changeCipherSpec, Buffer.from([1])),
    ]);
    this.send(datagram);
    return datagram;
  }

  /** The client's Finished as an epoch 1 record, not sent (the same bytes on every call). */
  finishedDatagram(): Buffer {
    if (this.finished !== undefined) return this.finished;
    if (this.master === undefined) throw new Error('no keys yet: keyExchange() first');
    const verify = prf(this.master, 'client finished', sha256(this.transcript), 12);
    this.finishedMessageSeq = this.messageSeq++;
    const fin = encodeHandshake(HandshakeType.finished, this.finishedMessageSeq, verify);
    this.transcript.push(fin);
    this.expectedServerVerify = prf(this.master, 'server finished', sha256(this.transcript), 12);
    this.finished = this.protect(ContentType.handshake, fin);
    return this.finished;
  }

  /**
   * Sends the Finished (the one finishedDatagram made, else a new one) and waits for the server's Finished,
   * which must verify. Rejects on a fatal alert (received at any time in this handshake) or a timeout.
   */
  async finish(opts: { timeoutMs?: number } = {}): Promise<void> {
    const datagram = this.finishedDatagram();
    const from = this.handshakes1.length;
    this.send(datagram);
    const fin = await this.until(
      (): Result<HandshakeMessage> => {
        const m = this.handshakes1.slice(from).find((x) => x.msgType === HandshakeType.finished);
        return m && { done: m };
      },
      opts.timeoutMs ?? 3000,
      'no server Finished',
    );
    if (!fin.body.equals(this.expectedServerVerify!)) throw new Error('the server Finished does not verify');
  }

  /** A whole handshake. */
  async connect(
    identity: string,
    key: Buffer,
    opts: { ems?: boolean; timeoutMs?: number } = {},
  ): Promise<void> {
    await this.hello(opts);
    this.keyExchange(identity, key);
    await this.finish(opts);
  }

  sendApp(data: Buffer): void {
    this.send(this.protect(ContentType.applicationData, data));
  }

  /** The next application data record not yet read. */
  async nextApp(timeoutMs = 3000): Promise<Buffer> {
    const data = await this.until(
      (): Result<Buffer> =>
        this.appData.length > this.appRead ? { done: this.appData[this.appRead]! } : undefined,
      timeoutMs,
      'no application data',
      false,
    );
    this.appRead++;
    return data;
  }

  /** Sends `data` and resolves with the next application data record received after it. */
  async request(data: Buffer, timeoutMs = 3000): Promise<Buffer> {
    this.appRead = this.appData.length;
    this.sendApp(data);
    return this.nextApp(timeoutMs);
  }

  close(): void {
    this.socket.off('message', this.onMessage);
    if (!this.ownsSocket) return;
    try {
      this.socket.close();
    } catch {
      // already closed
    }
  }

  // -------------------------------------------------------------------------------------------------------

  /** RFC 5246 §7.4.1.2 / RFC 6347 §4.2.1: version, random, session_id, cookie, suites, compression, extensions. */
  private clientHello(): Buffer {
    const exts = this.offerEms ? Buffer.from([0x00, 0x04, 0x00, 0x17, 0x00, 0x00]) : Buffer.alloc(0);
    const body = Buffer.concat([
      Buffer.from([DTLS_1_2 >> 8, DTLS_1_2 & 0xff]),
      this.random,
      Buffer.from([0]), // session_id
      Buffer.from([this.cookie.length]),
      this.cookie,
      Buffer.from([0, 2, TLS_PSK_WITH_AES_128_CCM_8 >> 8, TLS_PSK_WITH_AES_128_CCM_8 & 0xff]),
      Buffer.from([1, 0]), // compression: null
      exts,
    ]);
    return encodeHandshake(HandshakeType.clientHello, this.messageSeq++, body);
  }

  /** ServerHello + ServerHelloDone after `ch` was sent; the transcript starts at `ch` (RFC 6347 §4.2.6). */
  private async awaitServerHello(ch: Buffer, from: number, timeoutMs: number): Promise<void> {
    const first = await this.awaitHandshake(
      [HandshakeType.serverHello, HandshakeType.helloVerifyRequest],
      from,
      timeoutMs,
    );
    if (first.msgType === HandshakeType.helloVerifyRequest) {
      this.cookie = Buffer.from(first.body.subarray(3, 3 + first.body[2]!));
      throw new Error('answered with a new HelloVerifyRequest, not a ServerHello');
    }
    const done = await this.awaitHandshake([HandshakeType.serverHelloDone], from, timeoutMs);
    const sh = first.body;
    const sessionIdEnd = 35 + sh[34]!;
    const suite = sh.readUInt16BE(sessionIdEnd);
    if (suite !== TLS_PSK_WITH_AES_128_CCM_8) throw new Error(`the server chose suite ${suite.toString(16)}`);
    const ems = extensionTypes(sh, sessionIdEnd + 3).has(EXT_EXTENDED_MASTER_SECRET); // after suite, compression
    if (ems && !this.offerEms) throw new Error('extended_master_secret in the ServerHello, not offered');
    this.extendedMasterSecret = ems;
    this.serverRandom = Buffer.from(sh.subarray(2, 34));
    this.transcript = [ch, first.whole, done.whole];
  }

  private async awaitHandshake(types: number[], from: number, timeoutMs: number): Promise<HandshakeMessage> {
    return this.until(
      (): Result<HandshakeMessage> => {
        const m = this.handshakes0.slice(from).find((x) => types.includes(x.msgType));
        return m && { done: m };
      },
      timeoutMs,
      `no handshake message of type ${types.join(' or ')}`,
      false,
    );
  }

  /** Polls `check`; rejects on a timeout, and on any fatal alert received unless `fatalAlerts` is false. */
  private async until<T>(
    check: () => Result<T>,
    timeoutMs: number,
    what: string,
    fatalAlerts = true,
  ): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const r = check();
      if (r !== undefined) return r.done;
      const fatal = fatalAlerts ? this.alerts.find((a) => a.level === AlertLevel.fatal) : undefined;
      if (fatal !== undefined) throw new Error(`fatal alert ${fatal.description} (epoch ${fatal.epoch})`);
      if (Date.now() > deadline) {
        const alerts = this.alerts.map((a) => `${a.level}/${a.description}@${a.epoch}`).join(', ');
        throw new Error(`${what} within ${timeoutMs} ms (alerts received: ${alerts || 'none'})`);
      }
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }

  private receive(datagram: Buffer): void {
    if (this.keepDatagrams) this.received.push(datagram);
    for (const rec of parseRecords(datagram)) {
      let plaintext: Buffer | undefined;
      if (rec.epoch === 0) plaintext = rec.fragment;
      else if (rec.epoch === 1 && this.serverKeys !== undefined) plaintext = openCcm8(this.serverKeys, rec);
      if (plaintext === undefined) continue; // not ours (another client on a shared socket) or forged
      switch (rec.type) {
        case ContentType.alert:
          if (plaintext.length === 2)
            this.alerts.push({ epoch: rec.epoch, level: plaintext[0]!, description: plaintext[1]! });
          break;
        case ContentType.handshake:
          (rec.epoch === 0 ? this.handshakes0 : this.handshakes1).push(...parseHandshakes(plaintext));
          break;
        case ContentType.applicationData:
          if (rec.epoch !== 1) break;
          if (this.onApplicationData !== undefined) this.onApplicationData(plaintext);
          else this.appData.push(plaintext);
          break;
        default:
          break;
      }
    }
  }
}
