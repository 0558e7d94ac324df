// A scriptable DTLS 1.2 PSK client (TLS_PSK_WITH_AES_128_CCM_8) over a real UDP socket, for the attack tests:
// it stops wherever a test says (after the cookie exchange, after ClientKeyExchange + ChangeCipherSpec with
// its Finished held back), can send anything from the client's own address and port, and can bind any
// 127.0.0.0/8 address so that the server sees distinct source addresses. Interoperability is proven by the
// independent clients (dtls-interop.test.ts); this one exists to misbehave on purpose, built on the primitives
// that dtls-primitives.test.ts checks against published vectors.
import { createHash, randomBytes, type Hash } from 'node:crypto';
import dgram from 'node:dgram';
import { ContentType, DTLS_1_2, HandshakeType } from '../../src/dtls/constants.js';
import {
  KeyBlock,
  extendedMasterSecret,
  finishedVerifyData,
  keyBlock,
  masterSecret,
  openCcm8,
  pskPremaster,
  sealCcm8,
} from '../../src/dtls/crypto.js';
import { encodeHandshake, parseHandshakeFragments } from '../../src/dtls/handshake.js';
import { encodeRecord, parseRecords } from '../../src/dtls/record.js';
import type { DtlsRecord } from '../../src/dtls/record.js';

const EXT_EMS = Buffer.from([0x00, 0x17, 0x00, 0x00]);

/** Every client opened and not yet closed by closeAll. */
const opened: PskClient[] = [];

export interface ReceivedAlert {
  epoch: number;
  level: number;
  description: number;
}

export class PskClient {
  readonly inbox: Buffer[] = [];
  readonly alerts: ReceivedAlert[] = [];
  readonly appData: Buffer[] = [];
  /** The datagrams this client sent, in order (a test replays them). */
  readonly sent: Buffer[] = [];
  readonly random: Buffer;
  cookie = Buffer.alloc(0);
  private readonly transcript: Hash = createHash('sha256');
  private epoch0Seq = 0;
  private epoch1Seq = 0;
  private messageSeq = 0;
  private serverRandom?: Buffer;
  private ems = false;
  private keys?: Buffer;
  private master?: Buffer;
  private serverFinished?: Buffer;

  private constructor(
    readonly socket: dgram.Socket,
    readonly serverPort: number,
    opts: { random?: Buffer },
  ) {
    this.random = opts.random ?? randomBytes(32);
    socket.on('message', (m) => this.receive(m));
  }

  static async open(opts: {
    port: number;
    bindAddress?: string;
    bindPort?: number;
    random?: Buffer;
  }): Promise<PskClient> {
    const socket = dgram.createSocket('udp4');
    await new Promise<void>((resolve) =>
      socket.bind(opts.bindPort ?? 0, opts.bindAddress ?? '127.0.0.1', resolve),
    );
    const client = new PskClient(socket, opts.port, opts);
    opened.push(client);
    return client;
  }

  /** Closes every client opened since the last call (a test's afterEach). */
  static closeAll(): void {
    for (const c of opened.splice(0)) c.close();
  }

  get address(): { address: string; port: number } {
    return this.socket.address();
  }

  /** Copies of this connection's secrets (master secret, key block), for tests that look for leaks. */
  secrets(): Buffer[] {
    return [this.master, this.keys].filter((b): b is Buffer => b !== undefined).map((b) => Buffer.from(b));
  }

  /** Sends raw bytes to the server from this client's address and port. */
  send(datagram: Buffer): void {
    this.sent.push(datagram);
    this.socket.send(datagram, this.serverPort, '127.0.0.1');
  }

  /** The ClientHello body (RFC 5246 §7.4.1.2) with this client's random and the current cookie. */
  helloBody(): Buffer {
    return Buffer.concat([
      Buffer.from([0xfe, 0xfd]),
      this.random,
      Buffer.from([0, this.cookie.length]),
      this.cookie,
      Buffer.from([0, 2, 0xc0, 0xa8, 1, 0]),
      ...(this.ems ? [Buffer.from([0, EXT_EMS.length]), EXT_EMS] : []),
    ]);
  }

