// The device's own word (issue 40 §1, §2, §6; design §3.4, §3.8) through the whole gateway on a real PostgreSQL:
// libcoap's coap-client-openssl over coaps with a device key, coap-client-notls for a keyless device, the test
// kit's PSK client (node-dtls-client) and raw CoAP over UDP report what they did with a version; the device view
// and the fleet list then say it, and nothing is recorded for any refusal.
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { encode } from 'cbor-x';
import { generate, parse, type ParsedPacket } from 'coap-packet';
import { sql } from 'kysely';
import request from 'supertest';
import { issueCredential, type IssuedCredential } from '../src/db/credential-repository.js';
import { readDelivery } from '../src/delivery/sql.js';
import { reportBatchWriter, type ReportRow } from '../src/delivery/reports.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';
import { RawCoapClient, observe0, option, pathOptions, uint } from './support/coap-client.js';
import { connectNodeClient, runTool, sleep, type NodeClient } from './support/dtls.js';

jest.setTimeout(90_000);

const KEYED = 'acme-hq-hvac-01';
const KEYED_OTHER = 'acme-hq-lobby-sensor-03';
const KEYLESS = 'borealis-tower-chiller-01';
const ACKER = 'acme-wh-door-01';
const NON_DEVICE = 'acme-wh-freezer-02';
const LATE_CON = 'late-con-01';
const LATE_NON = 'late-non-01';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

let gw: GatewayFixture;
let coapsPort: number;
let keyA: IssuedCredential;
let keyOther: IssuedCredential;
let dir: string;
const clients: NodeClient[] = [];
const raws: RawCoapClient[] = [];

beforeAll(async () => {
  gw = await startGateway({
    env: {
      GATEWAY_COAP_SECURITY: 'both',
      GATEWAY_COAPS_PORT: '0',
      DTLS_IDLE_TIMEOUT_S: '600',
      GATEWAY_DELIVERY_FLUSH_MS: '100',
    },
    load: false,
  });
  // Two more devices on a seeded device's site, for the late registrations.
  await sql`INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT d, site_id, 'Late ' || d, 'door-ctl-7' FROM device_gateway.device_registry,
      unnest(ARRAY[${LATE_CON}, ${LATE_NON}]) AS d WHERE device_id = ${ACKER}`.execute(gw.owner);
  keyA = await issueCredential(gw.owner, KEYED);
  keyOther = await issueCredential(gw.owner, KEYED_OTHER);
  await gw.app.service.reload();
  coapsPort = gw.app.dtls!.address().port;
  gw.app.delivery!.start();
  dir = await mkdtemp(join(tmpdir(), 'device-word-'));
});

afterAll(async () => {
  for (const c of clients) c.socket.close();
  for (const r of raws) await r.close();
  await rm(dir, { recursive: true, force: true });
  await gw.app.delivery?.stop();
  await gw.close();
});

/** notify-settings for `deviceId`: the answer's version and relations_notified. */
async function notify(
  deviceId: string,
  settings: Record<string, unknown>,
): Promise<{ version: number; relations_notified: number }> {
  const res = await request(gw.app.http)
    .post('/api/notify-settings')
    .set(auth)
    .send({ device_id: deviceId, settings })
    .expect(200);
  expect(res.body.status).toBe('updated');
  return res.body as { version: number; relations_notified: number };
}

interface Delivery {
  state: string;
  desired: { version: number; digest: string };
  acknowledged: { version: number } | null;
  reported: {
    version: number;
    outcome: string;
    reason: string | null;
    transport: string;
    is_desired: boolean;
    settings: Record<string, unknown> | null;
    delta: Record<string, unknown> | null;
  } | null;
}

async function view(
  deviceId: string,
): Promise<{ delivery: Delivery; replicas: { relations?: Record<string, unknown>[] }[] }> {
  const res = await request(gw.app.http).get(`/api/devices/${deviceId}`).set(auth).expect(200);
  return res.body as { delivery: Delivery; replicas: { relations?: Record<string, unknown>[] }[] };
}

