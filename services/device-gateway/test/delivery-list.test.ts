// The delivery record's rules and the fleet list (design §3.8) on a real PostgreSQL: what the batch function keeps
// when replicas report in any order, which devices each filter returns at a few hundred devices, that paging
// visits each once, and that every filter walks an index in order at 100,000 devices (plans checked).
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { sql } from 'kysely';
import request from 'supertest';
import type { DeliveryRow } from '../src/delivery/recorder.js';
import { deliveryWriter, listDeliveryQuery, readDelivery } from '../src/delivery/sql.js';
import pg from 'pg';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';
import { recordRows } from './support/delivery.js';

jest.setTimeout(120_000);

const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };
const SITES = [randomUUID(), randomUUID(), randomUUID()];
const KINDS = ['acknowledged', 'pending', 'unobserved', 'stale', 'sent_unconfirmed'] as const;
const DEVICES = 300;

let gw: GatewayFixture;
const id = (i: number): string => `fleet-${String(i).padStart(4, '0')}`;
const kindOf = (i: number): (typeof KINDS)[number] => KINDS[(i * 7) % 5]!;
const siteOf = (i: number): string => SITES[i % 3]!;

beforeAll(async () => {
  gw = await startGateway({ load: false });
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT 'fleet-' || lpad(i::text, 4, '0'), (${sql.val(SITES)}::uuid[])[i % 3 + 1], 'Unit ' || i, 'hvac'
    FROM generate_series(0, ${DEVICES - 1}) AS i`.execute(gw.owner);
  const writer = deliveryWriter(gw.reader);
  const base = Date.parse('2026-01-01T00:00:00Z');
  // Desired content 'd' for everyone (desired_at one second apart, in a shuffled order), then each kind's events.
  const rows: DeliveryRow[] = [];
  for (let i = 0; i < DEVICES; i++) {
    const row: DeliveryRow = {
      d: id(i),
      s: siteOf(i),
      dv: 100,
      ds: 'registry',
      dc: 'dddddddddddddddd',
      da: base + ((i * 37) % DEVICES) * 1000,
    };
    const kind = kindOf(i);
    if (kind !== 'unobserved') row.r = 1;
    if (kind === 'acknowledged')
      Object.assign(row, {
        sv: 100,
        sc: row.dc,
        sa: row.da,
        st: 'plain',
        sk: true,
        av: 100,
        ac: row.dc,
        aa: row.da,
        at: 'plain',
      });
    if (kind === 'pending') Object.assign(row, { sv: 100, sc: row.dc, sa: row.da, st: 'dtls', sk: true });
    // A NON notification (or a registration's answer) of the desired content: sent, unconfirmed (0023).
    if (kind === 'sent_unconfirmed')
      Object.assign(row, { sv: 100, sc: row.dc, sa: row.da, st: 'plain', sk: false });
    if (kind === 'stale')
      Object.assign(row, {
        sv: 90,
        sc: 'ffffffffffffffff',
        sa: row.da,
        st: 'plain',
        sk: true,
        av: 90,
        ac: 'ffffffffffffffff',
        aa: row.da,
        at: 'plain',
      });
    rows.push(row);
  }
  await recordRows(writer, gw.app.replicaId, rows);
});

afterAll(async () => {
  await gw?.close();
});

async function page(
  query: string,
): Promise<{ items: { device_id: string; state: string; site_id: string }[]; next_cursor: string | null }> {
  const res = await request(gw.app.http).get(`/api/devices${query}`).set(auth);
  expect(res.status).toBe(200);
  return res.body as {
    items: { device_id: string; state: string; site_id: string }[];
    next_cursor: string | null;
  };
}

/** Every page of a query, limit 7: the device ids in the order visited. */
async function all(params: Record<string, string>): Promise<string[]> {
  const seen: string[] = [];
  let cursor: string | null = null;
  do {
    const q = new URLSearchParams({ ...params, limit: '7', ...(cursor === null ? {} : { cursor }) });
    const p = await page(`?${q.toString()}`);
    seen.push(...p.items.map((i) => i.device_id));
    cursor = p.next_cursor;
  } while (cursor !== null);
  return seen;
}

describe('GET /api/devices', () => {
  it.each([
    [{}],
    [{ delivery: 'acknowledged' }],
    [{ delivery: 'pending' }],
    [{ delivery: 'unobserved' }],
    [{ delivery: 'stale' }],
    [{ site_id: SITES[1]! }],
    [{ site_id: SITES[2]!, delivery: 'pending' }],
    [{ delivery: 'sent_unconfirmed' }],
    [{ delivery: 'pending,stale' }],
    [{ delivery: 'stale,pending,stale' }],
    [{ site_id: SITES[0]!, delivery: 'unobserved,acknowledged' }],
    [{ delivery: 'not_applied' }],
  ])(
    '%j returns exactly its devices, oldest desired change first, each once',
    async (params: Record<string, string>) => {
      const expected: { id: string; at: number }[] = [];
      // Several states separated by commas; not_applied: every state but applied (none here is applied).
      const wanted = params.delivery?.split(',');
      for (let i = 0; i < DEVICES; i++) {
        if (wanted !== undefined && !wanted.includes('not_applied') && !wanted.includes(kindOf(i))) continue;
        if (params.site_id !== undefined && siteOf(i) !== params.site_id) continue;
        expected.push({ id: id(i), at: (i * 37) % DEVICES });
      }
      expected.sort((x, y) => x.at - y.at);
      const seen = await all(params);
      expect(seen).toEqual(expected.map((e) => e.id));
      expect(new Set(seen).size).toBe(seen.length);
    },
  );

  it('a disabled device leaves the list; a deleted one takes its record along', async () => {
    await sql`UPDATE device_gateway.device_registry SET enabled = false WHERE device_id = ${id(0)}`.execute(
      gw.owner,
    );
    expect(await all({})).not.toContain(id(0));
    await sql`DELETE FROM device_gateway.device_registry WHERE device_id = ${id(1)}`.execute(gw.owner);
    expect(await readDelivery(gw.reader, id(1))).toBeUndefined();
  });

  it('refuses what it did not issue', async () => {
    for (const q of [
      '?cursor=abc',
      '?cursor=' + Buffer.from('["1",2]').toString('base64url'),
      '?limit=501',
      '?limit=1.5',
      '?site_id=x',
      '?delivery=all',
      '?delivery=pending,',
      '?delivery=pending,all',
      '?acknowledged_for_s=1.5',
      '?limit=1&limit=2',
    ]) {
      const res = await request(gw.app.http).get(`/api/devices${q}`).set(auth);
      expect(res.status).toBe(400);
      expect(res.body.code).toBe('invalid_query');
      expect(res.headers['content-type']).toMatch(/application\/problem\+json/);
    }
  });
});

describe('delivery_record keeps the newest of each part, whatever order replicas report in', () => {
  const device = id(10); // acknowledged (kindOf)
  const other = 'feedfacefeedface';

  it("an older version never overwrites; the same content under another replica's version keeps desired_at", async () => {
    const writer = deliveryWriter(gw.reader);
    const before = (await readDelivery(gw.reader, device))!;
    await recordRows(writer, other, [
      { d: device, dv: 150, ds: 'registry', dc: before.desired_content!, da: Date.now() },
    ]);
    let row = (await readDelivery(gw.reader, device))!;
    expect(row.desired_version).toBe('150');
    expect(row.desired_at).toEqual(before.desired_at);
    await recordRows(writer, other, [
      {
        d: device,
        dv: 120,
        ds: 'override',
        dc: 'eeeeeeeeeeeeeeee',
        da: Date.now(),
        av: 50,
        ac: 'x',
        aa: Date.now(),
        at: 'dtls',
      },
    ]);
    row = (await readDelivery(gw.reader, device))!;
    expect(row).toMatchObject({
      desired_version: '150',
      desired_source: 'registry',
      acked_version: before.acked_version,
    });
    await recordRows(writer, other, [
      { d: device, dv: 200, ds: 'override', dc: 'eeeeeeeeeeeeeeee', da: Date.now() },
    ]);
    row = (await readDelivery(gw.reader, device))!;
    expect(row.desired_at.getTime()).toBeGreaterThan(before.desired_at.getTime());
    expect(row.state).not.toBe('acknowledged');
  });

  it('a replica that is not up is reaped from observed_by; one that leaves removes itself', async () => {
    const writer = deliveryWriter(gw.reader);
    // This fixture runs without the bus; a replica's bus session is up in a cluster, and since 0015 another
    // replica's registration keeps only live replicas in the list: the gateway's, named as bus_join names it.
    const bus = new pg.Client({
      connectionString: loginUrl(gw.database.url),
      application_name: `device-gateway-bus ${gw.app.replicaId}`,
    });
    await bus.connect();
    try {
      await recordRows(writer, other, [{ d: id(13), r: 2 }]);
      expect((await readDelivery(gw.reader, id(13)))!.observed_by).toEqual([gw.app.replicaId, other]);
      await writer.reap(gw.app.replicaId);
    } finally {
      await bus.end();
    }
    const after = (await readDelivery(gw.reader, id(13)))!;
    expect(after.observed_by).not.toContain(other);
    expect(after.observed_by).toContain(gw.app.replicaId);
    await writer.reap(null);
    expect((await readDelivery(gw.reader, id(13)))!.observed_by).toEqual([]);
  });

  it('the login cannot write the table directly, and the function refuses a malformed batch', async () => {
    await expect(
      sql`UPDATE device_gateway.device_delivery SET state = 'acknowledged'`.execute(gw.reader),
    ).rejects.toThrow();
    await expect(sql`DELETE FROM device_gateway.device_delivery`.execute(gw.reader)).rejects.toThrow(
      /permission denied/,
    );
    await expect(recordRows(deliveryWriter(gw.reader), 'not-an-origin', [])).rejects.toThrow(
      /invalid delivery batch/,
    );
  });
});

describe('at 100,000 devices every filter walks an index in order (no sort, no sequential scan)', () => {
  beforeAll(async () => {
    // A fleet as the filters meet it: most devices acknowledged; 1 % each pending (i % 100 = 1), stale (2) and
    // unobserved (3); the first site holds 2 % of the devices (i % 50 = 0 or 3), the other two the rest. So each
    // filter matches a few hundred to a thousand devices, which only its own index finds without reading most
    // of the table (with filters that match a quarter of it, the page index read in order and filtered stops as
    // early, and the planner may rightly take it).
    await sql`
      INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
      SELECT 'big-' || i, (${sql.val(SITES)}::uuid[])[CASE WHEN i % 50 IN (0, 3) THEN 1 ELSE i % 2 + 2 END],
        'Unit ' || i, 'meter'
      FROM generate_series(1, 100000) AS i`.execute(gw.owner);
    await sql`
      INSERT INTO device_gateway.device_delivery (device_id, site_id, desired_version, desired_source, desired_content,
        desired_at, sent_content, sent_confirmable, acked_content, observed_by)
      SELECT 'big-' || i, (${sql.val(SITES)}::uuid[])[CASE WHEN i % 50 IN (0, 3) THEN 1 ELSE i % 2 + 2 END], i,
        'registry', 'c' || (i % 5), now() - (i || ' seconds')::interval,
        CASE WHEN i % 100 NOT IN (2, 3) THEN 'c' || (i % 5) END, true,
        CASE WHEN i % 100 NOT IN (1, 2, 3) THEN 'c' || (i % 5) END,
        CASE WHEN i % 100 = 3 THEN '{}'::text[] ELSE ARRAY['aaaaaaaaaaaaaaaa'] END
      FROM generate_series(1, 100000) AS i`.execute(gw.owner);
    await sql`ANALYZE device_gateway.device_delivery`.execute(gw.owner);
    await sql`ANALYZE device_gateway.device_registry`.execute(gw.owner);
  });

  it.each([
    [{}, 'device_delivery_page_idx'],
    [{ states: ['pending' as const] }, 'device_delivery_state_idx'],
    [{ states: ['stale' as const] }, 'device_delivery_state_idx'],
    [{ siteId: SITES[0]! }, 'device_delivery_site_idx'],
    [{ siteId: SITES[0]!, states: ['unobserved' as const] }, 'device_delivery_site_state_idx'],
    [{ states: ['acknowledged' as const] }, 'device_delivery_page_idx'],
    [
      { states: ['pending' as const], after: { atMicros: '1700000000000000', deviceId: 'big-5' } },
      'device_delivery_state_idx',
    ],
    // Several states: each walks the state index in order, stopped at a page; the walks are merged in order.
    [{ states: ['pending' as const, 'stale' as const, 'unobserved' as const] }, 'device_delivery_state_idx'],
  ])('%j uses %s', async (filter, index) => {
    const compiled = listDeliveryQuery(gw.reader, { limit: 100, ...filter }).compile();
    const { rows } = await sql<{
      'QUERY PLAN': unknown;
    }>`EXPLAIN (FORMAT JSON) ${sql.raw(compiled.sql.replace(/\$(\d+)/g, (_, n: string) => literal(compiled.parameters[Number(n) - 1])))}`.execute(
      gw.reader,
    );
    const plan = JSON.stringify(rows[0]!['QUERY PLAN']);
    expect(plan).toContain(`"Index Name":"${index}"`);
    expect(plan).not.toContain('"Node Type":"Sort"');
    expect(plan).not.toMatch(
      /"Node Type":"Seq Scan","Parallel Aware":(true|false),"Async Capable":(true|false),"Relation Name":"device_delivery"/,
    );
  });
});

/** A parameter as an SQL literal, for EXPLAIN of a compiled query (test values only). */
function literal(value: unknown): string {
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  return `'${String(value).replaceAll("'", "''")}'`;
}
