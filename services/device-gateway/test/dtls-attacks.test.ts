// The attacks of the second independent review of src/dtls (issue: device security, second pass), each
// reproduced over real UDP sockets with a scripted client (support/psk-client.ts), then the defence checked.
import { ContentType, HandshakeType } from '../src/dtls/constants.js';
import { encodeHandshake } from '../src/dtls/handshake.js';
import { encodeRecord } from '../src/dtls/record.js';
import { IDENTITY, KEY, connectNodeClient, sleep, startEchoServer, waitFor } from './support/dtls.js';
import type { TestServer } from './support/dtls.js';
import { PskClient } from './support/psk-client.js';

let t: TestServer | undefined;
let clients: PskClient[] = [];

afterEach(async () => {
  for (const c of clients) c.close();
  clients = [];
  await t?.server.close();
  t = undefined;
});

async function client(opts: { bindAddress?: string; bindPort?: number } = {}): Promise<PskClient> {
  const c = await PskClient.open({ port: t!.port, ...opts });
  clients.push(c);
  return c;
}

describe('1. a revoked or expired key cannot finish a handshake, nor keep a session', () => {
  it('a handshake parked after ClientKeyExchange fails at Finished once its key is revoked', async () => {
    t = await startEchoServer();
    const c = await client();
    await c.hello();
    c.keyExchange(IDENTITY, KEY);
    const held = c.finishedDatagram();
    await waitFor(() => t!.server.stats.recordsReceived >= 4, 2000, 'the key exchange');
    t.credentials.delete(IDENTITY); // revoked: the lookup no longer returns it
    await expect(c.finish(held)).rejects.toThrow(/fatal alert 51/); // decrypt_error, as for a wrong key
    expect(t.started).toHaveLength(0);
    expect(t.server.snapshot().sessions).toBe(0);
    expect(t.server.stats.handshakeFailures.credential_invalid).toBe(1);
  });

  it('the same when not_after passes while the handshake is parked', async () => {
    const notAfter = Date.now() + 400;
    t = await startEchoServer();
    const credential = t.credentials.get(IDENTITY)!;
    t.credentials.clear();
    const lookup = {
      get: (identity: string) => (identity === IDENTITY && Date.now() < notAfter ? credential : undefined),
    };
    (t.server.options as { lookupPsk: (i: string) => unknown }).lookupPsk = (i) => lookup.get(i);
    const c = await client();
    await c.hello();
    c.keyExchange(IDENTITY, KEY);
    const held = c.finishedDatagram();
    await sleep(Math.max(0, notAfter - Date.now()) + 50);
    await expect(c.finish(held)).rejects.toThrow(/fatal alert 51/);
    expect(t.started).toHaveLength(0);
  });

  it('invalidation abandons the handshakes in progress that use the key', async () => {
    t = await startEchoServer();
    const c = await client();
    await c.hello();
    c.keyExchange(IDENTITY, KEY);
    await waitFor(
      () => t!.server.snapshot().handshakes === 1 && t!.server.stats.recordsReceived >= 4,
      2000,
      'CKE',
    );
    await sleep(50);
    expect(t.server.invalidateCredentials(['cred-1'])).toBe(1);
    expect(t.server.snapshot().handshakes).toBe(0);
    t.credentials.delete(IDENTITY);
    // revalidate() finds the same by itself.
    const d = await client();
    await d.hello();
    t.credentials.set(IDENTITY, {
      credentialId: 'cred-1',
      identity: IDENTITY,
      key: KEY,
      deviceId: 'device-1',
    });
    d.keyExchange(IDENTITY, KEY);
    await sleep(100);
    t.credentials.delete(IDENTITY);
    expect(t.server.revalidate()).toBe(1);
    expect(t.server.snapshot().handshakes).toBe(0);
    expect(t.server.stats.handshakeFailures.credential_invalid).toBe(2);
  });

  it('a session whose key stopped being valid ends by the periodic check, with no event at all', async () => {
    t = await startEchoServer({ credentialCheckIntervalMs: 200 });
    const c = await client();
    await c.connect(IDENTITY, KEY);
    expect((await c.request(Buffer.from('hi'))).toString()).toBe('echo:hi');
    t.credentials.delete(IDENTITY); // nobody calls endSessions, invalidateCredentials or revalidate
    await waitFor(() => t!.ended.length === 1, 3000, 'the session ended');
    expect(t.ended[0]!.reason).toBe('revoked');
    await waitFor(() => c.alerts.some((a) => a.epoch === 1 && a.description === 0), 2000, 'close_notify');
  });
});