async function waitState(deviceId: string, state: string): Promise<Delivery> {
  let last: Delivery | undefined;
  const until = Date.now() + 10_000;
  while (Date.now() < until) {
    last = (await view(deviceId)).delivery;
    if (last?.state === state) return last;
    await sleep(50);
  }
  throw new Error(`${deviceId}: state ${last?.state}, not ${state}`);
}

/** libcoap over coaps with the device's key: POST `payload` (a file) to `path`; the tool's output. */
async function coapsPost(key: IssuedCredential, path: string, file: string, format: string): Promise<string> {
  const run = await runTool(
    'coap-client-openssl',
    [
      '-m',
      'post',
      '-t',
      format,
      '-f',
      file,
      '-u',
      key.identity,
      '-k',
      key.keyText,
      '-B',
      '5',
      `coaps://127.0.0.1:${coapsPort}${path}`,
    ],
    '',
    undefined,
    15_000,
  );
  return run.output;
}

async function payloadFile(name: string, body: Buffer | string): Promise<string> {
  const file = join(dir, name);
  await writeFile(file, body);
  return file;
}

let mid = 100;
/** A raw CoAP request over plain UDP (coap-packet, not the gateway's codec); the response. */
async function plain(
  method: 'POST' | 'PUT' | 'GET',
  path: string,
  payload: Buffer,
  format: number | null = 50,
  extra: { name: string; value: Buffer }[] = [],
): Promise<ParsedPacket> {
  const client = await RawCoapClient.connect(gw.coapPort);
  raws.push(client);
  const options = [...pathOptions(path), ...extra] as { name: string; value: Buffer }[];
  if (format !== null) options.push({ name: 'Content-Format', value: uintBuf(format) });
  client.send({
    confirmable: true,
    code: method,
    messageId: mid++ & 0xffff,
    token: Buffer.from([1, 2]),
    options,
    payload,
  });
  await client.waitFor((p) => p.ack || p.code !== '0.00');
  return client.inbox.at(-1)!.packet;
}

function uintBuf(n: number): Buffer {
  if (n === 0) return Buffer.alloc(0);
  return n < 256 ? Buffer.from([n]) : Buffer.from([n >> 8, n & 0xff]);
}

const body = (o: Record<string, unknown>): Buffer => Buffer.from(JSON.stringify(o));

/** A PSK client session (node-dtls-client) as `key`'s device: a CON request, its response. */
async function overSession(
  key: IssuedCredential,
  method: 'POST' | 'PUT',
  path: string,
  payload: Buffer,
  format = 50,
): Promise<ParsedPacket> {
  const client = await connectNodeClient(coapsPort, {
    identity: key.identity,
    key: Buffer.from(key.keyText),
  });
  clients.push(client);
  const reply = await client.request(
    generate({
      confirmable: true,
      code: method,
      messageId: mid++ & 0xffff,
      token: Buffer.from([9, 9]),
      options: [...pathOptions(path), { name: 'Content-Format', value: uintBuf(format) }],
      payload,
    }),
  );
  return parse(reply);
}

