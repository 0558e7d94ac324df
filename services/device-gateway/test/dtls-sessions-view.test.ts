// The operator's view of a device's sessions (DtlsServer.sessionsOf): real handshakes over UDP, read back by
// device, and nothing in the view that a key made.
import { IDENTITY, KEY, startEchoServer, waitFor } from './support/dtls.js';
import type { TestServer } from './support/dtls.js';
import { PskClient } from './support/psk-client.js';

let t: TestServer | undefined;

afterEach(async () => {
  PskClient.closeAll();
  await t?.server.close();
  t = undefined;
});

const OTHER_KEY = Buffer.from('another-key-for-device-2-0123456');

/** Every encoding of `b` a careless serialiser could produce. */
function encodings(b: Buffer): string[] {
  return [b.toString('hex'), b.toString('base64'), b.toString('base64url'), JSON.stringify(b).slice(1, -1)];
}

describe('sessionsOf(deviceId)', () => {
  it('lists the sessions of one device with identity, peer and times, and no key material', async () => {
    t = await startEchoServer();
    t.credentials.set('dev2-identity', {
      credentialId: 'cred-2',
      identity: 'dev2-identity',
      key: OTHER_KEY,
      deviceId: 'device-2',
    });
    const before = Date.now();
    const a = await PskClient.open({ port: t.port, bindAddress: '127.0.0.1' });
    await a.connect(IDENTITY, KEY);
    const b = await PskClient.open({ port: t.port, bindAddress: '127.0.0.2' });
    await b.connect('dev2-identity', OTHER_KEY);
    expect((await a.request(Buffer.from('ping'))).toString()).toBe('echo:ping');

    const views = t.server.sessionsOf('device-1');
    expect(views).toHaveLength(1);
    const [view] = views;
    expect(Object.keys(view!).sort()).toEqual([
      'address',
      'establishedAt',
      'identity',
      'lastRecordAt',
      'port',
    ]);
    expect(view).toMatchObject({ identity: IDENTITY, address: '127.0.0.1', port: a.address.port });
    const established = Date.parse(view!.establishedAt);
    const lastRecord = Date.parse(view!.lastRecordAt);
    expect(new Date(established).toISOString()).toBe(view!.establishedAt);
    // establishedAt is kept in whole seconds of the server's clock.
    expect(established).toBeGreaterThanOrEqual(before - 1000);
    expect(lastRecord).toBeGreaterThanOrEqual(established);
    expect(lastRecord).toBeLessThanOrEqual(Date.now());

    expect(t.server.sessionsOf('device-2')).toMatchObject([
      { identity: 'dev2-identity', address: '127.0.0.2', port: b.address.port },
    ]);
    expect(t.server.sessionsOf('device-3')).toEqual([]);

    const json = JSON.stringify(t.server.sessionsOf('device-1'));
    expect(json).not.toContain('Buffer');
    const secrets = [KEY, ...a.secrets()];
    expect(a.secrets()).toHaveLength(2);
    // The key block: client and server write keys (16 bytes each) and IVs, each on its own too.
    const block = a.secrets()[1]!;
    secrets.push(block.subarray(0, 16), block.subarray(16, 32));
    for (const secret of secrets) for (const text of encodings(secret)) expect(json).not.toContain(text);
    expect(json).not.toContain(KEY.toString('latin1'));
  });

  it('follows the sessions: a second session of the device is listed, an ended one is not', async () => {
    t = await startEchoServer();
    const a = await PskClient.open({ port: t.port, bindAddress: '127.0.0.1' });
    await a.connect(IDENTITY, KEY);
    const b = await PskClient.open({ port: t.port, bindAddress: '127.0.0.3' });
    await b.connect(IDENTITY, KEY);
    expect(t.server.sessionsOf('device-1').map((v) => v.address)).toEqual(['127.0.0.1', '127.0.0.3']);
    t.server.endSessions((s) => s.address === '127.0.0.1');
    await waitFor(() => t!.ended.length === 1, 2000, 'the session ended');
    expect(t.server.sessionsOf('device-1').map((v) => v.address)).toEqual(['127.0.0.3']);
  });
});
