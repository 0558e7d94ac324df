// The five attacks of the second review of src/dtls, each reproduced against DtlsServer over real UDP sockets
// with a scripted client written apart from the server (@platform/testkit/dtls-psk-client), then the defence checked:
//   1. a revoked or expired key finishes a handshake, and a session outlives its key;
//   2. the handshake table is held full by peers that have no key;
//   3. one key holds unlimited sessions (and a full address refuses newcomers instead of making room);
//   4. one spoofed datagram ends a handshake in progress;
//   5. a replayed ClientHello replaces a live session, and cookies live for minutes.
// Assertions compare named objects so that a failure says which defence is missing.
import { randomBytes } from 'node:crypto';
import type { PskCredential } from '../src/dtls/index.js';
import {
  IDENTITY,
  KEY,
  clientHello,
  connectNodeClient,
  sleep,
  startEchoServer,
  waitFor,
} from './support/dtls.js';
import type { TestServer } from './support/dtls.js';
import {
  AlertLevel,
  ContentType,
  HandshakeType,
  PskClient,
  encodeHandshake,
  prf,
} from '@platform/testkit/dtls-psk-client';

const IDENTITY2 = 'dev2-identity';
const KEY2 = Buffer.from('another-key-for-dev2-0123456789ab');
const CREDENTIAL2: PskCredential = {
  credentialId: 'cred-2',
  identity: IDENTITY2,
  key: KEY2,
  deviceId: 'device-2',
};

let t: TestServer | undefined;
let clients: PskClient[] = [];

afterEach(async () => {
  for (const c of clients) c.close();
  clients = [];
  await t?.server.close();
  t = undefined;
});

function server(): TestServer {
  if (t === undefined) throw new Error('no server');
  return t;
}

async function client(opts: { bindAddress?: string; socket?: PskClient['socket'] } = {}): Promise<PskClient> {
  const c = await PskClient.open({ port: server().port, ...opts });
  clients.push(c);
  return c;
}

type Settled = { ok: true } | { ok: false; error: string };

/** How a promise ended, as a value a test can compare. */
async function settle(p: Promise<unknown>): Promise<Settled> {
  try {
    await p;
    return { ok: true };
  } catch (err) {
    return { ok: false, error: (err as Error).message };
  }
}

const failed = { ok: false, error: expect.any(String) };

/** Waits until the server has handled `n` more datagrams than `from` (its handler is synchronous). */
async function handled(from: number, n = 1): Promise<void> {
  await waitFor(() => server().server.stats.datagramsReceived >= from + n, 3000, 'the server to handle it');
}

/**
 * Cookie exchange, then ClientKeyExchange + ChangeCipherSpec, handled by the server; the Finished is made but
 * held back (the handshake is parked right before it would complete).
 */
async function parkBeforeFinished(c: PskClient, identity = IDENTITY, key = KEY): Promise<void> {
  await c.hello();
  const from = server().server.stats.datagramsReceived;
  c.keyExchange(identity, key);
  c.finishedDatagram();
  await handled(from);
}

/** Sends from `c`'s own address and port and waits until the server has handled it. */
async function inject(c: PskClient, datagram: Buffer): Promise<void> {
  const from = server().server.stats.datagramsReceived;
  c.send(datagram);
  await handled(from);
}

const endings = (): [number, string][] => server().ended.map((e) => [e.session.port, e.reason]);