describe('reports over coaps (libcoap with the device key)', () => {
  it('an applied report in JSON moves the device to applied, with the reported document and its delta', async () => {
    const { version } = await notify(KEYED, { reporting_interval_s: 240, telemetry_enabled: true });
    const file = await payloadFile(
      'applied.json',
      JSON.stringify({
        version,
        outcome: 'applied',
        settings: { reporting_interval_s: 240, maintenance_mode: false },
      }),
    );
    const out = await coapsPost(keyA, `/devices/${KEYED}/reported`, file, 'json');
    expect(out).not.toMatch(/4\.\d\d|5\.\d\d/);
    const d = await waitState(KEYED, 'applied');
    expect(d.reported).toMatchObject({ version, outcome: 'applied', transport: 'dtls', is_desired: true });
    // What the device would change to run the desired settings (RFC 7396): telemetry on, maintenance_mode gone.
    expect(d.reported!.delta).toEqual({ telemetry_enabled: true, maintenance_mode: null });
  });

  it('a rejected report in CBOR (Content-Format 60) moves it to rejected, with the reason', async () => {
    const { version } = await notify(KEYED, { reporting_interval_s: 300 });
    const file = await payloadFile(
      'rejected.cbor',
      encode({ version, outcome: 'rejected', reason: 'interval_unsupported' }),
    );
    const out = await coapsPost(keyA, `/devices/${KEYED}/reported`, file, '60');
    expect(out).not.toMatch(/4\.\d\d|5\.\d\d/);
    const d = await waitState(KEYED, 'rejected');
    expect(d.reported).toMatchObject({
      version,
      outcome: 'rejected',
      reason: 'interval_unsupported',
      settings: null,
    });
    const list = await request(gw.app.http).get('/api/devices?delivery=rejected').set(auth).expect(200);
    expect((list.body.items as { device_id: string }[]).map((i) => i.device_id)).toContain(KEYED);
  });

  it("another device's path over a DTLS session is 4.04, as an unknown device, and nothing is recorded", async () => {
    const before = await readDelivery(gw.reader, KEYED_OTHER);
    const version = (await notify(KEYED_OTHER, { reporting_interval_s: 120 })).version;
    const file = await payloadFile('other.json', JSON.stringify({ version, outcome: 'applied' }));
    const out = await coapsPost(keyA, `/devices/${KEYED_OTHER}/reported`, file, 'json');
    expect(out).toMatch(/4\.04/);
    const res = await overSession(
      keyA,
      'PUT',
      `/devices/${KEYED_OTHER}/reported`,
      body({ version, outcome: 'applied' }),
    );
    expect(res.code).toBe('4.04');
    // An unknown device answers the same.
    const unknown = await overSession(
      keyA,
      'POST',
      `/devices/no-such-device/reported`,
      body({ version, outcome: 'applied' }),
    );
    expect(unknown.code).toBe('4.04');
    await sleep(300);
    const after = await readDelivery(gw.reader, KEYED_OTHER);
    expect(after?.reported_version ?? null).toBeNull();
    expect(before?.reported_version ?? null).toBeNull();
    // Its own path works over the same kind of session.
    const own = await overSession(
      keyOther,
      'PUT',
      `/devices/${KEYED_OTHER}/reported`,
      body({ version, outcome: 'applied' }),
    );
    expect(own.code).toBe('2.04');
  });

  it('plain CoAP cannot speak for a keyed device: 4.01, nothing recorded', async () => {
    const before = await readDelivery(gw.reader, KEYED);
    const res = await plain(
      'POST',
      `/devices/${KEYED}/reported`,
      body({ version: Number(before!.reported_version), outcome: 'applied' }),
    );
    expect(res.code).toBe('4.01');
    expect(res.payload.toString()).toMatch(/DTLS/);
    const after = await readDelivery(gw.reader, KEYED);
    expect(after!.reported_outcome).toBe(before!.reported_outcome);
    expect(after!.reported_at).toEqual(before!.reported_at);
  });
});