describe('2. the handshake table cannot be held full without a key', () => {
  it('while attackers on 8 addresses refill it with cookie round trips, devices still connect', async () => {
    // 8 addresses × 4 handshakes each (and two attack loops per address) hold more than the 24 slots in all.
    t = await startEchoServer({
      maxHandshakes: 24,
      maxHandshakesPerAddress: 4,
      unauthenticatedTimeoutMs: 1000,
    });
    let attacking = true;
    const attackers = await Promise.all(
      Array.from({ length: 8 }, (_, i) => client({ bindAddress: `127.0.0.${i + 2}` })),
    );
    // Each attacker keeps starting handshakes from new ports of its address (a fresh client = a fresh port).
    const port = t.port;
    const attack = async (address: string): Promise<void> => {
      while (attacking) {
        const a = await PskClient.open({ port, bindAddress: address });
        await a.hello({ timeoutMs: 1000 }).catch(() => undefined);
        a.close();
      }
    };
    const loops = attackers.flatMap((a) => [attack(a.address.address), attack(a.address.address)]);
    await waitFor(() => t!.server.snapshot().handshakes >= 24, 5000, 'the table full');
    try {
      const fresh = await client({ bindAddress: '127.0.0.20' });
      const neighbour = await client({ bindAddress: '127.0.0.2' });
      await Promise.all([fresh.connect(IDENTITY, KEY), neighbour.connect(IDENTITY, KEY)]);
      expect((await fresh.request(Buffer.from('a'))).toString()).toBe('echo:a');
      expect((await neighbour.request(Buffer.from('b'))).toString()).toBe('echo:b');
      expect(t.server.stats.handshakeFailures.evicted).toBeGreaterThan(0);
    } finally {
      attacking = false;
      await Promise.all(loops);
    }
  });

  it('a handshake with no ClientKeyExchange ends after the short deadline', async () => {
    t = await startEchoServer({ unauthenticatedTimeoutMs: 300 });
    const c = await client();
    await c.hello();
    expect(t.server.snapshot().handshakes).toBe(1);
    await waitFor(() => t!.server.snapshot().handshakes === 0, 2000, 'the handshake dropped');
    expect(t.server.stats.handshakeFailures.unauthenticated_timeout).toBe(1);
  });
});

describe('3. one key cannot hold unlimited sessions', () => {
  it('past maxSessionsPerCredential the key’s least recently active session ends with close_notify', async () => {
    t = await startEchoServer({ maxSessionsPerCredential: 2 });
    const [a, b, c] = [await client(), await client(), await client()];
    await a.connect(IDENTITY, KEY);
    await b.connect(IDENTITY, KEY);
    await sleep(20);
    expect((await a.request(Buffer.from('a'))).toString()).toBe('echo:a'); // b is now the least recent
    await c.connect(IDENTITY, KEY);
    await waitFor(
      () => b.alerts.some((x) => x.epoch === 1 && x.description === 0),
      2000,
      'close_notify to b',
    );
    expect(t.ended.map((e) => e.reason)).toEqual(['evicted']);
    expect((await a.request(Buffer.from('a2'))).toString()).toBe('echo:a2');
    expect((await c.request(Buffer.from('c'))).toString()).toBe('echo:c');
  });
});