describe('0. the scripted client (support/psk-client.ts)', () => {
  it('its PRF reproduces the published P_SHA256 test vector (RFC 5246 §5)', () => {
    // The vector posted to the IETF TLS list (https://www.ietf.org/mail-archive/web/tls/current/msg03416.html).
    const out = prf(
      Buffer.from('9bbe436ba940f017b17652849a71db35', 'hex'),
      'test label',
      Buffer.from('a0ba9f936cda311827a6f796ffd5198c', 'hex'),
      100,
    );
    expect(out.toString('hex')).toBe(
      'e3f229ba727be17b8d122620557cd453c2aab21d07c3d495329b52d4e61edb5a6b301791e90d35c9c9a46b4e14baf9af' +
        '0fa022f7077def17abfd3797c0564bab4fbc91666e9def9b97fce34f796789baa48082d122ee42c5a72e5a5110fff7' +
        '0187347b66',
    );
  });

  it.each([false, true])(
    'completes a handshake and echoes application data (extended master secret: %s)',
    async (ems) => {
      t = await startEchoServer();
      const c = await client();
      await c.connect(IDENTITY, KEY, { ems });
      expect(c.extendedMasterSecret).toBe(ems);
      expect((await c.request(Buffer.from('ping'))).toString()).toBe('echo:ping');
      expect((await c.request(Buffer.from('pong'))).toString()).toBe('echo:pong');
      expect(t.started.map((s) => s.identity)).toEqual([IDENTITY]);
      expect(c.alerts).toEqual([]);
    },
  );

  it('a wrong key is refused with decrypt_error, the Finished sent on its own', async () => {
    t = await startEchoServer();
    const c = await client();
    await c.hello();
    c.keyExchange(IDENTITY, randomBytes(32));
    await expect(c.finish()).rejects.toThrow(/fatal alert 51/);
    expect(t.started).toHaveLength(0);
  });
});

describe('1. a revoked or expired key cannot finish a handshake, nor keep a session', () => {
  it('(a) a handshake parked after ClientKeyExchange does not complete once its credential is revoked', async () => {
    t = await startEchoServer();
    const c = await client();
    await parkBeforeFinished(c); // the key was valid at ClientKeyExchange
    t.credentials.delete(IDENTITY); // revoked: lookupPsk no longer returns it
    const outcome = await settle(c.finish({ timeoutMs: 1500 }));
    expect({ sessionsStarted: t.started.length, sessions: t.server.snapshot().sessions, outcome }).toEqual({
      sessionsStarted: 0,
      sessions: 0,
      outcome: failed, // a fatal alert, or nothing
    });
    expect(c.alerts.every((a) => a.epoch === 0 && a.level === AlertLevel.fatal)).toBe(true);
  });

  it('(b) the same when the credential’s not_after passes while the handshake is parked', async () => {
    let notAfter = Infinity;
    t = await startEchoServer({
      lookupPsk: (identity) => {
        const credential = server().credentials.get(identity);
        // not_after falls 300 ms after the lookup at ClientKeyExchange (fixed then, so that a slow machine
        // cannot make the key exchange itself come after it).
        if (credential !== undefined && notAfter === Infinity) notAfter = Date.now() + 300;
        return credential !== undefined && Date.now() < notAfter ? credential : undefined;
      },
    });
    const c = await client();
    await parkBeforeFinished(c);
    expect(notAfter).toBeLessThan(Infinity); // looked up, and valid, at ClientKeyExchange
    await sleep(Math.max(0, notAfter - Date.now()) + 100);
    const outcome = await settle(c.finish({ timeoutMs: 1500 }));
    expect({ sessionsStarted: t.started.length, sessions: t.server.snapshot().sessions, outcome }).toEqual({
      sessionsStarted: 0,
      sessions: 0,
      outcome: failed,
    });
  });

  it('(c) revalidate() abandons the handshakes in progress and ends the sessions of a revoked key at once', async () => {
    t = await startEchoServer();
    t.credentials.set(IDENTITY2, CREDENTIAL2);
    const revokedSession = await client();
    await revokedSession.connect(IDENTITY, KEY);
    const otherSession = await client();
    await otherSession.connect(IDENTITY2, KEY2);
    const parked = await client();
    await parkBeforeFinished(parked);
    expect(t.server.snapshot()).toMatchObject({ sessions: 2, handshakes: 1 });
    t.credentials.delete(IDENTITY);
    const n = t.server.revalidate();
    expect({ n, snapshot: t.server.snapshot(), endings: endings() }).toEqual({
      n: 2,
      snapshot: expect.objectContaining({ sessions: 1, handshakes: 0 }),
      endings: [[revokedSession.address.port, 'revoked']],
    });
    await waitFor(() => revokedSession.closeNotified, 2000, 'close_notify to the revoked session');
    expect(await settle(parked.finish({ timeoutMs: 1000 }))).toEqual(failed);
    expect(t.started.map((s) => s.identity)).toEqual([IDENTITY, IDENTITY2]);
    expect((await otherSession.request(Buffer.from('still'))).toString()).toBe('echo:still');
  });

  it('(d) a session whose credential stopped being valid is ended by the periodic check, with no call at all', async () => {
    t = await startEchoServer({ credentialCheckIntervalMs: 200 });
    t.credentials.set(IDENTITY2, CREDENTIAL2);
    const c = await client();
    await c.connect(IDENTITY, KEY);
    const other = await client();
    await other.connect(IDENTITY2, KEY2);
    expect((await c.request(Buffer.from('hi'))).toString()).toBe('echo:hi');
    t.credentials.delete(IDENTITY); // nobody calls endSessions or revalidate
    const ended = await settle(waitFor(() => server().ended.length > 0, 3000, 'a session to end'));
    expect({ ended, endings: endings() }).toEqual({
      ended: { ok: true },
      endings: [[c.address.port, 'revoked']],
    });
    await waitFor(() => c.closeNotified, 2000, 'close_notify');
    expect((await other.request(Buffer.from('ok'))).toString()).toBe('echo:ok');
  });

  it('(e) invalidateCredentials() abandons a parked handshake of the key as well', async () => {
    t = await startEchoServer();
    const c = await client();
    await parkBeforeFinished(c);
    t.credentials.delete(IDENTITY);
    expect(t.server.invalidateCredentials(['cred-1'])).toBe(1);
    expect(t.server.snapshot().handshakes).toBe(0);
    expect(await settle(c.finish({ timeoutMs: 1000 }))).toEqual(failed);
  });
});