describe('reports over plain CoAP for a keyless device (coap-client-notls)', () => {
  it('applied, then a replayed old version: 2.04 and the state does not move back', async () => {
    const first = await notify(KEYLESS, { reporting_interval_s: 60 });
    const url = `coap://127.0.0.1:${gw.coapPort}/devices/${KEYLESS}/reported`;
    const send = async (payload: Record<string, unknown>): Promise<string> =>
      (
        await runTool(
          'coap-client-notls',
          ['-m', 'put', '-t', 'json', '-e', JSON.stringify(payload), '-B', '5', url],
          '',
          undefined,
          10_000,
        )
      ).output;
    expect(await send({ version: first.version, outcome: 'applied' })).not.toMatch(/4\.\d\d|5\.\d\d/);
    await waitState(KEYLESS, 'applied');
    const second = await notify(KEYLESS, { reporting_interval_s: 90 });
    await waitState(KEYLESS, 'sent_unconfirmed').catch(() => undefined);
    expect(await send({ version: second.version, outcome: 'applied' })).not.toMatch(/4\.\d\d|5\.\d\d/);
    let d = await waitState(KEYLESS, 'applied');
    expect(d.reported!.version).toBe(second.version);
    // The first version again, now rejected: accepted (2.04, the device need not retry) and moves nothing.
    expect(await send({ version: first.version, outcome: 'rejected', reason: 'late' })).not.toMatch(
      /4\.\d\d|5\.\d\d/,
    );
    await sleep(200);
    d = (await view(KEYLESS)).delivery;
    expect(d.state).toBe('applied');
    expect(d.reported).toMatchObject({ version: second.version, outcome: 'applied', transport: 'plain' });
  });

  it('a version newer than any known but within the record lag is 5.03 with Max-Age (retry), nothing recorded', async () => {
    const { version } = await notify(KEYLESS, { reporting_interval_s: 97 });
    const before = await readDelivery(gw.reader, KEYLESS);
    // A millisecond after the newest version: another replica may have issued it and not written its row yet.
    const res = await plain(
      'POST',
      `/devices/${KEYLESS}/reported`,
      body({ version: version + 1000, outcome: 'applied' }),
    );
    expect(res.code).toBe('5.03');
    expect(uint(option(res, 'Max-Age'))).toBe(1);
    expect(res.payload.toString()).toMatch(/retry/);
    expect((await readDelivery(gw.reader, KEYLESS))!.reported_at).toEqual(before!.reported_at);
  });

  it('a version never issued to the device is 4.09 with a diagnostic; nothing recorded', async () => {
    const before = await readDelivery(gw.reader, KEYLESS);
    // An hour ahead of anything issued: not a version the record's lag could hide.
    const forged = Number(before!.reported_version) + 3_600_000_000;
    const res = await plain(
      'POST',
      `/devices/${KEYLESS}/reported`,
      body({ version: forged, outcome: 'applied' }),
    );
    expect(res.code).toBe('4.09');
    expect(res.payload.toString()).toMatch(/never issued/);
    const after = await readDelivery(gw.reader, KEYLESS);
    expect(after!.reported_version).toBe(before!.reported_version);
    expect(after!.reported_at).toEqual(before!.reported_at);
  });

  it.each<[string, Buffer, number | null, string, { name: string; value: Buffer }[]?]>([
    ['not JSON', Buffer.from('{"version":'), 50, '4.00'],
    ['an unknown field', body({ version: 1, outcome: 'applied', extra: 1 }), 50, '4.00'],
    ['a rejection without reason', body({ version: 1, outcome: 'rejected' }), 50, '4.00'],
    ['an invalid reason', body({ version: 1, outcome: 'rejected', reason: 'Bad Reason' }), 50, '4.00'],
    ['a fractional version', body({ version: 1.5, outcome: 'applied' }), 50, '4.00'],
    [
      'invalid settings',
      body({ version: 1, outcome: 'applied', settings: { reporting_interval_s: 1 } }),
      50,
      '4.00',
    ],
    ['CBOR with a tag', Buffer.from('c11a514b67b0', 'hex'), 60, '4.00'],
    ['JSON sent as CBOR', body({ version: 1, outcome: 'applied' }), 60, '4.00'],
    ['text/plain', body({ version: 1, outcome: 'applied' }), 0, '4.15'],
    ['no Content-Format', body({ version: 1, outcome: 'applied' }), null, '4.15'],
    ['a body past one datagram', body({ version: 1, outcome: 'applied', pad: 'x'.repeat(1100) }), 50, '4.13'],
    [
      'a Block1 transfer',
      body({ version: 1, outcome: 'applied' }),
      50,
      '4.13',
      [{ name: 'Block1', value: Buffer.from([0x0e]) }],
    ],
  ])('%s is refused (%s … %s) and records nothing', async (_what, payload, format, code, extra = []) => {
    const before = await readDelivery(gw.reader, KEYLESS);
    const res = await plain('POST', `/devices/${KEYLESS}/reported`, payload, format, extra);
    expect(res.code).toBe(code);
    // Every refusal carries a diagnostic payload (RFC 7252 §5.5.2).
    expect(res.payload.length).toBeGreaterThan(0);
    const after = await readDelivery(gw.reader, KEYLESS);
    expect(after!.reported_at).toEqual(before!.reported_at);
  });

  it('counts every answer in gateway_coap_reports_total by what it was', async () => {
    const text = (await request(gw.app.http).get('/metrics').set(auth).expect(200)).text;
    const count = (result: string): number =>
      Number(
        new RegExp(`^gateway_coap_reports_total\\{[^}]*result="${result}"[^}]*\\} (\\d+)`, 'm').exec(
          text,
        )?.[1] ?? 0,
      );
    expect(count('recorded')).toBeGreaterThanOrEqual(4);
    expect(count('not_issued')).toBeGreaterThanOrEqual(1);
    expect(count('malformed')).toBeGreaterThanOrEqual(8);
    expect(count('too_large')).toBeGreaterThanOrEqual(2);
    expect(count('content_format')).toBeGreaterThanOrEqual(2);
    expect(count('forbidden')).toBeGreaterThanOrEqual(1);
  });

  it('takes an Accept option (a client that always sends one), and refuses an unknown critical option with 4.02', async () => {
    const { version } = await notify(KEYLESS, { reporting_interval_s: 95 });
    const report = body({ version, outcome: 'applied' });
    const accept = { name: 'Accept', value: Buffer.from([50]) };
    expect((await plain('PUT', `/devices/${KEYLESS}/reported`, report, 50, [accept])).code).toBe('2.04');
    const before = await readDelivery(gw.reader, KEYLESS);
    const ifMatch = { name: 'If-Match', value: Buffer.from([1]) };
    expect((await plain('PUT', `/devices/${KEYLESS}/reported`, report, 50, [ifMatch])).code).toBe('4.02');
    expect((await readDelivery(gw.reader, KEYLESS))!.reported_at).toEqual(before!.reported_at);
  });

  it('GET on the report resource is 4.05; /.well-known/core lists it with its rt', async () => {
    const res = await plain('GET', `/devices/${KEYLESS}/reported`, Buffer.alloc(0), null);
    expect(res.code).toBe('4.05');
    const client = await connectNodeClient(coapsPort, {
      identity: keyA.identity,
      key: Buffer.from(keyA.keyText),
    });
    clients.push(client);
    const reply = parse(
      await client.request(
        generate({
          confirmable: true,
          code: 'GET',
          messageId: mid++ & 0xffff,
          options: pathOptions('/.well-known/core'),
        }),
      ),
    );
    expect(reply.payload.toString()).toContain(
      `</devices/${KEYED}/reported>;rt="platform.device.reported";ct="50 60"`,
    );
  });
});

