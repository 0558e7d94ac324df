import { validateProblemDocument } from '@platform/contracts';
import { sql } from 'kysely';
import request from 'supertest';
import { RawCoapClient, json, observe0, pathOptions } from './support/coap-client.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';

const auth = { Authorization: `Bearer ${API_KEYS[0]}` };

function expectProblem(res: request.Response, status: number, code: string): void {
  expect(res.status).toBe(status);
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  expect(validateProblemDocument(res.body).ok).toBe(true);
  expect(res.body.code).toBe(code);
  expect(res.body.request_id).toBe(res.headers['x-request-id']);
  expect(JSON.stringify(res.body)).not.toMatch(/at .*\.(ts|js):\d+/);
}

describe('management HTTP API on a real PostgreSQL registry', () => {
  let gw: GatewayFixture;
  let client: RawCoapClient;

  beforeAll(async () => {
    gw = await startGateway();
    client = await RawCoapClient.connect(gw.coapPort);
  });

  afterAll(async () => {
    await client.close();
    await gw.close();
  });

  it('GET /api/health answers without auth and without touching the database', async () => {
    const res = await request(gw.app.http).get('/api/health');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ status: 'ok' });
    expect(res.headers['x-request-id']).toBeTruthy();
  });

  it('GET /api/ready is 200 once the registry is loaded and CoAP is bound', async () => {
    const res = await request(gw.app.http).get('/api/ready');
    expect(res.status).toBe(200);
  });

  it.each([
    '/api/config',
    '/api/reload-registry',
    '/api/register-device',
    '/api/notify-settings',
    '/api/update-settings',
  ])('%s refuses a missing or wrong key with 401 and WWW-Authenticate', async (path) => {
    const method = path === '/api/config' ? 'get' : 'post';
    const missing = await request(gw.app.http)[method](path);
    expectProblem(missing, 401, 'unauthorized');
    expect(missing.headers['www-authenticate']).toMatch(/^Bearer /);
    const wrong = await request(gw.app.http)[method](path).set('Authorization', 'Bearer not-a-key');
    expectProblem(wrong, 401, 'unauthorized');
    expect(wrong.headers['www-authenticate']).toMatch(/error="invalid_token"/);
    const basic = await request(gw.app.http)[method](path).set('Authorization', `Basic ${API_KEYS[0]}`);
    expectProblem(basic, 401, 'unauthorized');
  });

  it.each(['/api/notify-settings', '/api/update-settings', '/api/reload-registry'])(
    'POST %s with a body and no valid key is 401 before the body is read (not 400, 413 or 415)',
    async (path) => {
      for (const [type, body] of [
        ['application/json', '{"device_id": '], // malformed
        ['application/json', JSON.stringify({ p: 'x'.repeat(70 * 1024) })], // over 64 KiB
        ['text/plain', 'hello'], // not JSON
      ]) {
        const res = await request(gw.app.http)
          .post(path)
          .set('Authorization', 'Bearer not-a-key')
          .set('Content-Type', type!)
          .send(body);
        expectProblem(res, 401, 'unauthorized');
      }
    },
  );

  it('POST to an unknown route is 404 without its body being read (no route, nothing to authenticate)', async () => {
    for (const [type, body] of [
      ['application/json', '{"device_id": '],
      ['application/json', JSON.stringify({ p: 'x'.repeat(70 * 1024) })],
      ['text/plain', 'hello'],
    ]) {
      const res = await request(gw.app.http).post('/api/no-such-route').set('Content-Type', type!).send(body);
      expectProblem(res, 404, 'not_found');
    }
  });

  it('the probes and the metrics scrape answer without a key even when a body is sent', async () => {
    for (const path of ['/api/health', '/api/ready', '/metrics']) {
      const res = await request(gw.app.http)
        .get(path)
        .set('Content-Type', 'application/json')
        .send('{"x":1}');
      expect(res.status).not.toBe(401);
    }
  });

  it('GET /api/config accepts every configured key and shows no secret', async () => {
    for (const key of API_KEYS) {
      const res = await request(gw.app.http).get('/api/config').set('Authorization', `Bearer ${key}`);
      expect(res.status).toBe(200);
      const text = JSON.stringify(res.body);
      for (const k of API_KEYS) expect(text).not.toContain(k);
      expect(text).not.toContain('device-gateway-dev');
      expect(res.body.api_keys.count).toBe(2);
      expect(res.body.api_keys.fingerprints).toHaveLength(2);
      expect(res.body.database_url).toContain('device_gateway_login');
    }
  });

  it('reload-registry and its alias register-device reload and notify observers of changed devices', async () => {
    const from = client.inbox.length;
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('hv'),
      options: [observe0, ...pathOptions('/devices/acme-hq-hvac-01/settings')],
    });
    const first = json((await client.waitFor((p) => p.token.toString() === 'hv', 2000, from)).packet);
    expect(first.source).toBe('registry');

    for (const [i, path] of ['/api/reload-registry', '/api/register-device'].entries()) {
      await sql`UPDATE device_gateway.device_registry SET desired_settings = ${JSON.stringify({ reporting_interval_s: 100 + i })}::jsonb WHERE device_id = 'acme-hq-hvac-01'`.execute(
        gw.owner,
      );
      const mark = client.inbox.length;
      const res = await request(gw.app.http).post(path).set(auth);
      expect(res.status).toBe(200);
      expect(res.body).toEqual({ status: 'reloaded' });
      const note = json((await client.waitFor((p) => p.token.toString() === 'hv', 2000, mark)).packet);
      expect(note.settings).toEqual({ reporting_interval_s: 100 + i });
      expect(note.version as number).toBeGreaterThan(first.version as number);
    }
    // A reload that changes nothing visible sends nothing.
    const mark = client.inbox.length;
    expect((await request(gw.app.http).post('/api/reload-registry').set(auth)).status).toBe(200);
    expect(
      (await client.collect(150)).filter(
        (r) => r.packet.token.toString() === 'hv' && r.packet.code === '2.05',
      ),
    ).toHaveLength(0);
    expect(client.inbox.length).toBe(mark);
  });

  it('notify-settings and its alias update-settings store an override the observer sees with a higher version', async () => {
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('ns'),
      options: [observe0, ...pathOptions('/devices/acme-wh-door-01/settings')],
    });
    let last = json((await client.waitFor((p) => p.token.toString() === 'ns')).packet);
    for (const [i, path] of ['/api/notify-settings', '/api/update-settings'].entries()) {
      const mark = client.inbox.length;
      const res = await request(gw.app.http)
        .post(path)
        .set(auth)
        .send({ device_id: 'acme-wh-door-01', settings: { maintenance_mode: i === 0 } });
      expect(res.status).toBe(200);
      // The version served now and the relations notified here: this client's.
      expect(res.body).toEqual({ status: 'updated', version: expect.any(Number), relations_notified: 1 });
      // The first notification after the call that carries the override (a confirmation of the registration's
      // answer, design §3.8, may come first).
      const note = json(
        (
          await client.waitFor(
            (p) => p.token.toString() === 'ns' && p.payload.toString().includes('"override"'),
            2000,
            mark,
          )
        ).packet,
      );
      expect(note).toMatchObject({
        device_id: 'acme-wh-door-01',
        source: 'override',
        settings: { maintenance_mode: i === 0 },
      });
      expect(note.version as number).toBeGreaterThan(last.version as number);
      last = note;
    }
  });

  it('the override survives a reload and replaces (not merges with) the registry settings', async () => {
    await request(gw.app.http)
      .post('/api/notify-settings')
      .set(auth)
      .send({ device_id: 'acme-hq-lobby-sensor-03', settings: { telemetry_enabled: false } });
    await request(gw.app.http).post('/api/reload-registry').set(auth);
    const doc = gw.app.state.settingsDocument('acme-hq-lobby-sensor-03')!.body;
    expect(doc.source).toBe('override');
    expect(doc.settings).toEqual({ telemetry_enabled: false });
  });

  it('notify-settings: unknown or disabled device → 404 unknown_device', async () => {
    for (const deviceId of ['no-such-device', 'acme-hq-meter-02']) {
      const res = await request(gw.app.http)
        .post('/api/notify-settings')
        .set(auth)
        .send({ device_id: deviceId, settings: { telemetry_enabled: true } });
      expectProblem(res, 404, 'unknown_device');
    }
  });

  it('notify-settings: schema violations → 400 invalid_body with JSON Pointer errors', async () => {
    const res = await request(gw.app.http)
      .post('/api/update-settings')
      .set(auth)
      .send({
        device_id: 'acme-hq-hvac-01',
        settings: { reporting_interval_s: 5, thresholds: { t: { min: 3, max: 1 } } },
      });
    expectProblem(res, 400, 'invalid_body');
    const paths = (res.body.errors as { path: string }[]).map((e) => e.path);
    expect(paths).toEqual(
      expect.arrayContaining(['/settings/reporting_interval_s', '/settings/thresholds/t/min']),
    );
    const empty = await request(gw.app.http)
      .post('/api/notify-settings')
      .set(auth)
      .send({ device_id: 'acme-hq-hvac-01', settings: {} });
    expectProblem(empty, 400, 'invalid_body');
    const extra = await request(gw.app.http)
      .post('/api/notify-settings')
      .set(auth)
      .send({ device_id: 'acme-hq-hvac-01', settings: { x: 1 }, more: 1 });
    expectProblem(extra, 400, 'invalid_body');
  });

  it('notify-settings: settings whose notification would not fit one datagram → 400, never truncated', async () => {
    const thresholds: Record<string, { min: number; max: number }> = {};
    for (let i = 0; i < 16; i++)
      thresholds[`threshold_name_${String(i).padStart(15, '0')}`] = { min: -1234567.125, max: 1234567.125 };
    const before = gw.app.state.settingsDocument('acme-hq-hvac-01')!.version;
    const res = await request(gw.app.http)
      .post('/api/notify-settings')
      .set(auth)
      .send({ device_id: 'acme-hq-hvac-01', settings: { thresholds } });
    expectProblem(res, 400, 'settings_too_large');
    expect(res.body.errors[0].path).toBe('/settings');
    expect(gw.app.state.settingsDocument('acme-hq-hvac-01')!.version).toBe(before);
  });

  it('bodies: not JSON → 415, malformed JSON → 400, over 64 KiB → 413, wrong method → 405 with Allow', async () => {
    expectProblem(
      await request(gw.app.http)
        .post('/api/notify-settings')
        .set(auth)
        .set('Content-Type', 'text/plain')
        .send('hello'),
      415,
      'unsupported_media_type',
    );
    expectProblem(
      await request(gw.app.http)
        .post('/api/notify-settings')
        .set(auth)
        .set('Content-Type', 'application/json')
        .send('{"device_id":'),
      400,
      'invalid_json',
    );
    const big = JSON.stringify({
      device_id: 'acme-hq-hvac-01',
      settings: { timezone: 'x'.repeat(70 * 1024) },
    });
    expectProblem(
      await request(gw.app.http)
        .post('/api/notify-settings')
        .set(auth)
        .set('Content-Type', 'application/json')
        .send(big),
      413,
      'payload_too_large',
    );
    const wrong = await request(gw.app.http).get('/api/notify-settings').set(auth);
    expectProblem(wrong, 405, 'method_not_allowed');
    expect(wrong.headers.allow).toContain('POST');
    expectProblem(await request(gw.app.http).get('/api/nothing-here'), 404, 'not_found');
  });

  it('a reload that disables a device sends its observers a final 4.04', async () => {
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from('fr'),
      options: [observe0, ...pathOptions('/devices/borealis-tower-lift-02/settings')],
    });
    await client.waitFor((p) => p.token.toString() === 'fr');
    await sql`UPDATE device_gateway.device_registry SET enabled = false WHERE device_id = 'borealis-tower-lift-02'`.execute(
      gw.owner,
    );
    const mark = client.inbox.length;
    expect((await request(gw.app.http).post('/api/reload-registry').set(auth)).status).toBe(200);
    expect((await client.waitFor((p) => p.token.toString() === 'fr', 2000, mark)).packet.code).toBe('4.04');
  });

  it('the gateway login can read the registry and nothing more', async () => {
    await expect(
      sql`UPDATE device_gateway.device_registry SET name = 'x' WHERE device_id = 'acme-hq-hvac-01'`.execute(
        gw.reader,
      ),
    ).rejects.toThrow(/permission denied/);
    await expect(sql`CREATE TABLE device_gateway.evil (id int)`.execute(gw.reader)).rejects.toThrow(
      /permission denied/,
    );
  });

  it('serves Prometheus metrics including CoAP counters', async () => {
    const res = await request(gw.app.http).get('/metrics');
    expect(res.status).toBe(200);
    expect(res.text).toContain('gateway_coap_observers');
    expect(res.text).toContain('gateway_registry_devices');
    expect(res.text).toContain('gateway_coap_notifications_total');
  });

  it('counts registry reloads with their duration', async () => {
    const count = async (): Promise<number> => {
      const text = (await request(gw.app.http).get('/metrics')).text;
      const line = /^gateway_registry_reload_duration_seconds_count\{[^}]*outcome="ok"[^}]*\} (\d+)$/m.exec(
        text,
      );
      return Number(line?.[1] ?? 0);
    };
    const before = await count();
    await request(gw.app.http).post('/api/reload-registry').set(auth);
    expect(await count()).toBe(before + 1);
  });
});

describe('readiness before the first load', () => {
  it('GET /api/ready is 503 problem+json until the registry is loaded', async () => {
    const gw = await startGateway({ load: false });
    try {
      expectProblem(await request(gw.app.http).get('/api/ready'), 503, 'not_ready');
      await gw.app.service.reload();
      expect((await request(gw.app.http).get('/api/ready')).status).toBe(200);
    } finally {
      await gw.close();
    }
  });

  it('GET /api/ready is 503 once the CoAP socket is no longer bound, whatever the registry', async () => {
    const gw = await startGateway();
    try {
      expect((await request(gw.app.http).get('/api/ready')).status).toBe(200);
      await gw.app.coap.close(0);
      const res = await request(gw.app.http).get('/api/ready');
      expectProblem(res, 503, 'not_ready');
      expect(res.body.detail).toContain('CoAP socket not bound');
      expect(res.headers['retry-after']).toBe('1');
      expect((await request(gw.app.http).get('/api/health')).status).toBe(200);
    } finally {
      await gw.close();
    }
  });
});