describe('2. the handshake table cannot be held full without a key', () => {
  it('attackers on 8 addresses that only make cookie round trips do not keep devices out', async () => {
    // 8 addresses × 4 handshakes each would be 32: more than the 24 slots, so the table stays full while the
    // attack runs. handshakeTimeoutMs stays at its default (30 s): only the new defences can let devices in.
    t = await startEchoServer({
      maxHandshakes: 24,
      maxHandshakesPerAddress: 4,
      unauthenticatedTimeoutMs: 1000,
    });
    const port = t.port;
    let attacking = true;
    let attackerHellos = 0;
    // Each loop starts handshake after handshake from fresh ports of its address, never sending a ClientKeyExchange.
    const attack = async (address: string): Promise<void> => {
      while (attacking) {
        const a = await PskClient.open({ port, bindAddress: address });
        try {
          await a.hello({ timeoutMs: 1000 });
          attackerHellos++;
        } catch {
          // refused (the table is full): try again
        } finally {
          a.close();
        }
      }
    };
    const addresses = Array.from({ length: 8 }, (_, i) => `127.0.0.${i + 2}`);
    const loops = addresses.flatMap((address) => [attack(address), attack(address)]);
    try {
      await waitFor(
        () => server().server.snapshot().handshakes >= 24,
        5000,
        'the attackers to fill the table',
      );
      const before = attackerHellos;
      const fresh = await client({ bindAddress: '127.0.0.20' }); // a device on an address of its own
      const neighbour = await client({ bindAddress: '127.0.0.2' }); // a device behind an attacker's address
      const [freshOutcome, neighbourOutcome] = await Promise.all([
        settle(fresh.connect(IDENTITY, KEY, { timeoutMs: 4000 })),
        settle(neighbour.connect(IDENTITY, KEY, { timeoutMs: 4000 })),
      ]);
      expect({ fresh: freshOutcome, neighbour: neighbourOutcome }).toEqual({
        fresh: { ok: true },
        neighbour: { ok: true },
      });
      expect((await fresh.request(Buffer.from('a'))).toString()).toBe('echo:a');
      expect((await neighbour.request(Buffer.from('b'))).toString()).toBe('echo:b');
      // The attack went on meanwhile (the devices did not get in because it had stopped).
      expect(attackerHellos).toBeGreaterThan(before);
    } finally {
      attacking = false;
      await Promise.all(loops);
    }
  });

  it('a handshake that never sends a ClientKeyExchange is dropped after unauthenticatedTimeoutMs', async () => {
    t = await startEchoServer({ unauthenticatedTimeoutMs: 300 });
    const c = await client();
    await c.hello();
    expect(t.server.snapshot().handshakes).toBe(1);
    const dropped = await settle(
      waitFor(() => server().server.snapshot().handshakes === 0, 2500, 'the drop'),
    );
    expect(dropped).toEqual({ ok: true });
  });
});