describe('states that mean what they say', () => {
  it('a device that acknowledges and never reports stays acknowledged; the filters find it', async () => {
    const observer = await RawCoapClient.observeSettings(gw.coapPort, ACKER);
    raws.push(observer);
    const { version, relations_notified } = await notify(ACKER, {
      reporting_interval_s: 30 + (Date.now() % 100),
    });
    expect(relations_notified).toBe(1);
    const d = await waitState(ACKER, 'acknowledged');
    expect(d.acknowledged!.version).toBe(version);
    expect(d.reported).toBeNull();
    const ids = async (q: string): Promise<string[]> =>
      (
        (await request(gw.app.http).get(`/api/devices?${q}`).set(auth).expect(200)).body.items as {
          device_id: string;
        }[]
      ).map((i) => i.device_id);
    expect(await ids('delivery=not_applied')).toContain(ACKER);
    expect(await ids('delivery=applied')).not.toContain(ACKER);
    expect(await ids('delivery=pending,acknowledged')).toContain(ACKER);
    await sleep(1100);
    expect(await ids('delivery=acknowledged&acknowledged_for_s=1')).toContain(ACKER);
    expect(await ids('delivery=acknowledged&acknowledged_for_s=3600')).not.toContain(ACKER);
  });

  it('a NON observer is sent_unconfirmed, not pending', async () => {
    const client = await RawCoapClient.connect(gw.coapPort);
    raws.push(client);
    client.send({
      confirmable: false,
      code: 'GET',
      token: Buffer.from('n1'),
      options: [observe0, ...pathOptions(`/devices/${NON_DEVICE}/settings`)],
    });
    await client.waitFor((p) => p.code === '2.05');
    await notify(NON_DEVICE, { reporting_interval_s: 45 });
    await waitState(NON_DEVICE, 'sent_unconfirmed');
  });

  it('a plain observer of a keyed device is shown as such, not unobserved', async () => {
    const observer = await RawCoapClient.observeSettings(gw.coapPort, KEYED_OTHER, 'k1');
    raws.push(observer);
    const v = await view(KEYED_OTHER);
    const relations = v.replicas.flatMap((p) => p.relations ?? []);
    expect(relations).toContainEqual(
      expect.objectContaining({ transport: 'plain', speaks_for_device: false }),
    );
    // Its own report over DTLS made it applied above; a new desired content puts it back where the record stands.
    await notify(KEYED_OTHER, { reporting_interval_s: 600 + (Date.now() % 100) });
    const d = await waitState(KEYED_OTHER, 'observed_unauthenticated');
    expect(d.reported!.is_desired).toBe(false);
  });

  it('a device that registers after its notification counts as delivered: the confirmation after the answer is acknowledged', async () => {
    // Issue 41's first defect: the settings in a registration's answer were "sent, unconfirmed" for ever.
    for (const [device, confirmable] of [
      [LATE_CON, true],
      [LATE_NON, false],
    ] as const) {
      const { version } = await notify(device, { reporting_interval_s: 700 + (confirmable ? 1 : 2) });
      await sleep(300);
      expect((await view(device)).delivery.state).toBe('unobserved');
      const client = await RawCoapClient.connect(gw.coapPort);
      raws.push(client);
      client.send({
        confirmable,
        code: 'GET',
        token: Buffer.from(`late${confirmable ? 'c' : 'n'}`),
        options: [observe0, ...pathOptions(`/devices/${device}/settings`)],
      });
      // The answer, then the same settings once more in a confirmable notification, which the client ACKs.
      await client.waitFor((p) => p.code === '2.05' && p.confirmable);
      const d = await waitState(device, 'acknowledged');
      expect(d.acknowledged!.version).toBe(version);
    }
  });

  it('a device up to date over DTLS with a NON relation (libcoap -N) is acknowledged, not pending', async () => {
    // The newcomer's case: the answer to a NON registration was "sent, unconfirmed" for ever.
    const { version } = await notify(KEYED, { reporting_interval_s: 1200 });
    const url = `coaps://127.0.0.1:${coapsPort}/devices/${KEYED}/settings`;
    const observer = runTool(
      'coap-client-openssl',
      ['-N', '-m', 'get', '-s', '4', '-u', keyA.identity, '-k', keyA.keyText, url],
      '',
      undefined,
      10_000,
    );
    const d = await waitState(KEYED, 'acknowledged');
    expect(d.acknowledged!.version).toBe(version);
    await observer;
  });

  it('a registration naming the current ETag is evidence itself (2.03, no confirmation sent)', async () => {
    const device = LATE_CON;
    await notify(device, { reporting_interval_s: 800 });
    const first = await RawCoapClient.connect(gw.coapPort);
    raws.push(first);
    first.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('e1'),
      options: pathOptions(`/devices/${device}/settings`),
    });
    const etag = option((await first.waitFor((p) => p.code === '2.05')).packet, 'ETag')!;
    const client = await RawCoapClient.connect(gw.coapPort);
    raws.push(client);
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('e2'),
      options: [observe0, { name: 'ETag', value: etag }, ...pathOptions(`/devices/${device}/settings`)],
    });
    await client.waitFor((p) => p.code === '2.03');
    await waitState(device, 'acknowledged');
    await sleep(300);
    expect(client.inbox.filter((r) => r.packet.confirmable)).toHaveLength(0);
  });

  it('the fleet list refuses a state it does not know, and reads several', async () => {
    const bad = await request(gw.app.http).get('/api/devices?delivery=applied,bogus').set(auth);
    expect(bad.status).toBe(400);
    expect(bad.body.code).toBe('invalid_query');
    const neg = await request(gw.app.http).get('/api/devices?acknowledged_for_s=-1').set(auth);
    expect(neg.status).toBe(400);
    await request(gw.app.http)
      .get(`/api/devices?delivery=stale,unobserved&site_id=${randomUUID()}`)
      .set(auth)
      .expect(200);
  });
});