  /**
   * ClientHello → HelloVerifyRequest → ClientHello with the cookie → ServerHello + ServerHelloDone. Returns the
   * cookie-bearing ClientHello datagram (a replay test sends it again).
   */
  async hello(opts: { ems?: boolean; timeoutMs?: number } = {}): Promise<Buffer> {
    this.ems = opts.ems ?? false;
    const timeoutMs = opts.timeoutMs ?? 3000;
    const first = this.inbox.length;
    this.send(
      this.record(ContentType.handshake, encodeHandshake(HandshakeType.clientHello, 0, this.helloBody())),
    );
    const hvr = await this.waitForHandshake(HandshakeType.helloVerifyRequest, first, timeoutMs);
    this.cookie = Buffer.from(hvr.subarray(3, 3 + hvr[2]!));
    return this.helloWithCookie(timeoutMs);
  }

  /** Sends the ClientHello with the current cookie and waits for flight 4. */
  async helloWithCookie(timeoutMs = 3000): Promise<Buffer> {
    const from = this.inbox.length;
    this.messageSeq = 1;
    const body = this.helloBody();
    const ch = encodeHandshake(HandshakeType.clientHello, this.messageSeq++, body);
    const datagram = this.record(ContentType.handshake, ch);
    this.send(datagram);
    const sh = await this.waitForHandshake(HandshakeType.serverHello, from, timeoutMs);
    await this.waitForHandshake(HandshakeType.serverHelloDone, from, timeoutMs);
    this.serverRandom = Buffer.from(sh.subarray(2, 34));
    // RFC 6347 §4.2.6: the transcript starts at the ClientHello with the cookie.
    this.transcript.update(ch);
    this.transcript.update(encodeHandshake(HandshakeType.serverHello, 1, sh));
    this.transcript.update(encodeHandshake(HandshakeType.serverHelloDone, 2, Buffer.alloc(0)));
    // Each side numbers its own messages (RFC 6347 §4.2.2): ClientHello 0 and 1, then ours go on from 2.
    this.messageSeq = 2;
    return datagram;
  }

  /** ClientKeyExchange + ChangeCipherSpec in one datagram; derives the keys. Returns the datagram. */
  keyExchange(identity: string, key: Buffer): Buffer {
    const id = Buffer.from(identity, 'utf8');
    const body = Buffer.concat([Buffer.from([id.length >> 8, id.length & 0xff]), id]);
    const cke = encodeHandshake(HandshakeType.clientKeyExchange, this.messageSeq++, body);
    this.transcript.update(cke);
    const sessionHash = this.transcript.copy().digest();
    const premaster = pskPremaster(key);
    this.master = this.ems
      ? extendedMasterSecret(premaster, sessionHash)
      : masterSecret(premaster, this.random, this.serverRandom!);
    this.keys = keyBlock(this.master, this.random, this.serverRandom!);
    const datagram = Buffer.concat([
      this.record(ContentType.handshake, cke),
      this.record(ContentType.changeCipherSpec, Buffer.from([1])),
    ]);
    this.send(datagram);
    return datagram;
  }

  /** The client's Finished as an epoch 1 record, not sent (a test holds it back). */
  finishedDatagram(): Buffer {
    const verify = finishedVerifyData(this.master!, 'client', this.transcript.copy().digest());
    const fin = encodeHandshake(HandshakeType.finished, this.messageSeq++, verify);
    this.transcript.update(fin);
    this.serverFinished = finishedVerifyData(this.master!, 'server', this.transcript.copy().digest());
    return this.protect(ContentType.handshake, fin);
  }