describe('2b. a keyless peer cannot make a handshake hold more than maxHandshakeMessageBytes a message', () => {
  // A cold review found that a record alone allowed an 18 KB ClientHello (never reassembled, so not bounded
  // by maxHandshakeMessageBytes) and 18 KB ClientKeyExchanges after the first, each kept while the handshake
  // lived: about 264 KB per handshake in progress without a key.
  it('a longer ClientHello is not answered, and a longer second ClientKeyExchange is not kept', async () => {
    t = await startEchoServer({ maxHandshakeMessageBytes: 1024 });
    const c = await client();
    // 600 cipher suites: a ClientHello body of about 1,240 bytes, well within one record.
    const suites = [0xc0a8, ...Array.from({ length: 599 }, (_, i) => 0x1000 + i)];
    await inject(c, clientHello({ suites }));
    expect({
      dropped: t.server.stats.recordsDropped.limit,
      cookiesSent: t.server.stats.cookiesSent,
    }).toEqual({ dropped: 1, cookiesSent: 0 });
    // The client's own handshake, with a ClientKeyExchange of 1,100 bytes at its number in between.
    await c.hello();
    const cke = c.keyExchange(IDENTITY, KEY);
    const seq = cke.readUInt16BE(13 + 4); // record header, then the handshake header's message_seq
    const identity = Buffer.alloc(2 + 1100, 0x61);
    identity.writeUInt16BE(1100, 0);
    await inject(
      c,
      c.record(ContentType.handshake, encodeHandshake(HandshakeType.clientKeyExchange, seq, identity)),
    );
    expect(t.server.stats.recordsDropped.limit).toBe(2);
    await c.finish();
    expect((await c.request(Buffer.from('small'))).toString()).toBe('echo:small');
  });
});

/** Every Buffer reachable from `root` through own properties, arrays and maps (not `skip` keys), by path. */
function buffersIn(root: unknown, skip: ReadonlySet<string>): [string, Buffer][] {
  const found: [string, Buffer][] = [];
  const seen = new Set<unknown>();
  const visit = (v: unknown, path: string): void => {
    if (v === null || typeof v !== 'object' || seen.has(v)) return;
    seen.add(v);
    if (Buffer.isBuffer(v)) return void found.push([path, v]);
    if (v instanceof Map) return v.forEach((value, k) => visit(value, `${path}.get(${String(k)})`));
    for (const [k, value] of Object.entries(v)) if (!skip.has(k)) visit(value, `${path}.${k}`);
  };
  visit(root, 'handshake');
  return found;
}

/** The key of a ClientKeyExchange at `seq` naming `identity` (RFC 4279 §2), as an epoch 0 record of `c`. */
function keyExchangeRecord(c: PskClient, seq: number, identity: string): Buffer {
  const id = Buffer.from(identity, 'utf8');
  const body = Buffer.alloc(2 + id.length);
  body.writeUInt16BE(id.length, 0);
  id.copy(body, 2);
  return c.record(ContentType.handshake, encodeHandshake(HandshakeType.clientKeyExchange, seq, body));
}

