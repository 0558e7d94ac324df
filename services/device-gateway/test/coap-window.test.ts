// The server-wide window of confirmable notifications in flight (CoapServerOptions.maxInflight): a fan-out is
// paced by the ACKs, RFC 7641 4.5.2 replacement still holds inside and outside the window, and peers that never
// answer neither stall the fan-out nor cause more than MAX_RETRANSMIT retransmissions each.
import type { CoapServer } from '../src/coap/server.js';
import type { DeviceRecord } from '../src/domain/documents.js';
import type { GatewayState } from '../src/domain/gateway-state.js';
import { RawCoapClient, json, observe0, pathOptions, type Received } from './support/coap-client.js';
import { device, startCoap } from './support/harness.js';

const ids = (n: number): string[] => Array.from({ length: n }, (_, i) => `win-${i}`);
const records = (n: number, interval: number): DeviceRecord[] =>
  ids(n).map((id) => device(id, { desiredSettings: { reporting_interval_s: interval } }));

/** Registers one CON observer per device, token = device id; waits for every piggybacked response. */
async function observeAll(client: RawCoapClient, deviceIds: string[]): Promise<void> {
  for (const id of deviceIds) {
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from(id),
      options: [observe0, ...pathOptions(`/devices/${id}/settings`)],
    });
    await client.waitFor((p) => p.ack && p.token.toString() === id);
  }
}

const notifications = (got: Received[]): Received[] =>
  got.filter((r) => r.packet.code === '2.05' && r.packet.confirmable);

function ack(client: RawCoapClient, received: Received[]): void {
  for (const r of received) client.send({ ack: true, code: '0.00', messageId: r.packet.messageId });
}

describe('CoAP in-flight window for confirmable notifications', () => {
  let state: GatewayState;
  let server: CoapServer;
  let client: RawCoapClient;

  afterEach(async () => {
    await client.close();
    await server.close();
  });

  it('paces a fan-out by the ACKs: never more than maxInflight notifications await one', async () => {
    ({ state, server } = await startCoap(records(40, 60), {
      maxInflight: 8,
      ackTimeoutMs: 5000,
      ackRandomFactor: 1,
    }));
    client = await RawCoapClient.connect(server.address().port);
    client.autoAck = false;
    await observeAll(client, ids(40));

    state.replaceRegistry(records(40, 120));
    const seen = new Map<string, number>();
    for (let wave = 0; wave < 5; wave++) {
      // Nothing acknowledged yet in this wave: exactly one window's worth goes out, then the fan-out waits.
      const got = notifications(await client.collect(150));
      expect(got).toHaveLength(8);
      expect(server.snapshot().inflightWindow).toBe(8);
      for (const r of got) {
        const token = r.packet.token.toString();
        seen.set(token, (seen.get(token) ?? 0) + 1);
        expect(json(r.packet).settings).toEqual({ reporting_interval_s: 120 });
      }
      ack(client, got);
    }
    expect(notifications(await client.collect(150))).toHaveLength(0);
    expect([...seen.keys()].sort()).toEqual(ids(40).sort());
    expect([...seen.values()].every((count) => count === 1)).toBe(true);
    expect(server.stats.retransmissions).toBe(0);
    expect(server.stats.windowFull).toBeGreaterThanOrEqual(4);
    expect(server.snapshot().inflightWindow).toBe(0);
    expect(server.observerCount).toBe(40);
  });

  it('still replaces a notification in flight by the newer state, and sends a queued relation only its newest', async () => {
    ({ state, server } = await startCoap(records(2, 60), {
      maxInflight: 1,
      ackTimeoutMs: 5000,
      ackRandomFactor: 1,
    }));
    client = await RawCoapClient.connect(server.address().port);
    client.autoAck = false;
    const [a, b] = ids(2) as [string, string];
    await observeAll(client, [a, b]);

    state.setOverride(a, { reporting_interval_s: 11 }); // in flight: the window (1) is full
    state.setOverride(b, { reporting_interval_s: 21 }); // queued behind the window
    state.setOverride(b, { reporting_interval_s: 22 }); // still queued once, now newer
    state.setOverride(a, { reporting_interval_s: 12 }); // replaces a's notification in flight (4.5.2)
    const first = notifications(await client.collect(150));
    expect(first.map((r) => [r.packet.token.toString(), json(r.packet).settings])).toEqual([
      [a, { reporting_interval_s: 11 }],
    ]);

    // a's ACK: its newer state goes out at once (RFC 7641 4.5.2), holding the window again.
    ack(client, first);
    const second = notifications(await client.collect(150));
    expect(second.map((r) => [r.packet.token.toString(), json(r.packet).settings])).toEqual([
      [a, { reporting_interval_s: 12 }],
    ]);

    // Now b, with its newest state only: 21 was superseded while it waited.
    ack(client, second);
    const third = notifications(await client.collect(150));
    expect(third.map((r) => [r.packet.token.toString(), json(r.packet).settings])).toEqual([
      [b, { reporting_interval_s: 22 }],
    ]);
    ack(client, third);
    expect(notifications(await client.collect(150))).toHaveLength(0);
    expect(server.stats.retransmissions).toBe(0);
    expect(server.snapshot().inflightWindow).toBe(0);
  });

  it('lets peers that never answer leave the window at their first timeout, with bounded retransmissions', async () => {
    const n = 30;
    const maxRetransmit = 2;
    ({ state, server } = await startCoap(records(n, 60), {
      maxInflight: 4,
      ackTimeoutMs: 40,
      ackRandomFactor: 1,
      maxRetransmit,
    }));
    client = await RawCoapClient.connect(server.address().port);
    client.autoAck = false;
    await observeAll(client, ids(n));

    state.replaceRegistry(records(n, 120));
    // 30 relations / window 4 → 8 waves of one ACK timeout (40 ms) each, then the last backoff (40+80+160 ms).
    const deadline = performance.now() + 5000;
    while (server.observerCount > 0 && performance.now() < deadline) await client.collect(50);
    await client.collect(100);

    expect(server.observerCount).toBe(0);
    expect(server.stats.observersRemovedByTimeout).toBe(n);
    expect(server.stats.retransmissions).toBe(n * maxRetransmit);
    const sent = notifications(client.inbox);
    expect(sent).toHaveLength(n * (1 + maxRetransmit));
    // Every relation got its notification, each sent 1 + MAX_RETRANSMIT times under one message id.
    const byToken = new Map<string, Set<number>>();
    for (const r of sent) {
      const token = r.packet.token.toString();
      const mids = byToken.get(token) ?? new Set<number>();
      mids.add(r.packet.messageId);
      byToken.set(token, mids);
    }
    expect(byToken.size).toBe(n);
    expect([...byToken.values()].every((mids) => mids.size === 1)).toBe(true);
    expect(server.snapshot().inflightWindow).toBe(0);
  });
});