describe('4. one spoofed datagram does not end a handshake in progress', () => {
  async function parked(): Promise<{ c: PskClient; held: Buffer }> {
    const c = await client();
    await c.hello();
    c.keyExchange(IDENTITY, KEY);
    const held = c.finishedDatagram();
    await waitFor(() => t!.server.stats.recordsReceived >= 4, 2000, 'the key exchange');
    return { c, held };
  }

  it('an epoch 1 record with a bad tag is dropped silently', async () => {
    t = await startEchoServer();
    const { c, held } = await parked();
    const forged = Buffer.from(held);
    forged[forged.length - 1]! ^= 0xff;
    c.send(forged);
    await waitFor(() => t!.server.stats.recordsDropped.mac === 1, 2000, 'the forged record dropped');
    await c.finish(held);
    expect(t.started).toHaveLength(1);
    expect(t.server.stats.alertsSent.decryptError).toBe(0);
  });

  it('an unauthenticated epoch 0 fatal alert ends nothing', async () => {
    t = await startEchoServer();
    const { c, held } = await parked();
    c.send(c.record(ContentType.alert, Buffer.from([2, 40])));
    await sleep(50);
    await c.finish(held);
    expect(t.started).toHaveLength(1);
  });

  it('an epoch 0 fragment cannot take the message_seq the Finished must use', async () => {
    t = await startEchoServer();
    const { c, held } = await parked();
    // The Finished is the client's message 3; a forged epoch 0 "Finished" with that number comes first.
    c.send(c.record(ContentType.handshake, encodeHandshake(HandshakeType.finished, 3, Buffer.alloc(12, 7))));
    await sleep(50);
    await c.finish(held);
    expect(t.started).toHaveLength(1);
    expect(t.server.stats.alertsSent.unexpectedMessage).toBe(0);
  });

  it('a wrong key still gets decrypt_error (its Finished came with the ClientKeyExchange)', async () => {
    t = await startEchoServer();
    await expect(connectNodeClient(t.port, { key: Buffer.alloc(32, 1), timeout: 2000 })).rejects.toThrow();
    expect(t.server.stats.alertsSent.decryptError).toBe(1);
  });

  it('a wrong key whose Finished travels alone gets decrypt_error after the grace period', async () => {
    t = await startEchoServer({ authFailureGraceMs: 200 });
    const c = await client();
    await c.hello();
    c.keyExchange(IDENTITY, Buffer.alloc(32, 1));
    await sleep(20);
    await expect(c.finish()).rejects.toThrow(/fatal alert 51/);
  });
});

describe('5. a replayed ClientHello cannot replace a live session', () => {
  it('the cookie-bearing ClientHello of the live session, replayed from its address, is ignored', async () => {
    t = await startEchoServer();
    const victim = await client();
    const hello = await victim.hello();
    victim.keyExchange(IDENTITY, KEY);
    await victim.finish();
    const started = t.server.stats.handshakesStarted;
    victim.send(hello); // the on-path attacker replays it from the victim's address and port
    await sleep(100);
    expect(t.server.stats.handshakesStarted).toBe(started);
    expect(t.server.snapshot()).toMatchObject({ sessions: 1, handshakes: 0 });
    expect((await victim.request(Buffer.from('still'))).toString()).toBe('echo:still');
  });

  it('a cookie is refused once older than cookieLifetimeMs', async () => {
    t = await startEchoServer({ cookieLifetimeMs: 500 });
    const c = await client();
    const from = c.inbox.length;
    c.send(c.record(ContentType.handshake, encodeHandshake(HandshakeType.clientHello, 0, c.helloBody())));
    await waitFor(() => c.inbox.length > from, 2000, 'HelloVerifyRequest');
    const hvr = c.inbox[from]!.subarray(13 + 12);
    c.cookie = Buffer.from(hvr.subarray(3, 3 + hvr[2]!));
    await sleep(1200);
    const bad = t.server.stats.badCookies;
    c.send(
      encodeRecord(
        ContentType.handshake,
        0xfefd,
        0,
        1,
        encodeHandshake(HandshakeType.clientHello, 1, c.helloBody()),
      ),
    );
    await waitFor(() => t!.server.stats.badCookies === bad + 1, 2000, 'the stale cookie refused');
    expect(t.server.stats.handshakesStarted).toBe(0);
  });
});
