// GATEWAY_COAP_SECURITY=both (design §3.4): relations of authenticated peers (DTLS sessions) and of plain CoAP are
// counted against separate budgets, so unauthenticated traffic from a forgeable source address cannot starve an
// authenticated device of its relation (the second DTLS review's attack 6). Over real UDP: plain registrations
// from coap-packet sockets, the device over DTLS with node-dtls-client. One gateway per cap, so that each test
// fails, before the budgets were split (ce23f90), at its own cap: address_cap in the first, total_cap in the second.
import dgram from 'node:dgram';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { generate, parse } from 'coap-packet';
import request from 'supertest';
import { issueCredential, type IssuedCredential } from '../src/db/credential-repository.js';
import { pathOptions } from './support/coap-client.js';
import { connectNodeClient, waitFor, type NodeClient } from './support/dtls.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';

jest.setTimeout(60_000);

const A = 'acme-hq-hvac-01';
const B = 'acme-hq-lobby-sensor-03';

let mid = 100;
function observe(path: string, token: number): Buffer {
  return generate({
    confirmable: true,
    code: 'GET',
    messageId: mid++ & 0xffff,
    token: Buffer.from([token, 0x77]),
    options: [{ name: 'Observe', value: Buffer.alloc(0) }, ...pathOptions(path)],
  });
}

/** A gateway serving plain CoAP and coaps with the given caps, and a key for device A. */
function budgetGateway(caps: { total: number; perAddress: number }) {
  const t = {
    gw: undefined as unknown as GatewayFixture,
    key: undefined as unknown as IssuedCredential,
    sockets: [] as dgram.Socket[],
    device: undefined as NodeClient | undefined,
  };
  beforeAll(async () => {
    t.gw = await startGateway({
      env: {
        GATEWAY_COAP_SECURITY: 'both',
        GATEWAY_COAPS_PORT: '0',
        COAP_MAX_RELATIONS: String(caps.total),
        COAP_MAX_RELATIONS_PER_ADDRESS: String(caps.perAddress),
      },
      load: false,
    });
    t.key = await issueCredential(t.gw.owner, A);
    await t.gw.app.service.reload();
  });
  afterAll(async () => {
    for (const s of t.sockets) s.close();
    t.device?.socket.close();
    await t.gw.close();
  });
  return t;
}

type Fixture = ReturnType<typeof budgetGateway>;

/** A plain CoAP observer (a new port each, from `from`): its first answer's code. */
async function plainObserve(t: Fixture, path: string, token: number, from = '127.0.0.1'): Promise<string> {
  const socket = dgram.createSocket('udp4');
  t.sockets.push(socket);
  await new Promise<void>((r) => socket.bind(0, from, r));
  const answer = new Promise<string>((resolve) => socket.once('message', (m) => resolve(parse(m).code)));
  socket.send(observe(path, token), t.gw.coapPort, '127.0.0.1');
  return answer;
}

/** Device A over DTLS from 127.0.0.1 observes its settings: 2.05 with Observe, then a notification of a change. */
async function deviceObservesAndIsNotified(t: Fixture, interval: number): Promise<void> {
  t.device = await connectNodeClient(t.gw.app.dtls!.address().port, {
    identity: t.key.identity,
    key: Buffer.from(t.key.keyText),
  });
  const first = parse(await t.device.request(observe(`/devices/${A}/settings`, 9)));
  expect(first.code).toBe('2.05');
  expect(first.options.some((o) => o.name === 'Observe')).toBe(true);
  const before = t.device.messages.length;
  await request(t.gw.app.http)
    .post('/api/notify-settings')
    .set({ Authorization: `Bearer ${API_KEYS[0]!}` })
    .send({ device_id: A, settings: { reporting_interval_s: interval } })
    .expect(200);
  const device = t.device;
  await waitFor(
    () => device.messages.slice(before).some((m) => parse(m).payload.toString().includes(String(interval))),
    5000,
    'the notification over DTLS',
  );
}

describe('separate relation budgets for plain and authenticated peers (GATEWAY_COAP_SECURITY=both)', () => {
  describe('per source address', () => {
    const t = budgetGateway({ total: 100, perAddress: 2 });

    it("plain registrations filling 127.0.0.1's share do not refuse a DTLS device at 127.0.0.1", async () => {
      expect(await plainObserve(t, `/devices/${A}/settings`, 1)).toBe('2.05');
      expect(await plainObserve(t, `/devices/${B}/settings`, 2)).toBe('2.05');
      expect(await plainObserve(t, `/devices/${A}`, 3)).toBe('5.03');
      expect(t.gw.app.coap.stats.registrationsOverAddressCap).toBe(1);
      await deviceObservesAndIsNotified(t, 4242);
      // The device's second resource: the authenticated budget's share of 127.0.0.1 is 2 as well.
      const record = parse(await t.device!.request(observe(`/devices/${A}`, 10)));
      expect(record.code).toBe('2.05');
      expect(t.gw.app.coap.observerCounts).toEqual({ authenticated: 2, unauthenticated: 2 });
      // And the device's relations took nothing from the plain share: still refused, still 2.
      expect(await plainObserve(t, `/devices/${B}`, 4)).toBe('5.03');
      expect(t.gw.app.coap.stats.registrationsOverAddressCap).toBe(2);
      expect(t.gw.app.coap.stats.registrationsOverTotalCap).toBe(0);
    });
  });

  describe('in all', () => {
    const t = budgetGateway({ total: 3, perAddress: 100 });

    it('plain registrations from other addresses filling the total cap do not refuse a DTLS device', async () => {
      expect(await plainObserve(t, `/devices/${A}/settings`, 1, '127.0.0.2')).toBe('2.05');
      expect(await plainObserve(t, `/devices/${B}/settings`, 2, '127.0.0.2')).toBe('2.05');
      expect(await plainObserve(t, `/devices/${A}`, 3, '127.0.0.3')).toBe('2.05');
      expect(await plainObserve(t, `/devices/${B}`, 4, '127.0.0.1')).toBe('5.03');
      expect(t.gw.app.coap.stats.registrationsOverTotalCap).toBe(1);
      await deviceObservesAndIsNotified(t, 4343);
      expect(t.gw.app.coap.observerCounts).toEqual({ authenticated: 1, unauthenticated: 3 });
      expect(t.gw.app.coap.stats.registrationsOverAddressCap).toBe(0);
      // /metrics says which budget holds what, beside the cap each is held to.
      const metrics = (await request(t.gw.app.http).get('/metrics').expect(200)).text;
      expect(metrics).toContain('gateway_coap_relations{peer="authenticated",service="gw"} 1');
      expect(metrics).toContain('gateway_coap_relations{peer="unauthenticated",service="gw"} 3');
      expect(metrics).toContain('gateway_coap_max_relations{service="gw"} 3');
    });
  });
});
