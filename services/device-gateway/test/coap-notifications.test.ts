// What a notification carries (design §3.3/3.4): CBOR and JSON observers both get ETag and
// Max-Age, CBOR writes the version as an integer, a registration that already holds the current ETag gets
// 2.03, the per-endpoint relation cap answers like a plain GET, and the largest document the gateway accepts
// reaches an observer with the longest token it accepts in one datagram, whole.
import { decode } from 'cbor-x';
import type { CoapServer } from '../src/coap/server.js';
import { MAX_MESSAGE_BYTES } from '../src/coap/representations.js';
import { DocumentTooLargeError, type GatewayState } from '../src/domain/gateway-state.js';
import { RawCoapClient, json, observe0, option, pathOptions, uint } from './support/coap-client.js';
import { device, startCoap } from './support/harness.js';

const settingsPath = (id: string) => pathOptions(`/devices/${id}/settings`);
const ACCEPT_CBOR = { name: 'Accept' as const, value: Buffer.from([60]) };

/** The CBOR major type of the value that follows the text key `key` in a CBOR map. */
function cborMajorTypeAfter(payload: Buffer, key: string): number {
  const at = payload.indexOf(Buffer.from(key));
  expect(at).toBeGreaterThan(0);
  return payload[at + key.length]! >> 5;
}

