// The third, cold review of src/dtls (after the second-pass fixes): its proofs of concept as tests, each now
// asserting the defence. N1/N2: an attacker without a key, naming a known identity or an unknown one, holding
// the handshake table; N3: a ClientKeyExchange forged before the client's own (whole, fragmented, or repeated);
// N5: one key behind a shared address pushing its neighbours out.
import { randomBytes } from 'node:crypto';
import { ContentType, DTLS_1_2, HandshakeType } from '../src/dtls/constants.js';
import { encodeHandshake } from '../src/dtls/handshake.js';
import { encodeRecord } from '../src/dtls/record.js';
import { IDENTITY, KEY, sleep, startEchoServer, waitFor } from './support/dtls.js';
import type { TestServer } from './support/dtls.js';
import { PskClient } from './support/psk-client.js';

let t: TestServer | undefined;

afterEach(async () => {
  PskClient.closeAll();
  await t?.server.close();
  t = undefined;
});

const client = (bindAddress = '127.0.0.1'): Promise<PskClient> =>
  PskClient.open({ port: t!.port, bindAddress });

function ckeBody(identity: string): Buffer {
  const id = Buffer.from(identity, 'utf8');
  return Buffer.concat([Buffer.from([id.length >> 8, id.length & 0xff]), id]);
}

/** A cookie round trip and a ClientKeyExchange naming `identity` with a wrong key; no Finished. */
async function park(address: string, identity: string): Promise<void> {
  const c = await client(address);
  await c.hello({ timeoutMs: 2000 });
  c.keyExchange(identity, randomBytes(32));
}

async function fill(n: number, net: number, identity: string): Promise<void> {
  for (let i = 0; i < n; i += 25)
    await Promise.all(
      Array.from({ length: Math.min(25, n - i) }, (_, j) =>
        park(`127.${net}.${Math.floor((i + j) / 16) + 1}.1`, identity),
      ),
    );
  await waitFor(() => t!.server.snapshot().handshakes === n, 5000, 'the table full');
}

describe('N1, N2: a full table of keyless handshakes', () => {
  it('handshakes naming a known identity without its key do not lock a device out', async () => {
    t = await startEchoServer({ maxHandshakes: 160 });
    await fill(160, 10, IDENTITY);
    const device = await client('127.99.0.1');
    await device.connect(IDENTITY, KEY);
    expect((await device.request(Buffer.from('in'))).toString()).toBe('echo:in');
  });

  it('one more keyless handshake does not evict a device in the middle of its handshake', async () => {
    t = await startEchoServer({ maxHandshakes: 160 });
    await fill(160, 20, 'nobody');
    const device = await client('127.98.0.1');
    await device.hello();
    await park('127.97.0.1', 'nobody');
    device.keyExchange(IDENTITY, KEY);
    await device.finish();
    expect(t.started).toHaveLength(1);
  });

  it('a handshake past its ClientKeyExchange ends after unauthenticatedTimeoutMs without a Finished', async () => {
    t = await startEchoServer({ unauthenticatedTimeoutMs: 300 });
    await park('127.0.0.1', IDENTITY);
    await waitFor(() => t!.server.snapshot().handshakes === 0, 3000, 'the parked handshake ended');
    expect(t.server.stats.handshakeFailures.unauthenticated_timeout).toBe(1);
  });
});

describe('N4: nothing depends on whether an identity exists', () => {
  it('invalidating a key keeps a handshake in progress that named an unknown identity, like any other', async () => {
    t = await startEchoServer();
    await park('127.0.0.1', 'nobody');
    await waitFor(() => t!.server.stats.recordsReceived >= 4, 2000, 'the key exchange');
    expect(t.server.invalidateCredentials(['cred-1'])).toBe(0);
    expect(t.server.revalidate()).toBe(0);
    expect(t.server.snapshot().handshakes).toBe(1);
  });
});