describe('2c. a handshake in progress keeps no slice of node’s shared Buffer pool', () => {
  // A cold review found a handshake's transcript, randoms, flight and expected Finished were slices of node's
  // Buffer pool, whose blocks are 64 KiB on Node 24: a handshake kept up to four blocks alive, 2,000 of them
  // (the default table) up to 512 MiB, with enough other traffic between their steps.
  it('every Buffer a parked handshake holds is its own, at most a few KB', async () => {
    t = await startEchoServer();
    t.credentials.set(IDENTITY2, CREDENTIAL2);
    const c = await client();
    await parkBeforeFinished(c);
    // A second key exchange at the same number (another candidate with its own keys).
    await inject(c, keyExchangeRecord(c, c.finishedMessageSeq! - 1, IDENTITY2));
    const handshakes = (t.server as unknown as { store: { handshakes: Map<string, object> } }).store
      .handshakes;
    expect(handshakes.size).toBe(1);
    // Not followed: the connector (host) and the credentials, which are the registry's objects.
    const held = buffersIn([...handshakes.values()][0], new Set(['host', 'credential']));
    expect(held.length).toBeGreaterThanOrEqual(4);
    const large = held.filter(([, b]) => b.buffer.byteLength > 4096);
    expect(large.map(([path, b]) => `${path}: ${b.buffer.byteLength} B`)).toEqual([]);
    await c.finish();
    expect((await c.request(Buffer.from('own'))).toString()).toBe('echo:own');
  });

  it('a lookupPsk that re-enters the server while a Finished is checked cannot make it throw', async () => {
    let reenter = false;
    t = await startEchoServer({
      lookupPsk: (identity) => {
        const credentials = server().credentials;
        const credential = credentials.get(identity);
        if (reenter && identity === IDENTITY && credential !== undefined) {
          // Revalidation while IDENTITY is briefly gone drops the client's key exchange, and the other one
          // (IDENTITY2's) keeps the handshake; then the lookup answers as if nothing happened.
          reenter = false;
          credentials.delete(IDENTITY);
          server().server.revalidate();
          credentials.set(IDENTITY, credential);
        }
        return credential;
      },
    });
    t.credentials.set(IDENTITY2, CREDENTIAL2);
    const c = await client();
    await parkBeforeFinished(c);
    await inject(c, keyExchangeRecord(c, c.finishedMessageSeq! - 1, IDENTITY2));
    reenter = true;
    await inject(c, c.finishedDatagram());
    // The Finished's credential was not valid throughout: the handshake ends as for a revoked key.
    expect({
      reentered: !reenter,
      internalErrors: t.server.stats.internalErrors,
      started: t.started.length,
      handshakes: t.server.snapshot().handshakes,
      credentialInvalid: t.server.stats.handshakeFailures.credential_invalid,
    }).toEqual({ reentered: true, internalErrors: 0, started: 0, handshakes: 0, credentialInvalid: 1 });
  });

  it('a lookupPsk that ends the handshake while a key exchange is made leaves no key material in it', async () => {
    let reenter = false;
    t = await startEchoServer({
      lookupPsk: (identity) => {
        if (reenter && identity === IDENTITY2) {
          reenter = false;
          server().server.invalidateCredentials(['cred-1']); // abandons the handshake (its only key exchange)
        }
        return server().credentials.get(identity);
      },
    });
    t.credentials.set(IDENTITY2, CREDENTIAL2);
    const c = await client();
    await parkBeforeFinished(c);
    const handshakes = (t.server as unknown as { store: { handshakes: Map<string, object> } }).store
      .handshakes;
    const hs = [...handshakes.values()][0] as { candidates: { master?: unknown }[] };
    reenter = true;
    await inject(c, keyExchangeRecord(c, c.finishedMessageSeq! - 1, IDENTITY2));
    expect({
      reentered: !reenter,
      handshakes: handshakes.size,
      mastersHeld: hs.candidates.filter((k) => k.master !== undefined).length,
      internalErrors: t.server.stats.internalErrors,
    }).toEqual({ reentered: true, handshakes: 0, mastersHeld: 0, internalErrors: 0 });
  });
});

