import { decode } from 'cbor-x';
import type { CoapServer } from '../src/coap/server.js';
import type { GatewayState } from '../src/domain/gateway-state.js';
import { RawCoapClient, json, observe0, observe1, option, pathOptions, uint } from './support/coap-client.js';
import { device, startCoap } from './support/harness.js';

const settingsPath = (id: string) => pathOptions(`/devices/${id}/settings`);

describe('CoAP resources and Observe over a real UDP socket', () => {
  let state: GatewayState;
  let server: CoapServer;
  let client: RawCoapClient;

  beforeEach(async () => {
    ({ state, server } = await startCoap(
      [device('dev-1'), device('dev-2'), device('dev-off', { enabled: false })],
      { ackTimeoutMs: 60, maxRetransmit: 2, ackRandomFactor: 1 },
    ));
    client = await RawCoapClient.connect(server.address().port);
  });

  afterEach(async () => {
    await client.close();
    await server.close();
  });

  it('serves the settings document as JSON with ETag, Max-Age and Content-Format', async () => {
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('t1'),
      options: settingsPath('dev-1'),
    });
    const { packet } = await client.waitFor((p) => p.messageId === mid);
    expect(packet.ack).toBe(true);
    expect(packet.code).toBe('2.05');
    expect(packet.token.toString()).toBe('t1');
    expect(uint(option(packet, 'Content-Format'))).toBe(50);
    expect(uint(option(packet, 'Max-Age'))).toBe(60);
    expect(option(packet, 'ETag')).toHaveLength(8);
    expect(option(packet, 'Observe')).toBeUndefined();
    const doc = json(packet);
    expect(doc).toEqual({
      device_id: 'dev-1',
      version: expect.any(Number),
      source: 'registry',
      settings: { reporting_interval_s: 60 },
    });
  });

  it('serves CBOR on Accept: 60 and the public record at /devices/{id}', async () => {
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('c'),
      options: [...settingsPath('dev-1'), { name: 'Accept', value: Buffer.from([60]) }],
    });
    const { packet } = await client.waitFor((p) => p.messageId === mid);
    expect(uint(option(packet, 'Content-Format'))).toBe(60);
    const doc = decode(packet.payload) as Record<string, unknown>;
    expect(doc.device_id).toBe('dev-1');
    expect(Number(doc.version)).toBe(state.settingsDocument('dev-1')!.version);

    const mid2 = client.send({ confirmable: true, code: 'GET', options: pathOptions('/devices/dev-2') });
    const record = json((await client.waitFor((p) => p.messageId === mid2)).packet);
    expect(record).toEqual({
      device_id: 'dev-2',
      site_id: '00000000-0000-4000-8000-000000000001',
      name: 'Device dev-2',
      model: 'test-model',
      enabled: true,
      version: expect.any(Number),
    });
  });

  it('answers 4.04 for unknown and disabled devices, 4.05 for other methods, 4.06 for other formats', async () => {
    for (const path of [
      '/devices/nope/settings',
      '/devices/dev-off/settings',
      '/devices/dev-off',
      '/other',
    ]) {
      const mid = client.send({ confirmable: true, code: 'GET', options: pathOptions(path) });
      expect((await client.waitFor((p) => p.messageId === mid)).packet.code).toBe('4.04');
    }
    for (const method of ['POST', 'PUT', 'DELETE', 'FETCH', 'PATCH', 'iPATCH', '0.08', '0.31'] as const) {
      const mid = client.send({ confirmable: true, code: method, options: settingsPath('dev-1') });
      expect((await client.waitFor((p) => p.messageId === mid)).packet.code).toBe('4.05');
    }
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      options: [...settingsPath('dev-1'), { name: 'Accept', value: Buffer.from([0]) }],
    });
    expect((await client.waitFor((p) => p.messageId === mid)).packet.code).toBe('4.06');
    // NON request → NON response with its own message id.
    client.send({
      confirmable: false,
      code: 'POST',
      token: Buffer.from('n'),
      options: settingsPath('dev-1'),
    });
    const non = await client.waitFor((p) => p.token.toString() === 'n');
    expect(non.packet.confirmable || non.packet.ack || non.packet.reset).toBe(false);
    expect(non.packet.code).toBe('4.05');
  });

  it('answers an unrecognised critical option with 4.02 and ignores an unknown elective one', async () => {
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      options: [...settingsPath('dev-1'), { name: '2050', value: Buffer.from([1]) }],
    });
    expect((await client.waitFor((p) => p.messageId === mid)).packet.code).toBe('2.05');
    const mid2 = client.send({
      confirmable: true,
      code: 'GET',
      options: [...settingsPath('dev-1'), { name: '2051', value: Buffer.from([1]) }],
    });
    expect((await client.waitFor((p) => p.messageId === mid2)).packet.code).toBe('4.02');
  });

  it('answers 2.03 Valid when the client already holds the current ETag', async () => {
    const mid = client.send({ confirmable: true, code: 'GET', options: settingsPath('dev-1') });
    const etag = option((await client.waitFor((p) => p.messageId === mid)).packet, 'ETag')!;
    const mid2 = client.send({
      confirmable: true,
      code: 'GET',
      options: [{ name: 'ETag', value: etag }, ...settingsPath('dev-1')],
    });
    const valid = (await client.waitFor((p) => p.messageId === mid2)).packet;
    expect(valid.code).toBe('2.03');
    expect(valid.payload).toHaveLength(0);
  });

  it('registers on Observe=0, notifies a newer version, and never notifies an unchanged state', async () => {
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('obs1'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    const first = (await client.waitFor((p) => p.messageId === mid)).packet;
    expect(first.ack).toBe(true);
    expect(option(first, 'Observe')).toBeDefined();
    const v1 = json(first).version as number;
    expect(server.observerCount).toBe(1);

    const from = client.inbox.length;
    state.setOverride('dev-1', { reporting_interval_s: 120 });
    const note = (await client.waitFor((p) => p.token.toString() === 'obs1', 2000, from)).packet;
    expect(note.confirmable).toBe(true); // CON registration → CON notifications
    expect(note.code).toBe('2.05');
    const doc = json(note);
    expect(doc.source).toBe('override');
    expect(doc.settings).toEqual({ reporting_interval_s: 120 });
    expect(doc.version as number).toBeGreaterThan(v1);
    expect(uint(option(note, 'Observe'))!).toBeGreaterThan(uint(option(first, 'Observe'))!);

    // The same override again changes nothing visible: no notification.
    expect(state.setOverride('dev-1', { reporting_interval_s: 120 }).changed).toBe(false);
    expect((await client.collect(150)).filter((r) => r.packet.token.toString() === 'obs1')).toHaveLength(0);
  });

  it('sends NON notifications (not ACK-typed) to a NON observer and drops it on RST', async () => {
    client.send({
      confirmable: false,
      code: 'GET',
      token: Buffer.from('non'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    const first = (await client.waitFor((p) => p.token.toString() === 'non')).packet;
    expect(first.confirmable || first.ack).toBe(false);
    const from = client.inbox.length;
    state.setOverride('dev-1', { reporting_interval_s: 300 });
    const note = (await client.waitFor((p) => p.token.toString() === 'non', 2000, from)).packet;
    expect(note.confirmable || note.ack || note.reset).toBe(false);
    // RST to a NON notification cancels the relation (RFC 7641 3.6).
    client.send({ reset: true, code: '0.00', messageId: note.messageId });
    await client.collect(50);
    expect(server.observerCount).toBe(0);
    state.setOverride('dev-1', { reporting_interval_s: 400 });
    expect((await client.collect(150)).length).toBe(0);
  });

  it('drops a CON observer on RST', async () => {
    client.autoAck = false;
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('c'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    await client.waitFor((p) => p.token.toString() === 'c');
    const from = client.inbox.length;
    state.setOverride('dev-1', { reporting_interval_s: 301 });
    const note = (await client.waitFor((p) => p.confirmable, 2000, from)).packet;
    client.send({ reset: true, code: '0.00', messageId: note.messageId });
    await client.collect(50);
    expect(server.observerCount).toBe(0);
    expect(server.stats.observersRemovedByRst).toBe(1);
  });

  it('replaces, never duplicates, a registration from the same endpoint (same token, or same resource)', async () => {
    for (const token of ['a', 'a', 'a', 'b']) {
      client.send({
        confirmable: true,
        code: 'GET',
        token: Buffer.from(token),
        options: [observe0, ...settingsPath('dev-1')],
      });
      await client.waitFor((p) => p.token.toString() === token, 2000, client.inbox.length - 0);
    }
    await client.collect(30);
    expect(server.observerCount).toBe(1);
    const from = client.inbox.length;
    state.setOverride('dev-1', { reporting_interval_s: 500 });
    const got = await client.collect(200);
    expect(got.slice(0).filter((r) => r.packet.code === '2.05')).toHaveLength(1);
    expect(client.inbox[from]!.packet.token.toString()).toBe('b');
  });

  it('deregisters on Observe=1 and answers it as a plain GET', async () => {
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('x'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    await client.waitFor((p) => p.token.toString() === 'x');
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('x'),
      options: [observe1, ...settingsPath('dev-1')],
    });
    const reply = (await client.waitFor((p) => p.messageId === mid)).packet;
    expect(reply.code).toBe('2.05');
    expect(option(reply, 'Observe')).toBeUndefined();
    expect(server.observerCount).toBe(0);
    state.setOverride('dev-1', { reporting_interval_s: 600 });
    expect(await client.collect(150)).toHaveLength(0);
  });

  it('removes an observer whose confirmable notifications stay unacknowledged, after retransmitting', async () => {
    client.autoAck = false;
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('dead'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    await client.waitFor((p) => p.token.toString() === 'dead');
    state.setOverride('dev-1', { reporting_interval_s: 700 });
    // ACK timeout 60 ms, factor 1, 2 retransmissions: gives up after 60 + 120 + 240 ms.
    const got = await client.collect(700);
    const notes = got.filter((r) => r.packet.confirmable);
    expect(notes).toHaveLength(3);
    expect(new Set(notes.map((r) => r.packet.messageId)).size).toBe(1);
    expect(server.observerCount).toBe(0);
    expect(server.stats.observersRemovedByTimeout).toBe(1);
  });

  it('replaces a notification still awaiting its ACK with the newer state (RFC 7641 4.5.2)', async () => {
    client.autoAck = false;
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('r'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    await client.waitFor((p) => p.token.toString() === 'r');
    const from = client.inbox.length;
    state.setOverride('dev-1', { reporting_interval_s: 800 });
    state.setOverride('dev-1', { reporting_interval_s: 900 });
    state.setOverride('dev-1', { reporting_interval_s: 1000 });
    const first = (await client.waitFor((p) => p.confirmable, 1000, from)).packet;
    expect(json(first).settings).toEqual({ reporting_interval_s: 800 });
    // Not acknowledged: at the retransmission the newest state goes out instead, under a new message id.
    const second = (await client.waitFor((p) => p.confirmable && p.messageId !== first.messageId, 1000, from))
      .packet;
    expect(json(second).settings).toEqual({ reporting_interval_s: 1000 });
    client.send({ ack: true, code: '0.00', messageId: second.messageId });
    const later = await client.collect(300);
    expect(later).toHaveLength(0);
    expect(server.observerCount).toBe(1);
  });

  it('sends a final 4.04 and removes observers when a reload disables or removes the device', async () => {
    client.send({
      confirmable: false,
      code: 'GET',
      token: Buffer.from('s1'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('r2'),
      options: [observe0, ...pathOptions('/devices/dev-2')],
    });
    await client.waitFor((p) => p.token.toString() === 's1');
    await client.waitFor((p) => p.token.toString() === 'r2');
    expect(server.observerCount).toBe(2);
    const from = client.inbox.length;
    state.replaceRegistry([device('dev-1', { enabled: false })]);
    const a = (await client.waitFor((p) => p.token.toString() === 's1', 2000, from)).packet;
    const b = (await client.waitFor((p) => p.token.toString() === 'r2', 2000, from)).packet;
    for (const p of [a, b]) {
      expect(p.code).toBe('4.04');
      expect(option(p, 'Observe')).toBeUndefined();
    }
    await client.collect(50);
    expect(server.observerCount).toBe(0);
  });

  it('notifies record observers only when the record changes, settings observers only when settings change', async () => {
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('rec'),
      options: [observe0, ...pathOptions('/devices/dev-1')],
    });
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('set'),
      options: [observe0, ...settingsPath('dev-1')],
    });
    await client.waitFor((p) => p.token.toString() === 'rec');
    await client.waitFor((p) => p.token.toString() === 'set');
    let from = client.inbox.length;
    state.replaceRegistry([device('dev-1', { name: 'Renamed' }), device('dev-2')]);
    const rec = (await client.waitFor((p) => p.token.toString() === 'rec', 2000, from)).packet;
    expect(json(rec).name).toBe('Renamed');
    expect((await client.collect(100)).filter((r) => r.packet.token.toString() === 'set')).toHaveLength(0);
    from = client.inbox.length;
    state.replaceRegistry([
      device('dev-1', { name: 'Renamed', desiredSettings: { telemetry_enabled: false } }),
      device('dev-2'),
    ]);
    const set = (await client.waitFor((p) => p.token.toString() === 'set', 2000, from)).packet;
    expect(json(set).settings).toEqual({ telemetry_enabled: false });
    expect((await client.collect(100)).filter((r) => r.packet.token.toString() === 'rec')).toHaveLength(0);
  });

  it('answers a CoAP ping with RST, a malformed CON with RST and a malformed NON with silence', async () => {
    client.sendRaw(Buffer.from([0x40, 0x00, 0x12, 0x34]));
    const rst = (await client.waitFor((p) => p.messageId === 0x1234)).packet;
    expect(rst.reset).toBe(true);
    // CON GET, TKL 9 (reserved): format error.
    client.sendRaw(Buffer.from([0x49, 0x01, 0x22, 0x22, 1, 2, 3, 4, 5, 6, 7, 8, 9]));
    expect((await client.waitFor((p) => p.messageId === 0x2222)).packet.reset).toBe(true);
    // NON GET with a payload marker and no payload: silently ignored.
    client.sendRaw(Buffer.from([0x50, 0x01, 0x33, 0x33, 0xff]));
    expect(await client.collect(100)).toHaveLength(0);
    expect(server.stats.malformed).toBe(2);
  });
});

describe('CoAP confirmable refresh (RFC 7641 4.5)', () => {
  it('sends a confirmable notification to a NON observer once per refresh period and drops it when unanswered', async () => {
    const { state, server } = await startCoap([device('dev-1')], {
      confirmableRefreshMs: 300,
      ackTimeoutMs: 40,
      ackRandomFactor: 1,
      maxRetransmit: 1,
    });
    const client = await RawCoapClient.connect(server.address().port);
    try {
      client.send({
        confirmable: false,
        code: 'GET',
        token: Buffer.from('n'),
        options: [observe0, ...settingsPath('dev-1')],
      });
      await client.waitFor((p) => p.token.toString() === 'n');
      state.setOverride('dev-1', { reporting_interval_s: 11 });
      const non = await client.waitFor((p) => p.code === '2.05' && !p.confirmable && !p.ack, 1000, 1);
      expect(non.packet.confirmable).toBe(false);
      await new Promise((r) => setTimeout(r, 320));
      // The refresh period has passed since the last confirmed exchange (never, for a NON observer).
      const from = client.inbox.length;
      state.setOverride('dev-1', { reporting_interval_s: 12 });
      const con = (await client.waitFor((p) => p.code === '2.05', 1000, from)).packet;
      expect(con.confirmable).toBe(true);
      // A device that never answers is found by the refresh and removed.
      client.autoAck = false;
      await new Promise((r) => setTimeout(r, 1500));
      expect(server.observerCount).toBe(0);
    } finally {
      await client.close();
      await server.close();
    }
  });
});
