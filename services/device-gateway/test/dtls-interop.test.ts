// Our DTLS server against independent stacks on this machine: OpenSSL, GnuTLS, node-dtls-client and
// libcoap's two DTLS builds. Each must complete the handshake and exchange data both ways.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ContentType } from '../src/dtls/constants.js';
import { parseClientHello } from '../src/dtls/handshake.js';
import { parseRecords } from '../src/dtls/record.js';
import {
  IDENTITY,
  KEY,
  KEY_HEX,
  Relay,
  connectNodeClient,
  gnutlsArgs,
  opensslArgs,
  runTool,
  startEchoServer,
  waitFor,
} from './support/dtls.js';
import type { TestServer } from './support/dtls.js';

let t: TestServer;

beforeEach(async () => {
  t = await startEchoServer();
});

afterEach(async () => {
  await t.server.close();
});

describe('interoperability', () => {
  it('openssl s_client (extended master secret offered by default): handshake, echo, close_notify', async () => {
    const run = await runTool(
      'openssl',
      opensslArgs(t.port, IDENTITY, KEY_HEX),
      'hello from openssl\n',
      /echo:hello/,
    );
    expect(run.output).toContain('Ciphersuite: PSK-AES128-CCM8');
    expect(run.output).toContain('echo:hello from openssl');
    expect(t.received.map((r) => r.data.toString())).toEqual(['hello from openssl\n']);
    expect(t.started).toHaveLength(1);
    expect(t.started[0]).toMatchObject({ identity: IDENTITY, deviceId: 'device-1', credentialId: 'cred-1' });
    // The same session object is passed to every callback.
    expect(t.received[0]!.session).toBe(t.started[0]);
    // stdin EOF: s_client sends close_notify; we end the session and answer with close_notify.
    await waitFor(() => t.ended.length === 1, 3000, 'session end');
    expect(t.ended[0]).toEqual({ session: t.started[0], reason: 'close_notify' });
    expect(t.server.stats.alertsSent.closeNotify).toBe(1);
    expect(t.server.snapshot()).toMatchObject({ sessions: 0, handshakes: 0, addresses: 0 });
  });

  it('openssl s_client with the extended master secret switched off (Options = -ExtendedMasterSecret)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dtls-noems-'));
    const conf = join(dir, 'openssl.cnf');
    writeFileSync(
      conf,
      [
        'openssl_conf = openssl_init',
        '[openssl_init]',
        'ssl_conf = ssl_module',
        '[ssl_module]',
        'system_default = tls_defaults',
        '[tls_defaults]',
        'Options = -ExtendedMasterSecret',
        '',
      ].join('\n'),
    );
    const relay = new Relay(t.port);
    const relayPort = await relay.start();
    try {
      const run = await runTool(
        'openssl',
        opensslArgs(relayPort, IDENTITY, KEY_HEX),
        'no ems\n',
        /echo:no ems/,
        8000,
        {
          OPENSSL_CONF: conf,
        },
      );
      expect(run.output).toContain('echo:no ems');
      // The ClientHello really went without extension 0x0017, and our ServerHello without it too.
      const ch = parseRecords(relay.clientToServer[0]!).records[0]!;
      expect(parseClientHello(ch.fragment.subarray(12))!.extensions.has(0x0017)).toBe(false);
      const sh = relay.serverToClient
        .flatMap((d) => parseRecords(d).records)
        .find((r) => r.type === ContentType.handshake && r.fragment[0] === 2)!;
      expect(sh.fragment.includes(Buffer.from([0x00, 0x17, 0x00, 0x00]))).toBe(false);
    } finally {
      relay.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it.each([
    ['with extended master secret', ''],
    ['without extended master secret', ':%NO_SESSION_HASH'],
  ])('gnutls-cli with a PSK-only, CCM-8-only priority, %s', async (_name, suffix) => {
    const run = await runTool(
      'gnutls-cli',
      gnutlsArgs(
        t.port,
        IDENTITY,
        KEY_HEX,
        `NONE:+VERS-DTLS1.2:+PSK:+AES-128-CCM-8:+AEAD:+COMP-NULL:+SIGN-ALL:+CTYPE-X509${suffix}`,
      ),
      'hello from gnutls\n',
      /echo:hello/,
    );
    expect(run.output).toContain('(DTLS1.2-X.509)-(PSK)-(AES-128-CCM-8)');
    // gnutls-cli lists the negotiated options; the session hash shows as "extended master secret".
    expect(/Options:.*extended master secret/.test(run.output)).toBe(suffix === '');
    expect(run.output).toMatch(/safe renegotiation/);
    expect(run.output).toContain('echo:hello from gnutls');
    await waitFor(() => t.ended.length === 1, 3000, 'session end');
    expect(t.ended[0]!.reason).toBe('close_notify');
  });

  it('gnutls-cli preferring ECDHE-PSK and ChaCha20 with CCM-8 last (as libcoap does) still gets CCM-8', async () => {
    const priority =
      'NONE:+VERS-DTLS1.2:+ECDHE-PSK:+PSK:+CHACHA20-POLY1305:+AES-128-GCM:+AES-128-CCM-8:+AEAD:+COMP-NULL:+SIGN-ALL:+GROUP-ALL:+CTYPE-X509';
    const run = await runTool('gnutls-cli', gnutlsArgs(t.port, IDENTITY, KEY_HEX, priority), 'x\n', /echo:x/);
    expect(run.output).toContain('(DTLS1.2-X.509)-(PSK)-(AES-128-CCM-8)');
    expect(run.output).toContain('echo:x');
  });

  it('node-dtls-client (no extended master secret): handshake, echo both ways, close_notify both ways', async () => {
    const c = await connectNodeClient(t.port);
    expect((await c.request(Buffer.from('one'))).toString()).toBe('echo:one');
    expect((await c.request(Buffer.from('two'))).toString()).toBe('echo:two');
    // Server-initiated close: endSessions sends close_notify, node-dtls-client closes on it.
    expect(t.server.endSessions((s) => s.identity === IDENTITY, 'revoked')).toBe(1);
    await waitFor(() => c.closed, 3000, 'client close on close_notify');
    expect(t.ended.map((e) => e.reason)).toEqual(['revoked']);
    expect(t.server.stats.sessionsEnded.revoked).toBe(1);
  });

  it('node-dtls-client closing sends close_notify; we answer it (seen on the wire through a relay)', async () => {
    const relay = new Relay(t.port);
    const relayPort = await relay.start();
    try {
      const c = await connectNodeClient(relayPort);
      expect((await c.request(Buffer.from('ping'))).toString()).toBe('echo:ping');
      const before = relay.serverToClient.length;
      c.socket.close();
      await waitFor(() => t.ended.length === 1, 3000, 'session end');
      expect(t.ended[0]!.reason).toBe('close_notify');
      await waitFor(() => relay.serverToClient.length > before, 3000, 'our close_notify');
      const answer = parseRecords(relay.serverToClient[before]!).records;
      // An encrypted alert in epoch 1: 8 explicit nonce + 2 alert + 8 tag bytes.
      expect(answer.map((r) => [r.type, r.epoch, r.fragment.length])).toEqual([[ContentType.alert, 1, 18]]);
    } finally {
      relay.close();
    }
  });

  it.each(['coap-client-openssl', 'coap-client-gnutls'])(
    '%s (libcoap 4.3.1) completes a handshake and sends its request',
    async (tool) => {
      // libcoap takes the key as text (-k); our echo reflects its CoAP request, which is enough to prove
      // that data went both ways under the session.
      await runTool(
        tool,
        ['-m', 'get', '-u', IDENTITY, '-k', KEY.toString(), '-B', '2', `coaps://127.0.0.1:${t.port}/x`],
        '',
        undefined,
        6000,
      );
      expect(t.started).toHaveLength(1);
      expect(t.received.length).toBeGreaterThanOrEqual(1);
      // A CoAP GET: version 1 in the top bits, Uri-Path "x".
      expect(t.received[0]!.data[0]! >> 6).toBe(1);
      expect(t.received[0]!.data.includes(Buffer.from('x'))).toBe(true);
    },
  );
});
