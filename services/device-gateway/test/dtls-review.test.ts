// Review findings against RFC 6347: what an unverified or merely cookie-verified peer can make the server
// send, hold or count. Each test drives the server over real UDP (or its socket's handler) the way a
// hostile peer would: several ClientHellos in one datagram, a ClientHello whose message_seq leaves no
// room, epoch 1 records padded out to a whole datagram before the ChangeCipherSpec, a source port of 0.
import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import { ContentType, HandshakeType } from '../src/dtls/constants.js';
import { encodeHandshake } from '../src/dtls/handshake.js';
import { encodeRecord, parseRecords } from '../src/dtls/record.js';
import type { DtlsRecord } from '../src/dtls/record.js';
import {
  IDENTITY,
  Relay,
  clientHello,
  connectNodeClient,
  sleep,
  startEchoServer,
  waitFor,
} from './support/dtls.js';
import type { TestServer } from './support/dtls.js';

let t: TestServer;
/** Raw client sockets of the current test, closed even when it fails. */
let sockets: dgram.Socket[] = [];

afterEach(async () => {
  for (const s of sockets) s.close();
  sockets = [];
  await t.server.close();
});

function hvrCookie(d: Buffer): Buffer {
  const rec = parseRecords(d).records[0]!;
  expect(rec.fragment[0]).toBe(HandshakeType.helloVerifyRequest);
  const body = rec.fragment.subarray(12);
  return body.subarray(3, 3 + body[2]!);
}

async function udpClient(): Promise<{ socket: dgram.Socket; inbox: Buffer[]; send(d: Buffer): void }> {
  const socket = dgram.createSocket('udp4');
  const inbox: Buffer[] = [];
  socket.on('message', (m) => inbox.push(m));
  await new Promise<void>((r) => socket.bind(0, '127.0.0.1', r));
  sockets.push(socket);
  return { socket, inbox, send: (d) => socket.send(d, t.port, '127.0.0.1') };
}

/** The server's handshakes in progress (white box: the early-record buffer is not observable otherwise). */
function handshakes(): Map<string, { state: string; early: DtlsRecord[] }> {
  return (t.server as unknown as { handshakes: Map<string, { state: string; early: DtlsRecord[] }> })
    .handshakes;
}

describe('RFC 6347 §4.2.1: no amplification towards unverified addresses', () => {
  it('answers one ClientHello per datagram, however many records it carries', async () => {
    t = await startEchoServer();
    const c = await udpClient();
    // 20 minimal ClientHellos (67-byte records) in one datagram; each HelloVerifyRequest (60 bytes) would
    // be a datagram of its own, so more packets and, with UDP/IP headers, more bytes than came in.
    c.send(Buffer.concat(Array.from({ length: 20 }, (_, i) => clientHello({ recordSeq: i }))));
    await waitFor(() => t.server.stats.recordsReceived >= 20, 2000, 'the records');
    await waitFor(() => c.inbox.length >= 1, 2000, 'a HelloVerifyRequest');
    await sleep(200);
    expect(c.inbox).toHaveLength(1);
    expect(t.server.stats.cookiesSent).toBe(1);
    expect(t.server.snapshot()).toEqual({ sessions: 0, handshakes: 0, addresses: 0, reassemblyBytes: 0 });
  });
});