describe('device_reports_batch (0026): one call for a batch, the same rules', () => {
  const row = (deviceId: string, version: number, extra: Partial<ReportRow['report']> = {}): ReportRow => ({
    deviceId,
    report: { version, outcome: 'applied', reason: null, settings: null, ...extra },
    transport: 'plain',
    localVersion: null,
    localContent: null,
  });

  it("answers each report in order; of one device's several, the newest is written and the others are older", async () => {
    const write = reportBatchWriter(gw.reader, gw.app.replicaId, 3000);
    const { version } = await notify(LATE_NON, { reporting_interval_s: 900 });
    const local = gw.app.state.settingsDocument(LATE_NON)!;
    const mine = (v: number, extra: Partial<ReportRow['report']> = {}): ReportRow => ({
      ...row(LATE_NON, v, extra),
      localVersion: local.version,
      localContent: local.contentDigest,
    });
    const results = await write([
      mine(version - 1),
      row('no-such-device', 5),
      mine(version, { outcome: 'rejected', reason: 'not_now' }),
      mine(version + 3_600_000_000),
      mine(version - 2),
    ]);
    expect(results).toEqual(['older', 'unknown_device', 'recorded', 'not_issued', 'older']);
    const after = await readDelivery(gw.reader, LATE_NON);
    expect(after).toMatchObject({
      reported_version: String(version),
      reported_outcome: 'rejected',
      reported_reason: 'not_now',
      reported_content: local.contentDigest,
    });
  });

  it('refuses a batch with a report the replica should not have passed, writing none of it', async () => {
    const write = reportBatchWriter(gw.reader, gw.app.replicaId, 3000);
    const before = await readDelivery(gw.reader, LATE_NON);
    await expect(
      write([
        row(LATE_NON, Number(before!.reported_version) + 1),
        row(LATE_NON, 1, { outcome: 'rejected', reason: 'Bad' }),
      ]),
    ).rejects.toThrow(/invalid report/);
    expect((await readDelivery(gw.reader, LATE_NON))!.reported_at).toEqual(before!.reported_at);
  });
});

describe('without the delivery record (GATEWAY_DELIVERY_RECORD=false)', () => {
  it('answers a report 5.01 with a diagnostic: nothing could keep it', async () => {
    const off = await startGateway({ env: { GATEWAY_DELIVERY_RECORD: 'false' } });
    const client = await RawCoapClient.connect(off.coapPort);
    try {
      client.send({
        confirmable: true,
        code: 'POST',
        messageId: 77,
        token: Buffer.from([7, 7]),
        options: [
          ...pathOptions(`/devices/${ACKER}/reported`),
          { name: 'Content-Format', value: Buffer.from([50]) },
        ],
        payload: body({ version: 1, outcome: 'applied' }),
      });
      const reply = (await client.waitFor((p) => p.messageId === 77)).packet;
      expect(reply.code).toBe('5.01');
      expect(reply.payload.toString()).toMatch(/not recorded/);
    } finally {
      await client.close();
      await off.close();
    }
  });
});
