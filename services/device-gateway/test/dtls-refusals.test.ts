// What the server refuses and what it survives: wrong keys and unknown identities (the same alert),
// suites it does not speak, cookieless hellos (no state), replayed, altered, truncated and garbled
// records, renegotiation; and its timers and limits: retransmission, handshake deadline, idle timeout,
// replacement of a session by a new handshake from the same address and port, per-address and total caps.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import { ContentType, HandshakeType } from '../src/dtls/constants.js';
import { encodeHandshake } from '../src/dtls/handshake.js';
import { encodeRecord, parseRecords } from '../src/dtls/record.js';
import {
  IDENTITY,
  KEY_HEX,
  Relay,
  connectNodeClient,
  dropNodeClient,
  gnutlsArgs,
  opensslArgs,
  runTool,
  sleep,
  startEchoServer,
  waitFor,
  clientHello,
} from './support/dtls.js';
import type { TestServer } from './support/dtls.js';

let t: TestServer;

afterEach(async () => {
  await t.server.close();
});

/** The cookie of a HelloVerifyRequest datagram (RFC 6347 §4.2.1), with its record fields. */
function parseHvr(d: Buffer): { cookie: Buffer; version: number; seq: number } {
  const rec = parseRecords(d).records[0]!;
  expect(rec.fragment[0]).toBe(HandshakeType.helloVerifyRequest);
  const body = rec.fragment.subarray(12);
  return { cookie: body.subarray(3, 3 + body[2]!), version: rec.version, seq: rec.seq };
}

async function udpClient(): Promise<{ socket: dgram.Socket; inbox: Buffer[] }> {
  const socket = dgram.createSocket('udp4');
  const inbox: Buffer[] = [];
  socket.on('message', (m) => inbox.push(m));
  await new Promise<void>((r) => socket.bind(0, '127.0.0.1', r));
  return { socket, inbox };
}

describe('authentication failures look the same', () => {
  it('wrong key and unknown identity both end in decrypt_error with no session (openssl and gnutls)', async () => {
    t = await startEchoServer();
    const wrongKey = Buffer.from('not-the-right-key-0123456789abcd').toString('hex');
    const runs = [
      await runTool('openssl', opensslArgs(t.port, IDENTITY, wrongKey), 'x\n', undefined),
      await runTool('openssl', opensslArgs(t.port, 'nobody-here', KEY_HEX), 'x\n', undefined),
      await runTool('gnutls-cli', gnutlsArgs(t.port, IDENTITY, wrongKey), 'x\n', undefined),
      await runTool('gnutls-cli', gnutlsArgs(t.port, 'nobody-here', KEY_HEX), 'x\n', undefined),
    ];
    expect(runs[0]!.output).toContain('SSL alert number 51');
    expect(runs[1]!.output).toContain('SSL alert number 51');
    expect(runs[2]!.output).toMatch(/Received alert \[51\]: Decrypt error/);
    expect(runs[3]!.output).toMatch(/Received alert \[51\]: Decrypt error/);
    expect(t.started).toHaveLength(0);
    expect(t.received).toHaveLength(0);
    expect(t.server.stats.handshakeFailures.decrypt_error).toBe(4);
    expect(t.server.stats.alertsSent.decryptError).toBe(4);
    expect(t.server.snapshot()).toMatchObject({ sessions: 0, handshakes: 0, addresses: 0 });
  });

  it('a revoked credential (lookup returns nothing) fails like an unknown identity', async () => {
    t = await startEchoServer();
    t.credentials.clear();
    const run = await runTool('openssl', opensslArgs(t.port, IDENTITY, KEY_HEX), 'x\n', undefined);
    expect(run.output).toContain('SSL alert number 51');
    expect(t.started).toHaveLength(0);
  });
});