describe('RFC 6347 §4.2.2: message_seq', () => {
  it('a ClientHello whose message_seq leaves no room is dropped before it touches the peer’s state', async () => {
    t = await startEchoServer({ maxSessionsPerAddress: 1, handshakeTimeoutMs: 300 });
    const c = await udpClient();
    // A first handshake, cookie-verified.
    const r1 = randomBytes(32);
    c.send(clientHello({ random: r1 }));
    await waitFor(() => c.inbox.length === 1, 2000, 'HelloVerifyRequest 1');
    c.send(clientHello({ random: r1, cookie: hvrCookie(c.inbox[0]!), recordSeq: 1, messageSeq: 1 }));
    await waitFor(() => t.server.snapshot().handshakes === 1, 2000, 'handshake 1');
    // A second ClientHello from the same address and port, with its own valid cookie and message_seq
    // 2^16 - 1: ServerHelloDone would need 2^16.
    const r2 = randomBytes(32);
    c.send(clientHello({ random: r2, recordSeq: 2 }));
    await waitFor(() => c.inbox.length >= 3, 2000, 'HelloVerifyRequest 2');
    const hvr2 = c.inbox.find((d, i) => i > 0 && parseRecords(d).records[0]!.fragment[0] === 3)!;
    const before = t.server.stats.recordsReceived;
    c.send(clientHello({ random: r2, cookie: hvrCookie(hvr2), recordSeq: 3, messageSeq: 0xffff }));
    await waitFor(() => t.server.stats.recordsReceived > before, 2000, 'the ClientHello');
    expect(t.server.stats.internalErrors).toBe(0);
    // Once the first handshake times out, nothing of this peer is left: its address slot is free again.
    await waitFor(() => t.server.snapshot().handshakes === 0, 3000, 'handshake deadline');
    expect(t.server.snapshot()).toEqual({ sessions: 0, handshakes: 0, addresses: 0, reassemblyBytes: 0 });
    const client = await connectNodeClient(t.port, { timeout: 2000 });
    expect((await client.request(Buffer.from('after'))).toString()).toBe('echo:after');
    client.socket.close();
  });
});

describe('RFC 6347 §4.1 / §4.2.3: epoch 1 records buffered before the ChangeCipherSpec', () => {
  /** Drives a raw handshake to the point where the server awaits the client's ChangeCipherSpec. */
  async function toAwaitCcs(): Promise<Awaited<ReturnType<typeof udpClient>>> {
    const c = await udpClient();
    const random = randomBytes(32);
    c.send(clientHello({ random }));
    await waitFor(() => c.inbox.length === 1, 2000, 'HelloVerifyRequest');
    c.send(clientHello({ random, cookie: hvrCookie(c.inbox[0]!), recordSeq: 1, messageSeq: 1 }));
    await waitFor(() => handshakes().size === 1, 2000, 'handshake');
    const identity = Buffer.from(IDENTITY);
    const cke = Buffer.concat([Buffer.from([0, identity.length]), identity]);
    c.send(encodeRecord(22, 0xfefd, 0, 2, encodeHandshake(HandshakeType.clientKeyExchange, 2, cke)));
    await waitFor(() => [...handshakes().values()][0]?.state === 'await_ccs', 2000, 'await_ccs');
    return c;
  }

  it('keeps bounded copies, not whole datagrams, within the per-peer budget', async () => {
    t = await startEchoServer();
    const budget = 8192; // defaultDtlsOptions.maxPendingBytesPerPeer
    const c = await toAwaitCcs();
    const malformedBefore = t.server.stats.recordsDropped.malformed;
    // Two small epoch 1 records, each padded by garbage to a datagram of 60,000 bytes (the parser keeps
    // the records before the garbage), then two records of 16 KB.
    for (let i = 0; i < 2; i++) {
      const rec = encodeRecord(22, 0xfefd, 1, 10 + i, randomBytes(40));
      c.send(Buffer.concat([rec, Buffer.alloc(60_000 - rec.length)]));
    }
    for (let i = 0; i < 2; i++) c.send(encodeRecord(22, 0xfefd, 1, 20 + i, randomBytes(16_000)));
    await waitFor(
      () => t.server.stats.recordsDropped.malformed >= malformedBefore + 2,
      2000,
      'the padded datagrams',
    );
    await waitFor(() => t.server.stats.recordsReceived >= 7, 2000, 'the large records');
    const early = [...handshakes().values()][0]!.early;
    const held = new Set(early.map((r) => r.fragment.buffer));
    const heldBytes = [...held].reduce((n, b) => n + b.byteLength, 0);
    expect(heldBytes).toBeLessThanOrEqual(budget);
    expect(t.server.stats.internalErrors).toBe(0);
  });

  it('still completes a handshake whose Finished arrives before the ChangeCipherSpec', async () => {
    t = await startEchoServer();
    const relay = new Relay(t.port);
    const relayPort = await relay.start();
    // Move every ChangeCipherSpec of the client behind its next epoch 1 record.
    let held: Buffer[] = [];
    let reordered = 0;
    const raw = (r: DtlsRecord): Buffer => encodeRecord(r.type, r.version, r.epoch, r.seq, r.fragment);
    relay.onClientDatagram = (d) => {
      const recs = parseRecords(d).records;
      held.push(...recs.filter((r) => r.type === ContentType.changeCipherSpec).map(raw));
      const rest = recs.filter((r) => r.type !== ContentType.changeCipherSpec);
      if (rest.length === 0) return null;
      const out = [...rest.map(raw)];
      if (held.length > 0 && rest.some((r) => r.epoch === 1)) {
        out.push(...held);
        held = [];
        reordered++;
      }
      return Buffer.concat(out);
    };
    try {
      const c = await connectNodeClient(relayPort);
      expect(reordered).toBe(1);
      expect((await c.request(Buffer.from('early'))).toString()).toBe('echo:early');
      expect(t.server.stats.handshakesCompleted).toBe(1);
      c.socket.close();
    } finally {
      relay.close();
    }
  });
});

