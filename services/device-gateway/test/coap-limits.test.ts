// Observe relation caps (design §3.5), over real UDP sockets: per source address (the IP, whatever the
// port) and in all. A registration over a cap gets 5.03 Service Unavailable with Max-Age (RFC 7252 5.9.3.4)
// and no relation, never silent growth; refusals are counted and exposed in /metrics. Before: 1,000 sources
// × 12 NON registrations left 12,353 relations alive until the 24-hour confirmable refresh.
import { Registry } from '@platform/service-kit';
import type { ParsedPacket } from 'coap-packet';
import type { CoapServer } from '../src/coap/server.js';
import type { GatewayState } from '../src/domain/gateway-state.js';
import { registerGatewayMetrics } from '../src/metrics.js';
import { RawCoapClient, json, observe0, observe1, option, pathOptions, uint } from './support/coap-client.js';
import { device, startCoap } from './support/harness.js';

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
});
