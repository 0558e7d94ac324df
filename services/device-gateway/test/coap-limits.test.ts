// Observe relation caps (design §3.4), over real UDP sockets: per source address (the IP, whatever the
// port) and in all. A registration over a cap gets 5.03 Service Unavailable with Max-Age (RFC 7252 5.9.3.4)
// and no relation, never silent growth; refusals are counted and exposed in /metrics. Before: 1,000 sources
// × 12 NON registrations left 12,353 relations alive until the 24-hour confirmable refresh. Authenticated
// peers (a DTLS transport's) are held to the same caps in a budget of their own (coap-budgets.test.ts has the
// end-to-end case with real DTLS).
import { Registry } from '@platform/service-kit';
import type { ParsedPacket } from 'coap-packet';
import { CoapServer, defaultCoapOptions } from '../src/coap/server.js';
import type { GatewayState } from '../src/domain/gateway-state.js';
import { registerGatewayMetrics } from '../src/metrics.js';
import { RawCoapClient, json, observe0, observe1, option, pathOptions, uint } from './support/coap-client.js';
import { FakeTransport, fakePeer } from './support/fake-transport.js';
import { device, newState, silentLogger, startCoap } from './support/harness.js';

const ids = Array.from({ length: 40 }, (_, i) => `dev-${String(i).padStart(2, '0')}`);
const settingsPath = (id: string) => pathOptions(`/devices/${id}/settings`);

/** A NON registration (as a spoofing sender would use: no ACK needed) for `id`, token `token`; its reply. */
async function registerNon(client: RawCoapClient, id: string, token: string): Promise<ParsedPacket> {
  const from = client.inbox.length;
  client.send({
    confirmable: false,
    code: 'GET',
    token: Buffer.from(token),
    options: [observe0, ...settingsPath(id)],
  });
  return (await client.waitFor((p) => p.token.toString() === token, 3000, from)).packet;
}

function expectServiceUnavailable(reply: ParsedPacket, retryAfterS: number): void {
  expect(reply.code).toBe('5.03');
  expect(reply.confirmable).toBe(false);
  expect(uint(option(reply, 'Max-Age'))).toBe(retryAfterS);
  expect(option(reply, 'Observe')).toBeUndefined();
  expect(reply.payload).toHaveLength(0);
}