describe('RFC 768: source port 0', () => {
  it('a datagram from port 0 is dropped, not an internal error (dgram cannot answer it)', async () => {
    t = await startEchoServer();
    // A spoofed source port 0 reaches the socket like any datagram; the handler runs synchronously.
    const socket = (t.server as unknown as { socket: dgram.Socket }).socket;
    const d = clientHello({});
    socket.emit('message', d, { address: '127.0.0.1', port: 0, family: 'IPv4', size: d.length });
    expect(t.server.stats.internalErrors).toBe(0);
    expect(t.server.stats.cookiesSent).toBe(0);
  });
});

describe('record size (RFC 5246 §6.2.1)', () => {
  it('drops an authentic record carrying more than 2^14 bytes; the session goes on', async () => {
    t = await startEchoServer();
    const c = await connectNodeClient(t.port);
    try {
      const before = t.server.stats.recordsDropped.malformed;
      c.socket.send(Buffer.alloc(16_385, 0x61));
      await waitFor(
        () => t.server.stats.recordsDropped.malformed > before,
        3000,
        'the oversized record dropped',
      );
      expect(t.received).toHaveLength(0);
      expect(t.server.stats.internalErrors).toBe(0);
      // Exactly 2^14 is allowed, and the session still answers.
      expect((await c.request(Buffer.alloc(16_379, 0x62))).length).toBe(16_384);
      expect((await c.request(Buffer.from('after'))).toString()).toBe('echo:after');
    } finally {
      c.socket.close();
    }
  });
});

describe('key objects of quiet sessions (record-layer.ts)', () => {
  it('a session quiet for two idle sweeps drops its key objects and makes them again on its next record', async () => {
    t = await startEchoServer({ idleSweepIntervalMs: 50 });
    const c = await connectNodeClient(t.port);
    try {
      expect((await c.request(Buffer.from('one'))).toString()).toBe('echo:one');
      // White box: the key objects are not observable from outside, only their memory is (bench:dtls).
      const state = (): { keys?: unknown } =>
        (
          t.server as unknown as { store: { sessions: Map<string, { state: { keys?: unknown } }> } }
        ).store.sessions
          .values()
          .next().value!.state;
      expect(state().keys).toBeDefined();
      await waitFor(() => state().keys === undefined, 2000, 'the key objects released');
      expect((await c.request(Buffer.from('two'))).toString()).toBe('echo:two');
      expect(state().keys).toBeDefined();
    } finally {
      c.socket.close();
    }
  });
});