describe('N3: a ClientKeyExchange forged before the client’s own', () => {
  const forge = (c: PskClient, fragment: Buffer): void =>
    void c.socket.send(encodeRecord(ContentType.handshake, DTLS_1_2, 0, 77, fragment), t!.port, '127.0.0.1');

  it('a whole one: the client’s Finished shows which key exchange is its own', async () => {
    t = await startEchoServer();
    const c = await client();
    await c.hello();
    forge(c, encodeHandshake(HandshakeType.clientKeyExchange, 2, ckeBody('x')));
    await sleep(20);
    c.keyExchange(IDENTITY, KEY);
    await c.finish();
    expect(t.started).toHaveLength(1);
  });

  it('a first fragment of another length does not keep the whole one out', async () => {
    t = await startEchoServer();
    const c = await client();
    await c.hello();
    const body = ckeBody('x'.repeat(100));
    forge(
      c,
      Buffer.concat([
        Buffer.from([HandshakeType.clientKeyExchange, 0, 0, body.length, 0, 2, 0, 0, 0, 0, 0, 10]),
        body.subarray(0, 10),
      ]),
    );
    await sleep(20);
    c.keyExchange(IDENTITY, KEY);
    await c.finish();
    expect(t.started).toHaveLength(1);
  });

  it('a forged copy of the client’s ClientKeyExchange and a forged epoch 1 record do not end it', async () => {
    t = await startEchoServer();
    const c = await client();
    await c.hello();
    c.keyExchange(IDENTITY, KEY);
    await sleep(30);
    c.socket.send(encodeRecord(ContentType.handshake, DTLS_1_2, 1, 5, randomBytes(40)), t.port, '127.0.0.1');
    forge(c, encodeHandshake(HandshakeType.clientKeyExchange, 2, ckeBody(IDENTITY)));
    await sleep(30);
    await c.finish();
    expect(t.started).toHaveLength(1);
    expect(t.server.stats.alertsSent.decryptError).toBe(0);
  });
});

describe('N5: one key behind a shared address', () => {
  it('at a full address, a key that holds a session there displaces its own, not its neighbours', async () => {
    t = await startEchoServer({ maxSessionsPerAddress: 4 });
    for (let i = 2; i <= 4; i++)
      t.credentials.set(`dev${i}`, {
        credentialId: `cred-${i}`,
        identity: `dev${i}`,
        key: KEY,
        deviceId: `d${i}`,
      });
    const neighbours = await Promise.all(
      ['dev2', 'dev3', 'dev4'].map(async (id) => {
        const c = await client();
        await c.connect(id, KEY);
        return c;
      }),
    );
    // The attacker's key (IDENTITY) opens sessions from the same address, over and over.
    for (let k = 0; k < 4; k++) {
      const a = await client();
      await a.connect(IDENTITY, KEY);
      await sleep(10);
    }
    // One neighbour made room for the attacker's first session; after that it displaced its own.
    const evicted = t.ended.filter((e) => e.reason === 'evicted').map((e) => e.session.identity);
    expect(evicted.filter((id) => id !== IDENTITY).length).toBeLessThanOrEqual(1);
    expect(
      neighbours.filter((c) => !c.alerts.some((x) => x.epoch === 1 && x.description === 0)).length,
    ).toBeGreaterThanOrEqual(2);
  });
});

describe('N6: no reflection before the cookie', () => {
  it('ClientHellos repeating a handshake’s random draw at most one resend of flight 4 per half timeout', async () => {
    t = await startEchoServer();
    const c = await client();
    await c.hello();
    const before = t.server.stats.retransmissions;
    // An on-path copy of the random in cookie-less ClientHellos, 50 of them.
    const spoofed = c.record(
      ContentType.handshake,
      encodeHandshake(HandshakeType.clientHello, 1, c.helloBody()),
    );
    for (let i = 0; i < 50; i++) c.socket.send(spoofed, t.port, '127.0.0.1');
    await sleep(100);
    expect(t.server.stats.retransmissions - before).toBeLessThanOrEqual(1);
  });
});