describe('observe relation caps', () => {
  const clients: RawCoapClient[] = [];
  let server: CoapServer | undefined;
  const connect = async (bindAddress = '127.0.0.1'): Promise<RawCoapClient> => {
    const client = await RawCoapClient.connect(server!.address().port, '127.0.0.1', bindAddress);
    clients.push(client);
    return client;
  };

  afterEach(async () => {
    for (const c of clients.splice(0)) await c.close();
    await server?.close(0);
    server = undefined;
  });

  it('per source address: NON registrations from several ports of one IP stop at the cap with 5.03 + Max-Age', async () => {
    let state: GatewayState;
    ({ state, server } = await startCoap(
      ids.map((id) => device(id)),
      { maxRelationsPerAddress: 10, maxRelationsPerEndpoint: 256, relationRetryAfterS: 30 },
    ));
    // Four source ports of 127.0.0.1, four registrations each, for 16 different devices.
    const ports = [await connect(), await connect(), await connect(), await connect()];
    const replies: ParsedPacket[] = [];
    for (let i = 0; i < 16; i++) replies.push(await registerNon(ports[i % 4]!, ids[i]!, `t${i}`));
    for (const accepted of replies.slice(0, 10)) {
      expect(accepted.code).toBe('2.05');
      expect(option(accepted, 'Observe')).toBeDefined();
    }
    for (const refused of replies.slice(10)) expectServiceUnavailable(refused, 30);
    expect(server.observerCount).toBe(10);
    expect(server.stats.registrationsOverAddressCap).toBe(6);

    // Another source address is not held back by this one's relations.
    const other = await connect('127.0.0.2');
    expect((await registerNon(other, ids[20]!, 'other')).code).toBe('2.05');
    expect(server.observerCount).toBe(11);

    // At the cap, re-registering an existing relation replaces it (never refused, never a duplicate) ...
    const again = await registerNon(ports[0]!, ids[0]!, 't0');
    expect(again.code).toBe('2.05');
    expect(option(again, 'Observe')).toBeDefined();
    expect(server.observerCount).toBe(11);
    // ... and a refused device is not notified.
    const from = ports.map((c) => c.inbox.length);
    state.setOverride(ids[12]!, { maintenance_mode: true });
    state.setOverride(ids[1]!, { maintenance_mode: true });
    const note = await ports[1]!.waitFor((p) => p.token.toString() === 't1', 2000, from[1]);
    expect(json(note.packet).settings).toEqual({ maintenance_mode: true });
    await new Promise((r) => setTimeout(r, 100));
    expect(ports[0]!.inbox.slice(from[0]).filter((r) => r.packet.token.toString() === 't12')).toHaveLength(0);

    // A relation that ends frees its place.
    const mid = ports[1]!.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('t1'),
      options: [observe1, ...settingsPath(ids[1]!)],
    });
    await ports[1]!.waitFor((p) => p.messageId === mid);
    expect(server.observerCount).toBe(10);
    expect((await registerNon(ports[2]!, ids[30]!, 'late')).code).toBe('2.05');
    expect(server.stats.registrationsOverAddressCap).toBe(6);
  });

  it('in all: past the total cap every source gets 5.03 + Max-Age; refusals appear in /metrics', async () => {
    const started = await startCoap(
      ids.map((id) => device(id)),
      { maxRelations: 5, maxRelationsPerAddress: 100, relationRetryAfterS: 45 },
    );
    server = started.server;
    const registry = new Registry();
    registerGatewayMetrics(registry, started.state, server);
    const a = await connect('127.0.0.1');
    const b = await connect('127.0.0.3');
    for (let i = 0; i < 5; i++)
      expect((await registerNon(i % 2 === 0 ? a : b, ids[i]!, `t${i}`)).code).toBe('2.05');
    expectServiceUnavailable(await registerNon(a, ids[5]!, 't5'), 45);
    expectServiceUnavailable(await registerNon(b, ids[6]!, 't6'), 45);
    // A confirmable registration gets its 5.03 piggybacked in the ACK.
    const mid = b.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('c'),
      options: [observe0, ...settingsPath(ids[7]!)],
    });
    const piggybacked = (await b.waitFor((p) => p.messageId === mid)).packet;
    expect(piggybacked.ack).toBe(true);
    expect(piggybacked.code).toBe('5.03');
    expect(uint(option(piggybacked, 'Max-Age'))).toBe(45);
    // A plain GET is still served at the cap: only registrations are refused.
    const get = a.send({ confirmable: true, code: 'GET', options: settingsPath(ids[8]!) });
    expect((await a.waitFor((p) => p.messageId === get)).packet.code).toBe('2.05');
    expect(server.observerCount).toBe(5);
    expect(server.stats.registrationsOverTotalCap).toBe(3);
    expect(server.stats.registrationsOverAddressCap).toBe(0);

    const text = await registry.metrics();
    expect(text).toContain('gateway_coap_registrations_refused_total{reason="total_cap"} 3');
    expect(text).toContain('gateway_coap_events{event="registrationsOverTotalCap"} 3');
  });

  it('authenticated peers have a budget of their own with the same caps, and do not use up the plain one', async () => {
    const state = newState();
    state.replaceRegistry(ids.map((id) => device(id)));
    const dtls = new FakeTransport();
    server = new CoapServer(state, {
      ...defaultCoapOptions,
      logger: silentLogger,
      maxRelations: 3,
      maxRelationsPerAddress: 2,
      relationRetryAfterS: 30,
    });
    server.addTransport(dtls, 5684);
    await server.listen(0, '127.0.0.1');
    const registry = new Registry();
    registerGatewayMetrics(registry, state, server, { maxRelations: 3 });
    // Device n's session (its own device: a session observes nothing else), from `address`.
    const sessions = ids.map((id, n) => fakePeer(n + 1, id, n < 4 ? '127.0.0.1' : `10.0.0.${n}`));
    const observeOwn = (n: number): ParsedPacket =>
      dtls.reply(
        sessions[n]!,
        dtls.deliver(sessions[n]!, {
          confirmable: true,
          code: 'GET',
          token: Buffer.from('d'),
          options: [observe0, ...settingsPath(ids[n]!)],
        }),
      );

    // The authenticated budget: two of 127.0.0.1's sessions, then its share is full ...
    expect(observeOwn(0).code).toBe('2.05');
    expect(observeOwn(1).code).toBe('2.05');
    expectServiceUnavailable(observeOwn(2), 30);
    // ... and one from another address fills the total (3); the next is refused there.
    expect(observeOwn(4).code).toBe('2.05');
    expectServiceUnavailable(observeOwn(5), 30);
    expect(server.stats.registrationsOverAddressCap).toBe(1);
    expect(server.stats.registrationsOverTotalCap).toBe(1);

    // Plain CoAP from the same address is counted apart: its own share of 127.0.0.1 and its own total.
    const plain = await connect('127.0.0.1');
    expect((await registerNon(plain, ids[20]!, 'p0')).code).toBe('2.05');
    expect((await registerNon(plain, ids[21]!, 'p1')).code).toBe('2.05');
    expectServiceUnavailable(await registerNon(plain, ids[22]!, 'p2'), 30);
    const other = await connect('127.0.0.2');
    expect((await registerNon(other, ids[23]!, 'p3')).code).toBe('2.05');
    expectServiceUnavailable(await registerNon(other, ids[24]!, 'p4'), 30);
    expect(server.observerCounts).toEqual({ authenticated: 3, unauthenticated: 3 });
    expect(server.observerCount).toBe(6);

    // A relation that ends frees a place in its own budget only.
    dtls.closePeer(sessions[0]!);
    expect(server.observerCounts).toEqual({ authenticated: 2, unauthenticated: 3 });
    expectServiceUnavailable(await registerNon(plain, ids[25]!, 'p5'), 30);
    expect(observeOwn(2).code).toBe('2.05');
    expect(server.observerCounts).toEqual({ authenticated: 3, unauthenticated: 3 });

    const text = await registry.metrics();
    expect(text).toContain('gateway_coap_relations{peer="authenticated"} 3');
    expect(text).toContain('gateway_coap_relations{peer="unauthenticated"} 3');
    expect(text).toContain('gateway_coap_observers 6');
    expect(text).toContain('gateway_coap_max_relations 3');
  });
});