describe('CoAP notifications over a real UDP socket', () => {
  let state: GatewayState;
  let server: CoapServer;
  let client: RawCoapClient;

  beforeEach(async () => {
    ({ state, server } = await startCoap(
      ['dev-1', 'dev-2', 'dev-3', 'dev-4'].map((id) => device(id)),
      { maxRelationsPerEndpoint: 3 },
    ));
    client = await RawCoapClient.connect(server.address().port);
  });

  afterEach(async () => {
    await client.close();
    await server.close();
  });

  it('CBOR and JSON observers get notifications with ETag and Max-Age; CBOR carries the version as an integer', async () => {
    const cbor = client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('cb'),
      options: [observe0, ...settingsPath('dev-1'), ACCEPT_CBOR],
    });
    const first = (await client.waitFor((p) => p.messageId === cbor)).packet;
    expect(uint(option(first, 'Content-Format'))).toBe(60);
    // A second endpoint: the same endpoint observing the same resource again would replace the relation.
    const other = await RawCoapClient.connect(server.address().port);
    try {
      other.send({
        confirmable: true,
        code: 'GET',
        token: Buffer.from('js'),
        options: [observe0, ...settingsPath('dev-1')],
      });
      await other.waitFor((p) => p.token.toString() === 'js');
    } catch (err) {
      await other.close();
      throw err;
    }

    const from = client.inbox.length;
    const fromOther = other.inbox.length;
    state.setOverride('dev-1', { reporting_interval_s: 90 });
    const cborNote = (await client.waitFor((p) => p.token.toString() === 'cb', 2000, from)).packet;
    const jsonNote = (await other.waitFor((p) => p.token.toString() === 'js', 2000, fromOther)).packet;
    await other.close();

    expect(uint(option(cborNote, 'Content-Format'))).toBe(60);
    const doc = decode(cborNote.payload) as { version: unknown; settings: unknown; source: string };
    expect(doc.settings).toEqual({ reporting_interval_s: 90 });
    expect(doc.source).toBe('override');
    // An unsigned integer (major type 0), not a float: cbor-x hands 64-bit integers back as BigInt.
    expect(cborMajorTypeAfter(cborNote.payload, 'version')).toBe(0);
    const version = Number(doc.version);
    expect(Number.isSafeInteger(version)).toBe(true);
    expect(version).toBeGreaterThan(Number((decode(first.payload) as { version: bigint | number }).version));

    expect(uint(option(jsonNote, 'Content-Format'))).toBe(50);
    expect(json(jsonNote).version).toBe(version);
    for (const note of [cborNote, jsonNote]) {
      expect(option(note, 'ETag')).toHaveLength(8);
      expect(uint(option(note, 'Max-Age'))).toBeGreaterThan(0);
      expect(option(note, 'Observe')).toBeDefined();
    }
    expect(option(cborNote, 'ETag')).not.toEqual(option(first, 'ETag'));
  });

  it('a registration that already holds the current ETag gets 2.03 Valid with Observe, and is registered', async () => {
    const get = client.send({ confirmable: true, code: 'GET', options: settingsPath('dev-2') });
    const etag = option((await client.waitFor((p) => p.messageId === get)).packet, 'ETag')!;
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('v'),
      options: [observe0, { name: 'ETag', value: etag }, ...settingsPath('dev-2')],
    });
    const valid = (await client.waitFor((p) => p.messageId === mid)).packet;
    expect(valid.code).toBe('2.03');
    expect(valid.payload).toHaveLength(0);
    expect(option(valid, 'Observe')).toBeDefined();
    expect(server.observerCount).toBe(1);
    const from = client.inbox.length;
    state.setOverride('dev-2', { telemetry_enabled: false });
    const note = (await client.waitFor((p) => p.token.toString() === 'v', 2000, from)).packet;
    expect(note.code).toBe('2.05');
    expect(json(note).settings).toEqual({ telemetry_enabled: false });
  });

  it('an endpoint at its relation cap gets its next observe answered as a plain GET, not registered', async () => {
    for (const id of ['dev-1', 'dev-2', 'dev-3']) {
      const mid = client.send({
        confirmable: true,
        code: 'GET',
        token: Buffer.from(id),
        options: [observe0, ...settingsPath(id)],
      });
      expect(option((await client.waitFor((p) => p.messageId === mid)).packet, 'Observe')).toBeDefined();
    }
    const mid = client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('dev-4'),
      options: [observe0, ...settingsPath('dev-4')],
    });
    const reply = (await client.waitFor((p) => p.messageId === mid)).packet;
    expect(reply.code).toBe('2.05');
    expect(option(reply, 'Observe')).toBeUndefined(); // RFC 7641 4.1: not added to the list
    expect(json(reply).device_id).toBe('dev-4');
    expect(server.observerCount).toBe(3);
    expect(server.stats.registrationsRefused).toBe(1);
    state.setOverride('dev-4', { maintenance_mode: true });
    expect((await client.collect(150)).filter((r) => r.packet.token.toString() === 'dev-4')).toHaveLength(0);
  });

  it('the largest accepted document reaches an observer with a 64-byte token in one datagram, whole', async () => {
    // Grow the settings until the gateway refuses them; keep the last accepted one.
    const thresholds: Record<string, { min: number; max: number }> = {};
    let largest: Record<string, unknown> | undefined;
    let refusal: unknown;
    for (let i = 0; i < 16 && refusal === undefined; i++) {
      thresholds[`t${String(i).padStart(2, '0')}${'x'.repeat(28)}`] = { min: -1.5e-300, max: 1.5e300 };
      const candidate = { timezone: 'America/Argentina/ComodRivadavia', thresholds: { ...thresholds } };
      try {
        state.prepareOverride('dev-3', candidate);
        largest = candidate;
      } catch (err) {
        refusal = err;
      }
    }
    expect(refusal).toBeInstanceOf(DocumentTooLargeError);
    expect(largest).toBeDefined();

    // An RFC 8974 extended token (TKL 13 and one extra byte); coap-packet encodes and parses it.
    const token = Buffer.alloc(64, 0x5a);
    client.send({ confirmable: true, code: 'GET', token, options: [observe0, ...settingsPath('dev-3')] });
    await client.waitFor((p) => p.token.equals(token));
    const from = client.inbox.length;
    state.setOverride('dev-3', largest!);
    const note = await client.waitFor((p) => p.token.equals(token), 2000, from);
    expect(note.raw.length).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
    expect(note.raw.length).toBeGreaterThan(MAX_MESSAGE_BYTES - 64); // the case at the limit, not a small one
    expect(note.raw[0]! & 15).toBe(13);
    const body = json(note.packet);
    expect(body.settings).toEqual(largest);
    expect(body.device_id).toBe('dev-3');
  });
});