describe('negotiation refusals', () => {
  it('a client without our suite gets handshake_failure', async () => {
    t = await startEchoServer();
    const run = await runTool(
      'openssl',
      opensslArgs(t.port, IDENTITY, KEY_HEX, 'PSK-AES128-GCM-SHA256'),
      'x\n',
      undefined,
    );
    expect(run.output).toContain('SSL alert number 40');
    expect(t.server.stats.handshakeFailures.handshake_failure).toBe(1);
    expect(t.server.stats.handshakesStarted).toBe(0);
  });

  it('a renegotiation attempt in a session gets no_renegotiation', async () => {
    t = await startEchoServer();
    // s_client renegotiates on a line "R" (once the session is up); OpenSSL then gives the connection up.
    const child = spawn('openssl', opensslArgs(t.port, IDENTITY, KEY_HEX), {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let output = '';
    const collect = (d: Buffer): void => {
      output += d.toString();
    };
    child.stdout.on('data', collect);
    child.stderr.on('data', collect);
    const exited = new Promise<void>((r) => child.on('close', () => r()));
    try {
      child.stdin.write('hello\n');
      await waitFor(() => output.includes('echo:hello'), 5000, 'echo');
      child.stdin.write('R\n');
      await waitFor(() => output.includes('no renegotiation'), 5000, 'no_renegotiation');
    } finally {
      child.kill();
      await exited;
    }
    expect(output).toContain('RENEGOTIATING');
    expect(t.server.stats.alertsSent.noRenegotiation).toBe(1);
    expect(t.server.stats.handshakesStarted).toBe(1);
  });
});

describe('stateless cookie exchange', () => {
  it('1,000 ClientHellos without cookie get HelloVerifyRequests and leave no state', async () => {
    t = await startEchoServer();
    const clients = await Promise.all(Array.from({ length: 10 }, () => udpClient()));
    const answered = (): number => clients.reduce((n, c) => n + c.inbox.length, 0);
    // The server shares this thread: each batch of 100 is answered before the next is sent, so a loaded
    // machine cannot overflow a socket's receive buffer and turn a lost datagram into a failed test.
    for (let i = 0; i < 1000; i++) {
      clients[i % 10]!.socket.send(clientHello({ recordSeq: i }), t.port, '127.0.0.1');
      if (i % 100 === 99) await waitFor(() => answered() >= i + 1, 10_000, `${i + 1} HelloVerifyRequests`);
    }
    expect(t.server.stats.cookiesSent).toBe(1000);
    expect(t.server.snapshot()).toEqual({ sessions: 0, handshakes: 0, addresses: 0, reassemblyBytes: 0 });
    // RFC 6347 §4.2.1: version {254, 255} and the ClientHello's record sequence number.
    const hvr = parseHvr(clients[3]!.inbox[0]!);
    expect(hvr.version).toBe(0xfeff);
    expect(hvr.seq % 10).toBe(3);
    expect(hvr.cookie).toHaveLength(32);
    for (const c of clients) c.socket.close();
  });

  it('a wrong cookie is counted and answered with a fresh HelloVerifyRequest; the right one starts a handshake', async () => {
    t = await startEchoServer({ handshakeTimeoutMs: 400, retransmitInitialMs: 100 });
    const c = await udpClient();
    const random = randomBytes(32);
    c.socket.send(clientHello({ random }), t.port, '127.0.0.1');
    await waitFor(() => c.inbox.length === 1);
    const { cookie } = parseHvr(c.inbox[0]!);
    const bad = Buffer.from(cookie);
    bad[5]! ^= 0x40;
    c.socket.send(clientHello({ random, cookie: bad, recordSeq: 1, messageSeq: 1 }), t.port, '127.0.0.1');
    await waitFor(() => c.inbox.length === 2);
    expect(t.server.stats.badCookies).toBe(1);
    expect(t.server.snapshot().handshakes).toBe(0);
    c.socket.send(clientHello({ random, cookie, recordSeq: 2, messageSeq: 1 }), t.port, '127.0.0.1');
    await waitFor(() => c.inbox.length === 3);
    const flight = parseRecords(c.inbox[2]!).records;
    expect(flight.map((r) => r.fragment[0])).toEqual([
      HandshakeType.serverHello,
      HandshakeType.serverHelloDone,
    ]);
    // ServerHello's message_seq continues from the ClientHello's (RFC 6347 §4.2.2).
    expect(flight.map((r) => r.fragment.readUInt16BE(4))).toEqual([1, 2]);
    expect(t.server.snapshot()).toMatchObject({ handshakes: 1, addresses: 1 });
    // Nobody answers: the flight is retransmitted with doubling timeouts (RFC 6347 §4.2.4.1), each with
    // new record sequence numbers, until the handshake deadline ends it.
    await waitFor(() => t.server.snapshot().handshakes === 0, 3000, 'handshake deadline');
    expect(t.server.stats.handshakeFailures.timeout).toBe(1);
    expect(t.server.stats.retransmissions).toBeGreaterThanOrEqual(1);
    const seqs = c.inbox.slice(2).flatMap((d) => parseRecords(d).records.map((r) => r.seq));
    expect(new Set(seqs).size).toBe(seqs.length);
    expect(t.server.snapshot()).toEqual({ sessions: 0, handshakes: 0, addresses: 0, reassemblyBytes: 0 });
    c.socket.close();
  });

  it('keeps no state for a fragmented ClientHello or one whose record number leaves no room (near 2^48)', async () => {
    t = await startEchoServer();
    const c = await udpClient();
    const random = randomBytes(32);
    const top = 2 ** 48 - 1;
    c.socket.send(clientHello({ random, recordSeq: top }), t.port, '127.0.0.1');
    await waitFor(() => c.inbox.length === 1);
    const { cookie, seq } = parseHvr(c.inbox[0]!);
    expect(seq).toBe(top);
    c.socket.send(clientHello({ random, cookie, recordSeq: top, messageSeq: 1 }), t.port, '127.0.0.1');
    // A ClientHello cut in two fragments: the stateless exchange does not reassemble.
    const whole = parseRecords(clientHello({ random, cookie, recordSeq: 5, messageSeq: 1 })).records[0]!
      .fragment;
    const body = whole.subarray(12);
    const half = Math.floor(body.length / 2);
    const part = (off: number, chunk: Buffer): Buffer => {
      const h = Buffer.from(whole.subarray(0, 12));
      h.writeUIntBE(off, 6, 3);
      h.writeUIntBE(chunk.length, 9, 3);
      return encodeRecord(ContentType.handshake, 0xfefd, 0, 6 + off, Buffer.concat([h, chunk]));
    };
    c.socket.send(
      Buffer.concat([part(0, body.subarray(0, half)), part(half, body.subarray(half))]),
      t.port,
      '127.0.0.1',
    );
    await waitFor(() => t.server.stats.recordsDropped.fragmented_client_hello === 2, 2000, 'fragment drops');
    await waitFor(() => t.server.stats.recordsDropped.malformed === 1, 2000, 'seq drop');
    expect(t.server.snapshot()).toEqual({ sessions: 0, handshakes: 0, addresses: 0, reassemblyBytes: 0 });
    expect(t.server.stats.internalErrors).toBe(0);
    c.socket.close();
  });
});

describe('records on the path', () => {
  it('drops replayed, altered, truncated and garbled records; the session survives and keeps working', async () => {
    t = await startEchoServer();
    const relay = new Relay(t.port);
    const relayPort = await relay.start();
    try {
      const c = await connectNodeClient(relayPort);
      expect((await c.request(Buffer.from('a'))).toString()).toBe('echo:a');
      const dataRecord = relay.clientToServer.at(-1)!;
      expect(dataRecord[0]).toBe(ContentType.applicationData);
      const stats = t.server.stats;

      // Replay (RFC 6347 §4.1.2.6).
      relay.inject(dataRecord);
      await waitFor(() => stats.recordsDropped.replay === 1, 2000, 'replay drop');

      // One flipped bit in a fresh record: it fails authentication and is dropped silently.
      relay.onClientDatagram = (d) => {
        const bad = Buffer.from(d);
        bad[bad.length - 3]! ^= 0x10;
        relay.onClientDatagram = (x) => x;
        return bad;
      };
      c.socket.send(Buffer.from('b'));
      await waitFor(() => stats.recordsDropped.mac === 1, 2000, 'mac drop');
      expect(t.server.stats.alertsSent.badRecordMac).toBe(0);

      // Truncated, garbled and misplaced records from the client's address.
      const garbage = [
        dataRecord.subarray(0, 20),
        dataRecord.subarray(0, 12),
        Buffer.concat([dataRecord.subarray(0, 11), Buffer.from([0xff, 0xff])]),
        randomBytes(64),
        Buffer.concat([dataRecord.subarray(0, 3), Buffer.from([0, 7]), dataRecord.subarray(5)]), // epoch 7
        encodeRecord(ContentType.handshake, 0xfefd, 0, 99, Buffer.from('10000100000100000000ffff', 'hex')),
        encodeRecord(ContentType.handshake, 0xfefd, 0, 99, encodeHandshake(16, 2, Buffer.from([0, 3, 1]))),
        encodeRecord(ContentType.handshake, 0xfefd, 1, 99, randomBytes(40)),
        encodeRecord(ContentType.changeCipherSpec, 0xfefd, 0, 99, Buffer.from([1])),
        // An unauthenticated fatal alert must not end an established session.
        encodeRecord(ContentType.alert, 0xfefd, 0, 100, Buffer.from([2, 40])),
        encodeRecord(ContentType.applicationData, 0xfefd, 0, 101, Buffer.from('plaintext')),
        Buffer.alloc(0),
      ];
      for (const g of garbage) relay.inject(g);
      await sleep(200);

      expect((await c.request(Buffer.from('c'))).toString()).toBe('echo:c');
      expect(t.received.map((r) => r.data.toString())).toEqual(['a', 'c']);
      expect(t.started).toHaveLength(1);
      expect(t.ended).toHaveLength(0);
      expect(stats.internalErrors).toBe(0);
      expect(stats.recordsDropped.malformed).toBeGreaterThanOrEqual(4);
      expect(stats.recordsDropped.epoch).toBeGreaterThanOrEqual(2);
      c.socket.close();
    } finally {
      relay.close();
    }
  });
});

describe('timers', () => {
  it('resends our lost flight on its timer (node-dtls-client never retransmits)', async () => {
    t = await startEchoServer({ retransmitInitialMs: 200 });
    const relay = new Relay(t.port);
    const relayPort = await relay.start();
    let dropped = 0;
    relay.onServerDatagram = (d) => {
      const first = parseRecords(d).records[0];
      if (
        dropped === 0 &&
        first?.type === ContentType.handshake &&
        first.fragment[0] === HandshakeType.serverHello
      ) {
        dropped++;
        return null;
      }
      return d;
    };
    try {
      const c = await connectNodeClient(relayPort, { timeout: 4000 });
      expect(dropped).toBe(1);
      expect(t.server.stats.retransmissions).toBeGreaterThanOrEqual(1);
      expect((await c.request(Buffer.from('late'))).toString()).toBe('echo:late');
      c.socket.close();
    } finally {
      relay.close();
    }
  });

  it('resends our final flight when the client retransmits its Finished (openssl, its own timer)', async () => {
    t = await startEchoServer();
    const relay = new Relay(t.port);
    const relayPort = await relay.start();
    let dropped = 0;
    relay.onServerDatagram = (d) => {
      if (dropped === 0 && d[0] === ContentType.changeCipherSpec) {
        dropped++;
        return null;
      }
      return d;
    };
    try {
      const run = await runTool(
        'openssl',
        opensslArgs(relayPort, IDENTITY, KEY_HEX),
        'after loss\n',
        /echo:after loss/,
      );
      expect(dropped).toBe(1);
      expect(run.output).toContain('echo:after loss');
      expect(t.server.stats.retransmissions).toBeGreaterThanOrEqual(1);
      expect(t.server.stats.handshakesCompleted).toBe(1);
    } finally {
      relay.close();
    }
  });

  it('ends sessions without traffic after the idle timeout, with close_notify', async () => {
    t = await startEchoServer({ idleTimeoutMs: 300, idleSweepIntervalMs: 50 });
    const c = await connectNodeClient(t.port);
    expect((await c.request(Buffer.from('x'))).toString()).toBe('echo:x');
    await waitFor(() => t.ended.length === 1, 3000, 'idle end');
    expect(t.ended[0]!.reason).toBe('idle');
    await waitFor(() => c.closed, 2000, 'client saw close_notify');
  });
});

describe('sessions and limits', () => {
  it('a new handshake from the address and port of a live session replaces it once complete (RFC 6347 §4.2.8)', async () => {
    t = await startEchoServer();
    const probe = dgram.createSocket('udp4');
    await new Promise<void>((r) => probe.bind(0, '127.0.0.1', r));
    const port = probe.address().port;
    await new Promise<void>((r) => probe.close(() => r()));

    const a = await connectNodeClient(t.port, { listenPort: port });
    expect((await a.request(Buffer.from('from a'))).toString()).toBe('echo:from a');
    dropNodeClient(a); // the device reboots: no close_notify
    await sleep(50);
    const b = await connectNodeClient(t.port, { listenPort: port });
    expect((await b.request(Buffer.from('from b'))).toString()).toBe('echo:from b');
    expect(t.started).toHaveLength(2);
    expect(t.started[0]).not.toBe(t.started[1]);
    expect(t.started[0]!.key).toBe(t.started[1]!.key);
    expect(t.ended).toEqual([{ session: t.started[0], reason: 'replaced' }]);
    expect(t.server.snapshot()).toMatchObject({ sessions: 1, handshakes: 0, addresses: 1 });
    b.socket.close();
  });

  it('past a session cap the least recently active session ends (close_notify, evicted), and close() ends all', async () => {
    t = await startEchoServer({ maxSessionsPerAddress: 2, maxSessions: 3, maxSessionsPerCredential: 10 });
    const one = await connectNodeClient(t.port);
    const two = await connectNodeClient(t.port);
    // `one` talks after `two` connected: `two` is now the least recently active of this address.
    await sleep(20);
    expect((await one.request(Buffer.from('still here'))).toString()).toBe('echo:still here');
    const three = await connectNodeClient(t.port);
    await waitFor(() => two.closed, 2000, 'close_notify to the evicted session');
    expect(t.ended.map((e) => [e.session, e.reason])).toEqual([[t.started[1], 'evicted']]);
    expect((await one.request(Buffer.from('a'))).toString()).toBe('echo:a');
    expect((await three.request(Buffer.from('b'))).toString()).toBe('echo:b');
    expect(t.server.stats.sessionsEnded.evicted).toBe(1);
    expect(t.server.snapshot()).toMatchObject({ sessions: 2, handshakes: 0, addresses: 1 });
    await t.server.close();
    await waitFor(() => one.closed && three.closed, 2000, 'close_notify to every client');
    expect(t.ended.map((e) => e.reason)).toEqual(['evicted', 'server_close', 'server_close']);

    t = await startEchoServer({ maxSessionsPerAddress: 10, maxSessions: 1 });
    const first = await connectNodeClient(t.port);
    const second = await connectNodeClient(t.port);
    await waitFor(() => first.closed, 2000, 'the total cap evicts the older session');
    expect((await second.request(Buffer.from('c'))).toString()).toBe('echo:c');
    expect(t.server.stats.sessionsEnded.evicted).toBe(1);
    second.socket.close();
  });
});
