// The layers above a transport (design §3.5): a peer that authenticated as a device (as a DTLS PSK
// session does) reads, observes and discovers that device only, and any other device id answers exactly as an
// unknown one; relations of a peer its transport ends go without a message; and plain UDP and a second
// transport share the observed resources, each observer notified through its own transport.
import type { ParsedPacket } from 'coap-packet';
import { CoapServer, defaultCoapOptions } from '../src/coap/server.js';
import type { GatewayState } from '../src/domain/gateway-state.js';
import { RawCoapClient, json, observe0, option, pathOptions } from './support/coap-client.js';
import { FakeTransport, fakePeer } from './support/fake-transport.js';
import { device, newState, silentLogger } from './support/harness.js';

const settingsPath = (id: string) => pathOptions(`/devices/${id}/settings`);
const recordPath = (id: string) => pathOptions(`/devices/${id}`);

/** What a reply says apart from its message id and token: type, code, options and payload. */
function shape(p: ParsedPacket): unknown {
  return {
    ack: p.ack,
    code: p.code,
    options: p.options.map((o) => [o.name, o.value.toString('hex')]),
    payload: p.payload.toString('hex'),
  };
}

describe('CoAP layers over a transport with peer identities', () => {
  let state: GatewayState;
  let server: CoapServer;
  let dtls: FakeTransport;

  beforeEach(async () => {
    state = newState();
    state.replaceRegistry([device('dev-a'), device('dev-b'), device('dev-off', { enabled: false })]);
    dtls = new FakeTransport();
    server = new CoapServer(
      state,
      { ...defaultCoapOptions, logger: silentLogger },
      { plain: false, transports: [{ transport: dtls, port: 5684 }] },
    );
    await server.listen(0, '127.0.0.1');
  });

  afterEach(async () => {
    await server.close(0);
  });

  it("a peer authenticated as device A reads A; B's resources answer exactly as an unknown device's", () => {
    const a = fakePeer(1, 'dev-a');
    const own = dtls.reply(
      a,
      dtls.deliver(a, { confirmable: true, code: 'GET', options: settingsPath('dev-a') }),
    );
    expect(own.code).toBe('2.05');
    expect(json(own).device_id).toBe('dev-a');

    for (const path of [settingsPath, recordPath]) {
      const other = dtls.reply(
        a,
        dtls.deliver(a, { confirmable: true, code: 'GET', options: path('dev-b') }),
      );
      const unknown = dtls.reply(
        a,
        dtls.deliver(a, { confirmable: true, code: 'GET', options: path('nope') }),
      );
      const disabled = dtls.reply(
        a,
        dtls.deliver(a, { confirmable: true, code: 'GET', options: path('dev-off') }),
      );
      expect(other.code).toBe('4.04');
      expect(shape(other)).toEqual(shape(unknown));
      expect(shape(other)).toEqual(shape(disabled));
      expect(other.payload).toHaveLength(0);
    }
    // The same peer without an identity (plain CoAP) would read B: the refusal is the identity's doing.
    const anonymous = fakePeer(2, null);
    const open = dtls.reply(
      anonymous,
      dtls.deliver(anonymous, { confirmable: true, code: 'GET', options: settingsPath('dev-b') }),
    );
    expect(open.code).toBe('2.05');
  });

  it('device A cannot observe B: 4.04 without Observe, no relation, no notification when B changes', () => {
    const a = fakePeer(1, 'dev-a');
    const mid = dtls.deliver(a, {
      confirmable: true,
      code: 'GET',
      token: Buffer.from('b'),
      options: [observe0, ...settingsPath('dev-b')],
    });
    const refused = dtls.reply(a, mid);
    expect(refused.code).toBe('4.04');
    expect(option(refused, 'Observe')).toBeUndefined();
    expect(server.observerCount).toBe(0);
    const from = dtls.sent.length;
    state.setOverride('dev-b', { maintenance_mode: true });
    expect(dtls.to(a, from)).toHaveLength(0);

    // Its own device: registered and notified.
    const own = dtls.reply(
      a,
      dtls.deliver(a, {
        confirmable: true,
        code: 'GET',
        token: Buffer.from('a'),
        options: [observe0, ...settingsPath('dev-a')],
      }),
    );
    expect(option(own, 'Observe')).toBeDefined();
    expect(server.observerCount).toBe(1);
    const before = dtls.sent.length;
    state.setOverride('dev-a', { maintenance_mode: true });
    const notes = dtls.to(a, before);
    expect(notes).toHaveLength(1);
    expect(json(notes[0]!.packet).settings).toEqual({ maintenance_mode: true });
  });

  it("/.well-known/core lists only the authenticated device's own resources, whatever the filter", () => {
    const a = fakePeer(1, 'dev-a');
    const get = (queries: string[]): string => {
      const mid = dtls.deliver(a, {
        confirmable: true,
        code: 'GET',
        options: [
          ...pathOptions('/.well-known/core'),
          ...queries.map((q) => ({ name: 'Uri-Query' as const, value: Buffer.from(q) })),
        ],
      });
      const reply = dtls.reply(a, mid);
      expect(reply.code).toBe('2.05');
      return reply.payload.toString();
    };
    expect(get([])).toBe(
      '</devices/dev-a>;rt="platform.device";ct="50 60";obs,</devices/dev-a/settings>;rt="platform.device.settings";ct="50 60";obs,</devices/dev-a/reported>;rt="platform.device.reported";ct="50 60"',
    );
    // The report resource (POST or PUT) is not observable: an `obs` filter leaves it out.
    expect(get(['obs'])).toBe(
      '</devices/dev-a>;rt="platform.device";ct="50 60";obs,</devices/dev-a/settings>;rt="platform.device.settings";ct="50 60";obs',
    );
    expect(get(['rt=platform.device.settings'])).toBe(
      '</devices/dev-a/settings>;rt="platform.device.settings";ct="50 60";obs',
    );
    for (const href of [
      'href=/devices/dev-b',
      'href=/devices/dev-b*',
      'href=/devices/dev-*',
      'href=/devices/*',
    ]) {
      expect(get([href])).not.toContain('dev-b');
    }
    expect(get(['href=/devices/dev-b'])).toBe('');
    expect(get(['href=/devices/dev-*'])).toContain('</devices/dev-a>');
  });
});