describe('3. one key cannot hold unlimited sessions, and a full group makes room', () => {
  it('past maxSessionsPerCredential the key’s least recently active session ends with close_notify', async () => {
    t = await startEchoServer({ maxSessionsPerCredential: 2 });
    const [a, b, c] = [await client(), await client(), await client()];
    await a.connect(IDENTITY, KEY);
    await b.connect(IDENTITY, KEY);
    await sleep(20);
    expect((await a.request(Buffer.from('a'))).toString()).toBe('echo:a'); // b is now the least recently active
    const newcomer = await settle(c.connect(IDENTITY, KEY));
    const closed = await settle(waitFor(() => b.closeNotified, 2000, 'close_notify to b'));
    expect({ newcomer, closed, endings: endings() }).toEqual({
      newcomer: { ok: true },
      closed: { ok: true },
      endings: [[b.address.port, 'evicted']],
    });
    expect(t.server.snapshot().sessions).toBe(2);
    expect((await a.request(Buffer.from('a2'))).toString()).toBe('echo:a2');
    expect((await c.request(Buffer.from('c'))).toString()).toBe('echo:c');
  });

  it('past maxSessionsPerAddress a newcomer completes and the address’s least recently active session ends', async () => {
    t = await startEchoServer({ maxSessionsPerAddress: 2 });
    t.credentials.set(IDENTITY2, CREDENTIAL2);
    const address = '127.0.0.30'; // one NAT address, several devices
    const x = await client({ bindAddress: address });
    await x.connect(IDENTITY, KEY);
    const y = await client({ bindAddress: address });
    await y.connect(IDENTITY2, KEY2);
    await sleep(20);
    expect((await x.request(Buffer.from('x'))).toString()).toBe('echo:x'); // y is the least recently active
    const z = await client({ bindAddress: address });
    const newcomer = await settle(z.connect(IDENTITY2, KEY2, { timeoutMs: 3000 }));
    const closed = await settle(waitFor(() => y.closeNotified, 2000, 'close_notify to y'));
    expect({ newcomer, closed, endings: endings() }).toEqual({
      newcomer: { ok: true },
      closed: { ok: true },
      endings: [[y.address.port, 'evicted']],
    });
    expect((await x.request(Buffer.from('x2'))).toString()).toBe('echo:x2');
    expect((await z.request(Buffer.from('z'))).toString()).toBe('echo:z');
  });
});

describe('4. one spoofed datagram does not end a handshake in progress', () => {
  /** The attack went nowhere: the real Finished completes the handshake and the server sent no alert. */
  async function expectHandshakeCompletes(c: PskClient): Promise<void> {
    const outcome = await settle(c.finish({ timeoutMs: 2000 }));
    expect({ outcome, alertsReceived: c.alerts, sessionsStarted: server().started.length }).toEqual({
      outcome: { ok: true },
      alertsReceived: [],
      sessionsStarted: 1,
    });
    expect(server().server.stats.alertsSent.decryptError).toBe(0);
    expect((await c.request(Buffer.from('after'))).toString()).toBe('echo:after');
  }

  it('(a) an epoch 1 handshake record with a bad tag', async () => {
    t = await startEchoServer();
    const c = await client();
    await parkBeforeFinished(c);
    // The client's own Finished record (same epoch and sequence number) with its tag altered.
    const forged = Buffer.from(c.finishedDatagram());
    forged[forged.length - 1]! ^= 0x5a;
    await inject(c, forged);
    await expectHandshakeCompletes(c);
  });

  it('(b) an unauthenticated epoch 0 fatal alert', async () => {
    t = await startEchoServer();
    const c = await client();
    await parkBeforeFinished(c);
    await inject(c, c.record(ContentType.alert, Buffer.from([AlertLevel.fatal, 40]))); // handshake_failure
    await expectHandshakeCompletes(c);
  });

  it('(c) an epoch 0 handshake fragment with the message_seq the real Finished uses', async () => {
    t = await startEchoServer();
    const c = await client();
    await parkBeforeFinished(c);
    const forged = encodeHandshake(HandshakeType.finished, c.finishedMessageSeq!, randomBytes(12));
    await inject(c, c.record(ContentType.handshake, forged));
    await expectHandshakeCompletes(c);
  });

  it('(guard) a client whose key is wrong still gets decrypt_error (node-dtls-client, another peer)', async () => {
    t = await startEchoServer();
    await expect(connectNodeClient(t.port, { key: randomBytes(32), timeout: 3000 })).rejects.toThrow();
    expect(t.server.stats.alertsSent.decryptError).toBe(1);
    expect(t.started).toHaveLength(0);
  });
});

