// Review 26 (delivery visibility), in-process gateway on a real PostgreSQL: the HTTP reads' parsing, and what the
// gateway's login (or anyone holding it) can make the SECURITY DEFINER functions write. Each test asserts the
// behaviour the design promises or a reviewer expects; a failing test is a finding (see the review report).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { sql } from 'kysely';
import pg from 'pg';
import request from 'supertest';
import { encodeCursor } from '../src/delivery/device-view.js';
import { gatewayLoginUrl } from '../src/db/migrations.js';
import { deliveryWriter, readDelivery } from '../src/delivery/sql.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';
import { recordRows } from './support/delivery.js';

jest.setTimeout(120_000);

const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };
const DEVICE = 'acme-hq-hvac-01';
const OTHER = 'acme-hq-lobby-sensor-03';
let gw: GatewayFixture;

beforeAll(async () => {
  gw = await startGateway();
  // The registry load recorded every device's desired settings; let the first flush happen.
  await gw.app.delivery!.flush();
});

afterAll(async () => {
  await gw?.close();
});

describe('HTTP: query and cursor parsing', () => {
  it('a cursor whose time is out of range is 400 invalid_query, not 500', async () => {
    const outcomes: string[] = [];
    for (const at of ['9999999999999999999', '-9223372036854775808', '9223372036854775807']) {
      const cursor = encodeCursor({ atMicros: at, deviceId: DEVICE });
      const res = await request(gw.app.http).get(`/api/devices?cursor=${cursor}`).set(auth);
      outcomes.push(`${at} -> ${res.status} ${res.body.code as string}`);
    }
    console.log('cursor time outcomes:\n' + outcomes.join('\n'));
    expect(outcomes.every((o) => / -> 400 invalid_query$/.test(o))).toBe(true);
  });

  it('a cursor whose device id holds a NUL or invalid text is 400, not 500', async () => {
    const outcomes: string[] = [];
    for (const id of ['a\u0000b', '\ud800']) {
      const cursor = Buffer.from(JSON.stringify(['1700000000000000', id])).toString('base64url');
      const res = await request(gw.app.http).get(`/api/devices?cursor=${cursor}`).set(auth);
      outcomes.push(`${JSON.stringify(id)} -> ${res.status} ${res.body.code as string}`);
    }
    console.log('cursor id outcomes:\n' + outcomes.join('\n'));
    expect(outcomes.every((o) => / -> 400 invalid_query$/.test(o))).toBe(true);
  });

  it('odd device ids and parameters: never 5xx, no stack, nothing reflected raw', async () => {
    const paths = [
      '/api/devices/%E0%A4%A',
      '/api/devices/..%2F..%2Fconfig',
      '/api/devices/%3Cscript%3Ealert(1)%3C%2Fscript%3E',
      `/api/devices/${'a'.repeat(129)}`,
      '/api/devices/%00',
      '/api/devices?limit[]=1',
      '/api/devices?limit[__proto__][x]=1',
      '/api/devices?__proto__=1',
      '/api/devices?constructor[prototype][x]=1',
      `/api/devices?site_id=${'0'.repeat(5000)}`,
      '/api/devices?cursor=' + 'A'.repeat(401),
      '/api/devices?cursor=WyIxIiwiJyBPUiAxPTEgLS0iXQ',
    ];
    const rows: string[] = [];
    for (const p of paths) {
      const res = await request(gw.app.http).get(p).set(auth);
      rows.push(`${p.slice(0, 60)} -> ${res.status} ${JSON.stringify(res.body).slice(0, 160)}`);
      expect(res.status).toBeLessThan(500);
      expect(res.text).not.toMatch(/at .*\.js:\d+/);
    }
    console.log(rows.join('\n'));
    const script = await request(gw.app.http)
      .get('/api/devices/%3Cscript%3Ealert(1)%3C%2Fscript%3E')
      .set(auth);
    // The 404 message repeats whatever the caller put in the path (JSON-encoded, problem+json): informational.
    expect(script.body.detail ?? script.body.message).not.toContain('<script>');
  });

  it('unauthenticated and wrong-key reads are 401 (held)', async () => {
    for (const p of ['/api/devices', `/api/devices/${DEVICE}`, '/api/devices?cursor=%%%']) {
      expect((await request(gw.app.http).get(p)).status).toBe(401);
      expect((await request(gw.app.http).get(p).set({ Authorization: 'Bearer nope' })).status).toBe(401);
    }
  });
});