  /** Sends a Finished (the held one, or a new one) and waits for the server's verified Finished. */
  async finish(held = this.finishedDatagram(), timeoutMs = 3000): Promise<void> {
    const from = this.inbox.length;
    this.send(held);
    const until = Date.now() + timeoutMs;
    for (;;) {
      for (const d of this.inbox.slice(from)) {
        for (const rec of parseRecords(d).records) {
          if (rec.epoch !== 1 || rec.type !== ContentType.handshake) continue;
          const plain = this.open(rec);
          const f = plain && parseHandshakeFragments(plain)?.[0];
          if (f?.msgType === HandshakeType.finished) {
            if (!f.body.equals(this.serverFinished!)) throw new Error('server Finished does not verify');
            return;
          }
        }
      }
      if (this.alerts.some((a) => a.level === 2))
        throw new Error(`fatal alert ${this.alerts.at(-1)!.description}`);
      if (Date.now() > until) throw new Error('no server Finished');
      await new Promise((r) => setTimeout(r, 10));
    }
  }

  /** A full handshake with this client's key. */
  async connect(identity: string, key: Buffer, opts: { ems?: boolean } = {}): Promise<void> {
    await this.hello(opts);
    this.keyExchange(identity, key);
    await this.finish();
  }

  sendApp(data: Buffer): void {
    this.send(this.protect(ContentType.applicationData, data));
  }

  /** Sends `data` and waits for the next application data record. */
  async request(data: Buffer, timeoutMs = 3000): Promise<Buffer> {
    const before = this.appData.length;
    this.sendApp(data);
    const until = Date.now() + timeoutMs;
    while (this.appData.length === before) {
      if (Date.now() > until) throw new Error('no answer');
      await new Promise((r) => setTimeout(r, 10));
    }
    return this.appData[before]!;
  }

  /** An epoch 1 record of this client's connection. */
  protect(type: number, plaintext: Buffer): Buffer {
    const keys = this.keys!;
    const seq = this.epoch1Seq++;
    const fragment = sealCcm8(
      keys.subarray(KeyBlock.clientWriteKey, KeyBlock.clientWriteKey + 16),
      keys.subarray(KeyBlock.clientWriteIv, KeyBlock.clientWriteIv + 4),
      1,
      seq,
      type,
      DTLS_1_2,
      plaintext,
    );
    return encodeRecord(type, DTLS_1_2, 1, seq, fragment);
  }

  /** An epoch 0 record with this client's next sequence number. */
  record(type: number, fragment: Buffer): Buffer {
    return encodeRecord(type, DTLS_1_2, 0, this.epoch0Seq++, fragment);
  }

  close(): void {
    try {
      this.socket.close();
    } catch {
      // already closed
    }
  }

  private open(rec: DtlsRecord): Buffer | undefined {
    const keys = this.keys;
    if (keys === undefined) return undefined;
    return openCcm8(
      keys.subarray(KeyBlock.serverWriteKey, KeyBlock.serverWriteKey + 16),
      keys.subarray(KeyBlock.serverWriteIv, KeyBlock.serverWriteIv + 4),
      rec.epoch,
      rec.seq,
      rec.type,
      rec.version,
      rec.fragment,
    );
  }

  private receive(datagram: Buffer): void {
    this.inbox.push(datagram);
    for (const rec of parseRecords(datagram).records) {
      if (rec.type === ContentType.alert) {
        const plain = rec.epoch === 0 ? rec.fragment : this.open(rec);
        if (plain?.length === 2)
          this.alerts.push({ epoch: rec.epoch, level: plain[0]!, description: plain[1]! });
      } else if (rec.type === ContentType.applicationData && rec.epoch === 1) {
        const plain = this.open(rec);
        if (plain !== undefined) this.appData.push(plain);
      }
    }
  }

  private async waitForHandshake(msgType: number, from: number, timeoutMs: number): Promise<Buffer> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      for (const d of this.inbox.slice(from)) {
        for (const rec of parseRecords(d).records) {
          if (rec.epoch !== 0 || rec.type !== ContentType.handshake) continue;
          const f = parseHandshakeFragments(rec.fragment)?.find((x) => x.msgType === msgType);
          if (f !== undefined) return Buffer.from(f.body);
        }
      }
      if (Date.now() > until) throw new Error(`no handshake message ${msgType}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }
}