describe('plain UDP and a second transport in one server', () => {
  it('share the observed resources; each observer is notified through its own transport', async () => {
    const state = newState();
    state.replaceRegistry([device('dev-a')]);
    const dtls = new FakeTransport();
    const server = new CoapServer(state, { ...defaultCoapOptions, logger: silentLogger });
    server.addTransport(dtls, 5684);
    await server.listen(0, '127.0.0.1');
    const client = await RawCoapClient.connect(server.address().port);
    try {
      expect(server.bound).toBe(true);
      client.send({
        confirmable: true,
        code: 'GET',
        token: Buffer.from('u'),
        options: [observe0, ...settingsPath('dev-a')],
      });
      await client.waitFor((p) => p.token.toString() === 'u');
      // The same address and port as the UDP client: peer keys are per transport, so the two never collide.
      const twin = fakePeer(1, 'dev-a', '127.0.0.1');
      const twinPeer = { ...twin, port: client.socket.address().port };
      dtls.deliver(twinPeer, {
        confirmable: true,
        code: 'GET',
        token: Buffer.from('u'),
        options: [observe0, ...settingsPath('dev-a')],
      });
      expect(server.observerCount).toBe(2);

      const from = client.inbox.length;
      const sentBefore = dtls.sent.length;
      state.setOverride('dev-a', { reporting_interval_s: 120 });
      const overUdp = await client.waitFor((p) => p.token.toString() === 'u', 2000, from);
      const overDtls = dtls.to(twinPeer, sentBefore);
      expect(overDtls).toHaveLength(1);
      expect(json(overUdp.packet).settings).toEqual({ reporting_interval_s: 120 });
      expect(json(overDtls[0]!.packet).settings).toEqual({ reporting_interval_s: 120 });
      // Nothing for the UDP observer went through the other transport.
      expect(dtls.sent.slice(sentBefore)).toHaveLength(1);
    } finally {
      await client.close();
      await server.close(0);
    }
  });
});

describe('a peer its transport ends (onPeerClosed)', () => {
  it('loses every relation at once, with nothing sent to it then or later; other peers are untouched', async () => {
    const state = newState();
    state.replaceRegistry([device('dev-a'), device('dev-c')]);
    const dtls = new FakeTransport();
    const server = new CoapServer(
      state,
      // Short ACK_TIMEOUT: a confirmable notification left in flight at the close would be retransmitted within
      // the wait below if its state survived.
      { ...defaultCoapOptions, logger: silentLogger, ackTimeoutMs: 20, ackRandomFactor: 1, maxRetransmit: 3 },
      { plain: false, transports: [{ transport: dtls, port: 5684 }] },
    );
    await server.listen(0);
    try {
      const a = fakePeer(1, 'dev-a');
      const c = fakePeer(3, 'dev-c');
      const observe = (peer: typeof a, token: string, path: ReturnType<typeof pathOptions>): void => {
        dtls.deliver(peer, {
          confirmable: true,
          code: 'GET',
          token: Buffer.from(token),
          options: [observe0, ...path],
        });
      };
      observe(a, 's', settingsPath('dev-a'));
      observe(a, 'r', recordPath('dev-a'));
      observe(c, 's', settingsPath('dev-c'));
      expect(server.observerCount).toBe(3);
      // A confirmable notification to A is in flight (this transport's peers never ACK) when its session ends.
      state.setOverride('dev-a', { reporting_interval_s: 30 });
      expect(dtls.to(a).filter((s) => s.packet.confirmable)).toHaveLength(1);
      expect(server.snapshot().inflightWindow).toBe(1);

      const from = dtls.sent.length;
      dtls.closePeer(a);
      expect(server.observerCount).toBe(1);
      expect(server.stats.observersRemovedByPeerClosed).toBe(2);
      expect(server.snapshot().inflightWindow).toBe(0);
      expect(server.snapshot().endpoints).toBe(1);
      state.setOverride('dev-a', { reporting_interval_s: 40 });
      state.setOverride('dev-c', { reporting_interval_s: 50 });
      await new Promise((r) => setTimeout(r, 200)); // ten ACK timeouts
      expect(dtls.to(a, from)).toHaveLength(0);
      const toC = dtls.to(c, from);
      expect(toC.length).toBeGreaterThanOrEqual(1);
      expect(json(toC[0]!.packet).settings).toEqual({ reporting_interval_s: 50 });
      // Closing a peer that holds nothing is harmless.
      dtls.closePeer(a);
      dtls.closePeer(fakePeer(9, 'dev-a'));
      expect(server.observerCount).toBe(1);
    } finally {
      await server.close(0);
    }
  });
});