// delivery_record(text, json) is no longer granted to the login (0029): its checks are exercised as the owner.
describe("delivery_record / delivery_reap as the gateway's login", () => {
  it('one call with the largest bigint versions freezes a device record: later true events are ignored', async () => {
    const before = (await readDelivery(gw.reader, DEVICE))!;
    // A lie, once: "acknowledged the desired content" at version 2^63-1, by a replica that never existed.
    await sql`SELECT device_gateway.delivery_record('feedfacefeedface', ${JSON.stringify([
      {
        d: DEVICE,
        sv: '9223372036854775807',
        sc: before.desired_content,
        sa: Date.now(),
        st: 'dtls',
        sk: true,
        av: '9223372036854775807',
        ac: before.desired_content,
        aa: Date.now(),
        at: 'dtls',
      },
    ]).replaceAll('"9223372036854775807"', '9223372036854775807')}::json)`.execute(gw.owner);
    // The gateway then really sends a new setting (an override) and nothing acknowledges it.
    await gw.app.service.notifySettings(DEVICE, { reporting_interval_s: 777 });
    const doc = gw.app.state.settingsDocument(DEVICE)!;
    gw.app.delivery!.sent(DEVICE, doc, 'plain', true);
    await gw.app.delivery!.flush();
    const row = (await readDelivery(gw.reader, DEVICE))!;
    const view = await request(gw.app.http).get(`/api/devices/${DEVICE}`).set(auth);
    console.log('frozen record:', JSON.stringify(view.body.delivery));
    // The desired part moved (its version is the HLC), but sent/acked can never move again: any version the
    // gateway will ever write is below 2^63-1.
    expect(row.sent_version).not.toBe('9223372036854775807');
    expect(row.acked_by).not.toBe('feedfacefeedface');
  });

  it('content hashes and times are not checked: megabytes of text, and any desired_at', async () => {
    const big = 'x'.repeat(4 * 1024 * 1024);
    let accepted = true;
    try {
      await recordRows(deliveryWriter(gw.reader), 'feedfacefeedface', [
        // A version above the HLC's (µs since 1970, ~1.8e15 today), so the part moves.
        { d: OTHER, dv: 5_000_000_000_000_000, ds: 'registry', dc: big, da: 9_224_300_000_000_000 },
      ]);
    } catch (err) {
      accepted = false;
      console.log('refused:', (err as Error).message);
    }
    const { rows } = await sql<{ len: number; at: string }>`
      SELECT octet_length(desired_content) AS len, desired_at::text AS at FROM device_gateway.device_delivery
      WHERE device_id = ${OTHER}`.execute(gw.owner);
    console.log('stored:', JSON.stringify(rows));
    // Refused or skipped: either way nothing of it is stored.
    expect(accepted && rows.some((r) => r.len > 16 || r.at.startsWith('294'))).toBe(false);
  });

  it('a desired_at the function accepts can make the fleet list answer 500 (at_micros overflows bigint)', async () => {
    // Written by the function (as the login): a time PostgreSQL accepts whose µs since 1970 exceed int8.
    const { rows: r0 } = await sql<{ n: number }>`
      SELECT device_gateway.delivery_record('feedfacefeedface',
        '[{"d":"acme-wh-door-01","dv":5000000000000000,"ds":"registry","dc":"0123456789abcdef","da":9224300000000000}]'::json)
        AS n`.execute(gw.owner);
    console.log('rows written:', r0[0]!.n);
    const res = await request(gw.app.http).get('/api/devices?limit=500').set(auth);
    console.log('GET /api/devices ->', res.status, JSON.stringify(res.body).slice(0, 200));
    expect(res.status).toBe(200);
  });

  it('no session of the login can reap a live replica (a replica whose bus session is up stays)', async () => {
    // A live replica: a session of the login named as bus_join names them.
    const busSession = new pg.Client({
      connectionString: gatewayLoginUrl(gw.database.url),
      application_name: 'device-gateway-bus abcdefabcdefabcd',
    });
    await busSession.connect();
    try {
      await recordRows(deliveryWriter(gw.reader), 'abcdefabcdefabcd', [{ d: OTHER, r: 1 }]);
      expect((await readDelivery(gw.reader, OTHER))!.observed_by).toContain('abcdefabcdefabcd');
      // Anyone with the login, claiming to be that replica leaving:
      const n = await deliveryWriter(gw.reader).reap(null);
      const after = (await readDelivery(gw.reader, OTHER))!;
      console.log(
        'reaped rows:',
        n,
        'observed_by now',
        JSON.stringify(after.observed_by),
        'state',
        after.state,
      );
      expect(after.observed_by).toContain('abcdefabcdefabcd');
    } finally {
      await busSession.end();
    }
  });

  it('other roles cannot execute the functions, and a replica id or batch cannot inject SQL (held)', async () => {
    const url = new URL(gw.database.url);
    await sql
      .raw(
        `CREATE ROLE review26_intruder LOGIN PASSWORD 'intruder';
      GRANT CONNECT ON DATABASE "${gw.database.name}" TO review26_intruder`,
      )
      .execute(gw.owner);
    const intruderUrl = new URL(url.toString());
    intruderUrl.username = 'review26_intruder';
    intruderUrl.password = 'intruder';
    const intruder = new pg.Client({ connectionString: intruderUrl.toString() });
    await intruder.connect();
    try {
      await expect(
        intruder.query(`SELECT device_gateway.delivery_record('feedfacefeedface', '[]'::json)`),
      ).rejects.toThrow(/permission denied/);
      await expect(intruder.query(`SELECT device_gateway.delivery_reap('feedfacefeedface')`)).rejects.toThrow(
        /permission denied/,
      );
      await expect(intruder.query('SELECT * FROM device_gateway.device_delivery')).rejects.toThrow(
        /permission denied/,
      );
    } finally {
      await intruder.end();
      await sql.raw(`DROP OWNED BY review26_intruder; DROP ROLE review26_intruder`).execute(gw.owner);
    }
    await expect(
      recordRows(deliveryWriter(gw.reader), "feedfacefeedface'); DROP TABLE x; --", []),
    ).rejects.toThrow(/invalid delivery batch/);
    await recordRows(deliveryWriter(gw.reader), 'feedfacefeedface', [
      { d: "x'); DELETE FROM device_gateway.device_delivery; --", dv: 1, dc: "'; --", ds: 'registry' },
    ]);
    expect(await readDelivery(gw.reader, DEVICE)).toBeDefined();
    // A device not in the registry is never written.
    await recordRows(deliveryWriter(gw.reader), 'feedfacefeedface', [
      { d: 'not-in-registry', dv: 1, ds: 'registry' },
    ]);
    expect(await readDelivery(gw.reader, 'not-in-registry')).toBeUndefined();
  });
});
