// GATEWAY_COAP_SECURITY=both (design §3.4): relations of authenticated peers (DTLS sessions) and of plain CoAP are
// counted against separate budgets, so unauthenticated traffic from a forgeable source address cannot starve an
// authenticated device of its relation (the second DTLS review's attack 6).
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
let gw: GatewayFixture;
let key: IssuedCredential;
const sockets: dgram.Socket[] = [];
let device: NodeClient | undefined;

beforeAll(async () => {
  gw = await startGateway({
    env: {
      GATEWAY_COAP_SECURITY: 'both',
      GATEWAY_COAPS_PORT: '0',
      COAP_MAX_RELATIONS: '3',
      COAP_MAX_RELATIONS_PER_ADDRESS: '2',
    },
    load: false,
  });
  key = await issueCredential(gw.owner, A);
  await gw.app.service.reload();
});

afterAll(async () => {
  for (const s of sockets) s.close();
  device?.socket.close();
  await gw.close();
});

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

/** A plain CoAP observer (a new port each): its first answer's code. */
async function plainObserve(path: string, token: number, from = '127.0.0.1'): Promise<string> {
  const socket = dgram.createSocket('udp4');
  sockets.push(socket);
  await new Promise<void>((r) => socket.bind(0, from, r));
  const answer = new Promise<string>((resolve) => socket.once('message', (m) => resolve(parse(m).code)));
  socket.send(observe(path, token), gw.coapPort, '127.0.0.1');
  return answer;
}

describe('separate relation budgets for plain and authenticated peers', () => {
  it('plain registrations filling the per-address and total caps do not refuse a DTLS device at that address', async () => {
    // Unauthenticated traffic from 127.0.0.1 takes its address's share (2), then is refused.
    expect(await plainObserve(`/devices/${A}/settings`, 1)).toBe('2.05');
    expect(await plainObserve(`/devices/${B}/settings`, 2)).toBe('2.05');
    expect(await plainObserve(`/devices/${A}`, 3)).toBe('5.03');
    // And from another address, up to the total cap (3).
    expect(await plainObserve(`/devices/${A}`, 4, '127.0.0.2')).toBe('2.05');
    expect(await plainObserve(`/devices/${B}`, 5, '127.0.0.3')).toBe('5.03');
    // The device, authenticated over DTLS from the same address, observes and is notified.
    device = await connectNodeClient(gw.app.dtls!.address().port, {
      identity: key.identity,
      key: Buffer.from(key.keyText),
    });
    const first = parse(await device.request(observe(`/devices/${A}/settings`, 9)));
    expect(first.code).toBe('2.05');
    expect(first.options.some((o) => o.name === 'Observe')).toBe(true);
    const before = device.messages.length;
    await request(gw.app.http)
      .post('/api/notify-settings')
      .set({ Authorization: `Bearer ${API_KEYS[0]!}` })
      .send({ device_id: A, settings: { reporting_interval_s: 4242 } })
      .expect(200);
    await waitFor(
      () => device!.messages.slice(before).some((m) => parse(m).payload.toString().includes('4242')),
      5000,
      'the notification over DTLS',
    );
  });
});