describe('5. a replayed ClientHello cannot replace a live session; cookies expire', () => {
  it('the live session’s cookie-bearing ClientHello, replayed from its address and port, is ignored', async () => {
    t = await startEchoServer();
    const victim = await client();
    await victim.connect(IDENTITY, KEY);
    expect((await victim.request(Buffer.from('before'))).toString()).toBe('echo:before');
    const started = t.server.stats.handshakesStarted;
    await inject(victim, victim.cookieHello!); // an attacker on the path replays it from the victim's address
    await sleep(100);
    expect({
      handshakesStarted: t.server.stats.handshakesStarted - started,
      handshakes: t.server.snapshot().handshakes,
      endings: endings(),
    }).toEqual({ handshakesStarted: 0, handshakes: 0, endings: [] });
    expect((await victim.request(Buffer.from('still'))).toString()).toBe('echo:still');
  });

  it('an attacker with a key of its own cannot complete a handshake from the replayed ClientHello', async () => {
    t = await startEchoServer();
    t.credentials.set(IDENTITY2, CREDENTIAL2); // the attacker's own device credential
    const victim = await client();
    await victim.connect(IDENTITY, KEY);
    // The attacker sends from and receives at the victim's address and port (the same socket).
    const mallory = await client({ socket: victim.socket });
    const hijack = await settle(
      (async () => {
        await mallory.replayHello(victim.cookieHello!, { timeoutMs: 1000 });
        mallory.keyExchange(IDENTITY2, KEY2);
        await mallory.finish({ timeoutMs: 1500 });
      })(),
    );
    expect({ hijack, started: t.started.map((s) => s.identity), endings: endings() }).toEqual({
      hijack: failed,
      started: [IDENTITY],
      endings: [],
    });
    expect((await victim.request(Buffer.from('mine'))).toString()).toBe('echo:mine');
  });

  it('a cookie older than cookieLifetimeMs is answered with a new HelloVerifyRequest', async () => {
    t = await startEchoServer({ cookieLifetimeMs: 500 });
    const c = await client();
    await c.requestCookie();
    await sleep(1200);
    const badCookies = t.server.stats.badCookies;
    const answer = await settle(c.helloWithCookie({ timeoutMs: 2000 }));
    expect({
      answer,
      badCookies: t.server.stats.badCookies - badCookies,
      handshakesStarted: t.server.stats.handshakesStarted,
    }).toEqual({
      answer: { ok: false, error: expect.stringMatching(/HelloVerifyRequest/) },
      badCookies: 1,
      handshakesStarted: 0,
    });
    // The fresh cookie works: a slow device is not locked out.
    await c.helloWithCookie();
    c.keyExchange(IDENTITY, KEY);
    await c.finish();
    expect((await c.request(Buffer.from('late'))).toString()).toBe('echo:late');
  });
});
