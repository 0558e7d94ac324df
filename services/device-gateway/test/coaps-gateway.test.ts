// CoAP over DTLS through the whole gateway (design §3.5): a real PostgreSQL with issued device keys, the gateway
// serving plain CoAP and coaps, and independent peers — libcoap 4.3.1's OpenSSL and GnuTLS clients, OpenSSL's
// s_client and node-dtls-client — on real UDP sockets.
import { spawn, type ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { generate, parse } from 'coap-packet';
import { sql } from 'kysely';
import request from 'supertest';
import { issueCredential, revokeIdentity, type IssuedCredential } from '../src/db/credential-repository.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';
import { connectNodeClient, opensslArgs, prng, runTool, waitFor, type NodeClient } from './support/dtls.js';
import { pathOptions } from './support/coap-client.js';

jest.setTimeout(60_000);

const A = 'acme-hq-hvac-01';
const B = 'acme-hq-lobby-sensor-03';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

let gw: GatewayFixture;
let coapsPort: number;
let keyA: IssuedCredential;
let keyB: IssuedCredential;
const children: ChildProcess[] = [];
const clients: NodeClient[] = [];

beforeAll(async () => {
  gw = await startGateway({
    env: { GATEWAY_COAP_SECURITY: 'both', GATEWAY_COAPS_PORT: '0', DTLS_IDLE_TIMEOUT_S: '600' },
    load: false,
  });
  keyA = await issueCredential(gw.owner, A);
  keyB = await issueCredential(gw.owner, B);
  await gw.app.service.reload();
  coapsPort = gw.app.dtls!.address().port;
});

afterEach(() => {
  for (const child of children.splice(0)) child.kill('SIGKILL');
  for (const client of clients.splice(0)) {
    try {
      client.socket.close();
    } catch {
      // already closed
    }
  }
});

afterAll(async () => {
  await gw.close();
});

/** A libcoap client process whose output the test can watch while it runs. */
function startTool(tool: string, args: string[]): { output: () => string; exited: Promise<number | null> } {
  const child = spawn(tool, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  return { output: () => output, exited };
}

/**
 * A libcoap observer of A's settings over coaps; once it has its first response, a notify-settings call with a
 * fresh interval. Resolves with the interval sent and the observer's output so far.
 */
async function observeThenNotify(
  tool: string,
  base: number,
): Promise<{ interval: number; output: () => string }> {
  const url = `coaps://127.0.0.1:${coapsPort}/devices/${A}/settings`;
  const observer = startTool(tool, ['-m', 'get', '-s', '20', '-u', keyA.identity, '-k', keyA.keyText, url]);
  await waitFor(() => documents(observer.output()).length >= 1, 20_000, 'the first observe response');
  const interval = base + Math.floor(Math.random() * 1000);
  await request(gw.app.http)
    .post('/api/notify-settings')
    .set(auth)
    .send({ device_id: A, settings: { reporting_interval_s: interval } })
    .expect(200);
  return { interval, output: observer.output };
}

/** Settings documents printed by a libcoap client, in order. */
function documents(
  output: string,
): Array<{ device_id: string; version: number; settings: Record<string, unknown> }> {
  return [...output.matchAll(/\{"device_id":.*?"settings":\{.*?\}\}(?=\{|\s|$)/g)].map(
    (m) => JSON.parse(m[0]) as { device_id: string; version: number; settings: Record<string, unknown> },
  );
}

async function connect(key: IssuedCredential): Promise<NodeClient> {
  const client = await connectNodeClient(coapsPort, {
    identity: key.identity,
    key: Buffer.from(key.keyText),
  });
  clients.push(client);
  return client;
}

let mid = 1;
/** A confirmable CoAP GET over a node-dtls-client session, encoded by coap-packet (not the gateway's codec). */
function get(path: string, extra: { observe?: boolean; token?: Buffer } = {}): Buffer {
  const options = pathOptions(path);
  return generate({
    confirmable: true,
    code: 'GET',
    messageId: mid++ & 0xffff,
    token: extra.token ?? Buffer.from([mid & 0xff, 0x5a]),
    options: extra.observe === true ? [{ name: 'Observe', value: Buffer.alloc(0) }, ...options] : options,
  });
}

describe('coaps through the gateway, with libcoap as the device', () => {
  it.each(['coap-client-openssl', 'coap-client-gnutls'])(
    '%s reads and observes its settings; a notify-settings call reaches it with a higher version',
    async (tool) => {
      const url = `coaps://127.0.0.1:${coapsPort}/devices/${A}/settings`;
      const once = await runTool(
        tool,
        ['-m', 'get', '-u', keyA.identity, '-k', keyA.keyText, url],
        '',
        undefined,
        15_000,
      );
      expect(documents(once.output)[0]).toMatchObject({ device_id: A });

      const { interval, output } = await observeThenNotify(tool, 600);
      expect(gw.app.coap.observerCount).toBeGreaterThanOrEqual(1);
      // The registration's answer (confirmed once more by a confirmable notification, design §3.8), then the
      // notification of the call's settings.
      const notified = (d: { settings: Record<string, unknown> }): boolean =>
        d.settings.reporting_interval_s === interval;
      await waitFor(() => documents(output()).some(notified), 15_000, 'the notification');
      const first = documents(output())[0];
      const second = documents(output()).find(notified);
      expect(second!.settings).toEqual({ reporting_interval_s: interval });
      expect(second!.version).toBeGreaterThan(first!.version);
    },
  );

  it('openssl s_client completes a PSK-AES128-CCM8 handshake with the gateway', async () => {
    const run = await runTool(
      'openssl',
      opensslArgs(coapsPort, keyA.identity, Buffer.from(keyA.keyText).toString('hex')),
      '',
      /CONNECTION ESTABLISHED|Cipher is/,
      15_000,
    );
    expect(run.output).toMatch(/PSK-AES128-CCM8/);
  });
});

describe('refusals: the same alert for every key the gateway does not accept', () => {
  const refusal = async (identity: string, keyText: string): Promise<string> => {
    const run = await runTool(
      'openssl',
      opensslArgs(coapsPort, identity, Buffer.from(keyText).toString('hex')),
      '',
      /alert|error/i,
      15_000,
    );
    return run.output;
  };

  it('wrong key, unknown identity, expired and revoked keys all fail with decrypt_error, and no session', async () => {
    const expired = await issueCredential(gw.owner, A);
    const revoked = await issueCredential(gw.owner, A);
    await sql`UPDATE device_gateway.device_credentials SET not_before = now() - interval '2 days', not_after = now() - interval '1 day' WHERE psk_identity = ${expired.identity}`.execute(
      gw.owner,
    );
    await revokeIdentity(gw.owner, revoked.identity);
    await gw.app.service.reload();
    const sessionsBefore = gw.app.dtls!.snapshot().sessions;
    const failuresBefore = gw.app.dtls!.stats.handshakeFailures.decrypt_error;
    const outputs = [
      await refusal(keyA.identity, 'not-the-key-of-this-device-00000'),
      await refusal('psk-nobody-has-this-identity', keyA.keyText),
      await refusal(expired.identity, expired.keyText),
      await refusal(revoked.identity, revoked.keyText),
    ];
    for (const output of outputs) expect(output).toMatch(/decrypt error/i);
    expect(gw.app.dtls!.stats.handshakeFailures.decrypt_error - failuresBefore).toBe(4);
    expect(gw.app.dtls!.snapshot().sessions).toBe(sessionsBefore);
    const metrics = await request(gw.app.http).get('/metrics').expect(200);
    expect(metrics.text).toMatch(
      /gateway_dtls_handshake_failures_total\{[^}]*reason="decrypt_error"[^}]*\} [1-9]/,
    );
    expect(metrics.text).not.toContain(keyA.keyText);
  });
});

describe('authorisation: a session sees only its own device', () => {
  it("A's session gets 4.04 for B, as for an unknown device, and lists only A in /.well-known/core", async () => {
    const a = await connect(keyA);
    const own = parse(await a.request(get(`/devices/${A}/settings`)));
    expect(own.code).toBe('2.05');
    const other = parse(await a.request(get(`/devices/${B}/settings`)));
    const unknown = parse(await a.request(get('/devices/no-such-device/settings')));
    expect(other.code).toBe('4.04');
    expect(other.payload).toEqual(unknown.payload);
    const otherObserve = parse(await a.request(get(`/devices/${B}`, { observe: true })));
    expect(otherObserve.code).toBe('4.04');
    const links = parse(await a.request(get('/.well-known/core'))).payload.toString();
    expect(links).toContain(`</devices/${A}>`);
    expect(links).toContain(`</devices/${A}/settings>`);
    expect(links).not.toContain(B);
    // B's own session does see B.
    const b = await connect(keyB);
    expect(parse(await b.request(get(`/devices/${B}/settings`))).code).toBe('2.05');
  });

  it('plain CoAP /.well-known/core lists no device', async () => {
    const socket = dgram.createSocket('udp4');
    try {
      const reply = new Promise<Buffer>((resolve) => socket.once('message', resolve));
      socket.send(get('/.well-known/core'), gw.coapPort, '127.0.0.1');
      const links = parse(await reply).payload.toString();
      expect(links).not.toContain(A);
      expect(links).toContain('</devices>');
    } finally {
      socket.close();
    }
  });
});

describe('key revocation and expiry end sessions and their Observe relations', () => {
  it('revoking the key during an Observe sends close_notify and removes the relation', async () => {
    const key = await issueCredential(gw.owner, A);
    await gw.app.service.reload();
    const client = await connect(key);
    const before = gw.app.coap.observerCount;
    const first = parse(await client.request(get(`/devices/${A}/settings`, { observe: true })));
    expect(first.code).toBe('2.05');
    expect(gw.app.coap.observerCount).toBe(before + 1);
    await revokeIdentity(gw.owner, key.identity);
    await request(gw.app.http).post('/api/reload-registry').set(auth).expect(200);
    await waitFor(() => client.closed, 10_000, 'close_notify from the gateway');
    expect(gw.app.coap.observerCount).toBe(before);
    expect(gw.app.dtls!.stats.sessionsEnded.revoked).toBeGreaterThanOrEqual(1);
    // The revoked key no longer opens a session.
    await expect(connect(key)).rejects.toBeDefined();
  });

  it('a key whose not_after passes ends its session without a reload', async () => {
    const key = await issueCredential(gw.owner, A);
    await sql`UPDATE device_gateway.device_credentials SET not_after = now() + interval '3 seconds' WHERE psk_identity = ${key.identity}`.execute(
      gw.owner,
    );
    await gw.app.service.reload();
    const client = await connect(key);
    expect(parse(await client.request(get(`/devices/${A}/settings`, { observe: true }))).code).toBe('2.05');
    await waitFor(() => client.closed, 15_000, 'the session to end at not_after');
  });
});

describe('hostile datagrams at the coaps port', () => {
  it('20,000 random and mutated records leave a real coap-client-openssl observer working', async () => {
    const random = prng(0x7252);
    const socket = dgram.createSocket('udp4');
    await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
    // Seeds: a plausible ClientHello record header and an application-data record of epoch 1.
    const seeds = [
      Buffer.from(
        '16fefd000000000000000000360100002a000000000000002afefd' + '00'.repeat(32) + '000002c0a80100',
        'hex',
      ),
      Buffer.from('17fefd0001000000000005001d' + '00'.repeat(29), 'hex'),
      Buffer.from('15fefd00000000000000000002022f', 'hex'),
    ];
    try {
      for (let i = 0; i < 20_000; i++) {
        let datagram: Buffer;
        if (i % 3 === 0) {
          datagram = Buffer.alloc(1 + Math.floor(random() * 200));
          for (let j = 0; j < datagram.length; j++) datagram[j] = Math.floor(random() * 256);
        } else {
          datagram = Buffer.from(seeds[i % seeds.length]!);
          const flips = 1 + Math.floor(random() * 4);
          for (let f = 0; f < flips; f++)
            datagram[Math.floor(random() * datagram.length)] = Math.floor(random() * 256);
          if (random() < 0.2) datagram = datagram.subarray(0, Math.floor(random() * datagram.length));
        }
        socket.send(datagram, coapsPort, '127.0.0.1');
        if (i % 500 === 499) await new Promise((r) => setImmediate(r));
      }
    } finally {
      socket.close();
    }
    expect(gw.app.dtls!.stats.internalErrors).toBe(0);

    const { interval, output } = await observeThenNotify('coap-client-openssl', 2000);
    await waitFor(
      () => documents(output()).some((d) => d.settings.reporting_interval_s === interval),
      15_000,
      'the notification',
    );
  });
});
