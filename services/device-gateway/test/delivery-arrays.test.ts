// Migration 0011's delivery_record_arrays: the same rules as 0010's delivery_record (bounds, content checks,
// registry join, device order, no-op updates skipped) with the batch as parallel arrays, and relations folded
// into the upsert. Checked against the JSON function itself where they must agree (the same rows through each
// leave the same record), and on their own for what is new: the arrays' lengths, the relation fold, the grant,
// 0011's down and up.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import { deliveryArraysMigration } from '../src/db/delivery-arrays-migration.js';
import type { DeliveryRow } from '../src/delivery/recorder.js';
import { toBatch } from './support/delivery.js';

jest.setTimeout(120_000);

const SITE = 'c0c0c0c0-0000-4000-8000-000000000011';
const A = 'aaaaaaaaaaaaaaaa';
const B = 'bbbbbbbbbbbbbbbb';
const CALL = `SELECT device_gateway.delivery_record_arrays($1, $2::text[], $3::bigint[], $4::text[], $5::text[],
  $6::double precision[], $7::bigint[], $8::text[], $9::double precision[], $10::text[], $11::boolean[],
  $12::bigint[], $13::text[], $14::double precision[], $15::text[], $16::double precision[], $17::integer[]) AS n`;
const SIGNATURE = `device_gateway.delivery_record_arrays(text, text[], bigint[], text[], text[], double precision[],
  bigint[], text[], double precision[], text[], boolean[], bigint[], text[], double precision[], text[],
  double precision[], integer[])`;

let database: TestDatabase;
let owner: Kysely<unknown>;
let login: pg.Client;
/** The owner's session: since 0029 the login may no longer call 0010's JSON function, compared here. */
let ownerClient: pg.Client;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT p || i, ${SITE}::uuid, p || i, 'arrays'
    FROM unnest(ARRAY['arr-', 'json-', 'eq-a-', 'eq-b-', 'lock-']) p, generate_series(0, 39) i`.execute(
    owner,
  );
  login = new pg.Client({ connectionString: gatewayLoginUrl(database.url) });
  await login.connect();
  ownerClient = new pg.Client({ connectionString: database.url });
  await ownerClient.connect();
});

afterAll(async () => {
  await login?.end();
  await ownerClient?.end();
  await owner?.destroy();
  await database?.drop();
});

/** The rows through 0011's function, as the recorder sends them (one array literal a column). */
const arrays = async (replica: string, rows: DeliveryRow[], client: pg.Client = login): Promise<number> =>
  (await client.query<{ n: number }>(CALL, [replica, ...toBatch(rows).columns])).rows[0]!.n;
/** The same rows through 0010's function (JSON). */
const json = async (replica: string, rows: DeliveryRow[]): Promise<number> =>
  (
    await ownerClient.query<{ n: number }>('SELECT device_gateway.delivery_record($1, $2::json) AS n', [
      replica,
      JSON.stringify(rows),
    ])
  ).rows[0]!.n;

interface Stored {
  device_id: string;
  xmin: string;
  desired_version: string | null;
  desired_source: string | null;
  desired_content: string | null;
  desired_at: Date;
  sent_version: string | null;
  sent_content: string | null;
  sent_at: Date | null;
  sent_by: string | null;
  sent_transport: string | null;
  sent_confirmable: boolean | null;
  acked_version: string | null;
  acked_content: string | null;
  acked_at: Date | null;
  acked_by: string | null;
  acked_transport: string | null;
  heard_at: Date | null;
  observed_by: string[];
  state: string;
}
const stored = async (d: string): Promise<Stored | undefined> =>
  (
    await sql<Stored>`SELECT xmin::text, * FROM device_gateway.device_delivery WHERE device_id = ${d}`.execute(
      owner,
    )
  ).rows[0];

/** Every part of a row, at µs version `v` and wall-clock ms `now`, content `c`. */
const full = (d: string, v: number, now: number, c = '00000000000000aa'): DeliveryRow => ({
  d,
  dv: v,
  ds: 'registry',
  dc: c,
  da: now,
  sv: v,
  sc: c,
  sa: now,
  st: 'plain',
  sk: true,
  av: v,
  ac: c,
  aa: now,
  at: 'dtls',
  h: now,
});

describe('delivery_record_arrays (migration 0011)', () => {
  it('leaves the same record as the JSON function for the same rows, rule for rule', async () => {
    // One device per case through each function (eq-a-i: JSON, eq-b-i: arrays), the same sequence of batches
    // from two replicas: every part, each part alone, older versions, repeats, relations on and off, values out
    // of bounds, bad contents. Then every column but the id and the row version must agree.
    const now = Date.now();
    const v = now * 1000;
    // `more`: rows 0011 counts beyond 0010 (a row whose only change is this replica's relation: 0010 wrote it
    // in its second statement, which its count leaves out).
    const steps: { replica: string; rows: (d: (i: number) => string) => DeliveryRow[]; more?: number }[] = [
      {
        replica: A,
        rows: (d) =>
          [0, 1, 2, 3].map((i) => ({
            d: d(i),
            sv: v,
            sc: '00000000000000aa',
            sa: now,
            st: 'plain',
            sk: false,
            h: now,
            r: 1,
          })),
      },
      { replica: A, rows: (d) => [0, 1, 2, 3, 4].map((i) => full(d(i), v + 1, now + 1)) },
      { replica: B, rows: (d) => [0, 2].map((i) => ({ d: d(i), r: 2, h: now + 2 })) },
      {
        replica: A,
        rows: (d) => [{ d: d(1), dv: v + 5, ds: 'override', dc: '00000000000000bb', da: now + 5 }],
      },
      {
        replica: B,
        rows: (d) => [{ d: d(1), dv: v + 6, ds: 'rollout', dc: '00000000000000bb', da: now + 6 }],
      },
      { replica: A, rows: (d) => [{ d: d(1), av: v + 4, ac: '00000000000000cc', aa: now + 4, at: 'plain' }] },
      { replica: B, rows: (d) => [{ d: d(2), av: v + 1, ac: '00000000000000aa', aa: now + 1, at: 'dtls' }] },
      { replica: A, rows: (d) => [0, 2].map((i) => ({ d: d(i), r: 0 })) },
      { replica: A, rows: (d) => [0, 1, 2, 3, 4].map((i) => full(d(i), v + 1, now + 1)) },
      {
        replica: A,
        rows: (d) => [
          { d: d(3), r: 0, h: now + 9 },
          { d: d(4), r: 3 },
        ],
        more: 1,
      },
      {
        replica: B,
        rows: (d) => [
          full(d(5), (now + 2 * 86_400_000) * 1000, now),
          full(d(6), v, now + 2 * 86_400_000),
          full(d(7), v, 1_500_000_000_000),
          full(d(8), v, now, '00000000000000AA'),
          full(d(9), v, now, '00000000000000a'),
          { d: d(10), h: now, sv: -1, sc: '00000000000000aa', sa: now, st: 'plain', sk: true },
          { d: d(11), h: now, r: 1 },
        ],
      },
    ];
    const ids = (p: string) => (i: number) => `${p}${i}`;
    // Both calls of a step in one transaction: a row without a desired part gets desired_at = now(), which is
    // the transaction's start, so the two agree even when the clock's millisecond turns between the calls.
    // In the owner's session: the login may no longer call the JSON function (0029).
    for (const step of steps) {
      await ownerClient.query('BEGIN');
      const viaJson = await json(step.replica, step.rows(ids('eq-a-')));
      const viaArrays = await arrays(step.replica, step.rows(ids('eq-b-')), ownerClient);
      await ownerClient.query('COMMIT');
      expect(viaArrays).toBe(viaJson + (step.more ?? 0));
    }
    for (let i = 0; i < 12; i++) {
      const a = await stored(`eq-a-${i}`);
      const b = await stored(`eq-b-${i}`);
      // updated_at is the time of the call that changed the row, which differs between the two sequences.
      const strip = (r: Stored | undefined) =>
        r === undefined ? r : { ...r, device_id: '', xmin: '', updated_at: undefined };
      expect({ i, row: strip(b) }).toEqual({ i, row: strip(a) });
    }
    // The cases above did reach every outcome: skipped (5..10), observed by both, then by one, then none.
    expect(await stored('eq-b-5')).toBeUndefined();
    expect((await stored('eq-b-0'))?.observed_by).toEqual([B]);
    expect((await stored('eq-b-3'))?.observed_by).toEqual([]);
    expect((await stored('eq-b-4'))?.observed_by).toEqual([A]);
    expect((await stored('eq-b-11'))?.observed_by).toEqual([B]);
  });

  it('accepts exactly 16 lowercase hex digits as a content', async () => {
    const now = Date.now();
    const cases: [string, boolean][] = [
      ['0123456789abcdef', true],
      ['0123456789ABCDEF', false],
      ['0123456789abcde', false],
      ['0123456789abcdef0', false],
      ['0123456789abcdeg', false],
      ['0123456789abcde\n', false],
      ['0123456789abcdé', false],
      ['', false],
    ];
    for (const [i, [content, ok]] of cases.entries()) {
      const d = `arr-${i}`;
      expect(await arrays(A, [{ d, dv: now * 1000, ds: 'registry', dc: content, da: now }])).toBe(ok ? 1 : 0);
      expect((await stored(d))?.desired_content ?? null).toBe(ok ? content : null);
    }
  });

  it('bounds versions and times by the clock of the call, skips unknown devices, and goes on with the batch', async () => {
    const now = Date.now();
    const d = 'arr-10';
    expect(
      await arrays(A, [
        { d, dv: (now + 2 * 86_400_000) * 1000, ds: 'registry', dc: '00000000000000aa', da: now },
      ]),
    ).toBe(0);
    expect(await arrays(A, [{ d, h: now + 2 * 86_400_000 }])).toBe(0);
    expect(await arrays(A, [{ d, h: 1_500_000_000_000 }])).toBe(0);
    expect(await arrays(A, [{ d, av: -1, ac: '00000000000000aa', aa: now, at: 'plain' }])).toBe(0);
    // An unknown device and a NULL id (what the recorder sends for an id outside the registry's pattern) are
    // skipped; the known device in the same batch is written.
    const columns = toBatch([
      { d: 'no-such-device', h: now },
      { d: 'arr-11', h: now },
      { d: 'placeholder', h: now },
    ]).columns;
    columns[0] = '{"no-such-device","arr-11",NULL}';
    expect((await login.query<{ n: number }>(CALL, [A, ...columns])).rows[0]!.n).toBe(1);
    expect(await stored('no-such-device')).toBeUndefined();
    expect((await stored('arr-11'))?.heard_at?.getTime()).toBe(now);
  });

  it('refuses a batch whose arrays differ in length, or a replica that is not 16 hex digits', async () => {
    const now = Date.now();
    const columns = toBatch([
      { d: 'arr-12', h: now },
      { d: 'arr-13', h: now },
    ]).columns;
    const short = [...columns];
    short[14] = `{${now}}`; // h: one element for two devices
    await expect(login.query(CALL, [A, ...short])).rejects.toMatchObject({ code: '22023' });
    const long = [...columns];
    long[15] = '{1,1,1}';
    await expect(login.query(CALL, [A, ...long])).rejects.toMatchObject({ code: '22023' });
    await expect(login.query(CALL, ['not-a-replica', ...columns])).rejects.toMatchObject({ code: '22023' });
    const none = [...columns];
    none[0] = null;
    await expect(login.query(CALL, [A, ...none])).rejects.toMatchObject({ code: '22023' });
    expect(await stored('arr-12')).toBeUndefined();
    // An empty batch is a batch.
    expect(await arrays(A, [])).toBe(0);
  });

  it('a batch written again writes no new row version; a newer part still moves the row', async () => {
    const now = Date.now();
    const d = 'arr-14';
    const row = { ...full(d, now * 1000, now), r: 1 };
    expect(await arrays(A, [row])).toBe(1);
    const first = await stored(d);
    expect(await arrays(A, [row])).toBe(0);
    expect(
      await arrays(A, [{ d, av: now * 1000 - 5, ac: '00000000000000cc', aa: now - 5, at: 'plain' }]),
    ).toBe(0);
    expect(await stored(d)).toEqual(first);
    expect(await arrays(A, [{ d, h: now + 1 }])).toBe(1);
    expect((await stored(d))?.xmin).not.toBe(first?.xmin);
  });

  it('adds and removes this replica in observed_by, once, and leaves it alone when a row has no count', async () => {
    // A's bus session is up, as a replica's is: since 0015 a write that adds B keeps only live replicas.
    const busA = new pg.Client({
      connectionString: gatewayLoginUrl(database.url),
      application_name: `device-gateway-bus ${A}`,
    });
    await busA.connect();
    try {
      await relationRules();
    } finally {
      await busA.end();
    }
  });

  async function relationRules(): Promise<void> {
    const now = Date.now();
    const d = 'arr-15';
    expect(await arrays(A, [{ d, h: now, r: 1 }])).toBe(1); // a new row, observed
    expect((await stored(d))?.observed_by).toEqual([A]);
    expect(await arrays(B, [{ d, r: 3 }])).toBe(1); // an existing row: the upsert adds B
    expect(await arrays(B, [{ d, r: 1 }])).toBe(0); // already there: nothing written
    expect((await stored(d))?.observed_by).toEqual([A, B]);
    expect(await arrays(A, [{ d, h: now + 1 }])).toBe(1); // no count: unchanged
    expect((await stored(d))?.observed_by).toEqual([A, B]);
    await arrays(A, [{ d, r: 0 }]); // A's last relation ended
    expect((await stored(d))?.observed_by).toEqual([B]);
    await arrays(A, [{ d, r: 0 }]);
    expect((await stored(d))?.observed_by).toEqual([B]);
    expect((await stored(d))?.state).toBe('stale');
    await arrays(B, [
      { d, r: 0 },
      { d: 'arr-16', r: 1, h: now },
    ]);
    expect((await stored(d))?.observed_by).toEqual([]);
    expect((await stored(d))?.state).toBe('unobserved');
    expect((await stored('arr-16'))?.observed_by).toEqual([B]);
  }

  it('locks its rows in device order: a skipped update still holds the row, and batches in opposite orders wait instead of deadlocking', async () => {
    const now = Date.now();
    const rows = Array.from({ length: 40 }, (_, i) => ({
      d: `lock-${i}`,
      dv: now * 1000,
      ds: 'registry',
      dc: '00000000000000dd',
      da: now,
    }));
    expect(await arrays(A, rows)).toBe(40);
    const other = new pg.Client({ connectionString: gatewayLoginUrl(database.url) });
    await other.connect();
    try {
      await login.query('BEGIN');
      expect(await arrays(A, [rows[7]!])).toBe(0); // nothing to change, but the row is locked
      await other.query(`SET lock_timeout = '200ms'`);
      const blocked = await arrays(B, [{ d: 'lock-7', h: now + 7 }], other).then(
        () => 'written',
        (e: Error & { code?: string }) => e.code,
      );
      expect(blocked).toBe('55P03'); // lock_not_available
      await login.query('ROLLBACK');
      await other.query(`SET lock_timeout = 0`);
      // Concurrent batches over the same devices in opposite orders (two chunks of two replicas): never 40P01.
      const errors: string[] = [];
      for (let round = 1; round <= 6; round++) {
        const v = Date.now() * 1000 + round;
        const forward = rows.map((r) => ({ ...r, dv: v }));
        const backward = [...forward].reverse().map((r) => ({ ...r, dv: v + 1 }));
        const results = await Promise.allSettled([arrays(A, forward), arrays(B, backward, other)]);
        for (const r of results)
          if (r.status === 'rejected') errors.push(String((r.reason as { code?: string }).code));
      }
      expect(errors).toEqual([]);
    } finally {
      await login.query('ROLLBACK').catch(() => undefined);
      await other.end();
    }
  });

  it('the login may execute it (and PUBLIC may not), and still cannot write the table directly', async () => {
    const { rows } = await sql<{ login: boolean; pub: boolean; definer: boolean; config: string[] }>`
      SELECT has_function_privilege('device_gateway_login', ${SIGNATURE}::regprocedure, 'EXECUTE') AS login,
             EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS pub,
             p.prosecdef AS definer, p.proconfig AS config
      FROM pg_catalog.pg_proc p WHERE p.oid = ${SIGNATURE}::regprocedure`.execute(owner);
    expect(rows[0]).toEqual({
      login: true,
      pub: false,
      definer: true,
      config: ['search_path=pg_catalog, pg_temp'],
    });
    for (const statement of [
      `INSERT INTO device_gateway.device_delivery (device_id, desired_at) VALUES ('arr-20', now())`,
      `UPDATE device_gateway.device_delivery SET observed_by = '{}'`,
      `DELETE FROM device_gateway.device_delivery`,
    ])
      await expect(login.query(statement)).rejects.toMatchObject({ code: '42501' });
  });

  it("0011's down drops it and leaves 0010's function as it was; up creates it again with its grant", async () => {
    const body = async (): Promise<string> =>
      (
        await sql<{ src: string }>`
          SELECT prosrc AS src FROM pg_catalog.pg_proc
          WHERE oid = 'device_gateway.delivery_record(text, json)'::regprocedure`.execute(owner)
      ).rows[0]!.src;
    const exists = async (): Promise<boolean> =>
      (await sql<{ f: string | null }>`SELECT to_regprocedure(${SIGNATURE})::text AS f`.execute(owner))
        .rows[0]!.f !== null;
    const before = await body();
    await owner.transaction().execute(async (trx) => {
      await deliveryArraysMigration.down!(trx);
    });
    expect(await exists()).toBe(false);
    expect(await body()).toBe(before);
    const now = Date.now();
    expect(await json(A, [{ d: 'json-1', h: now }])).toBe(1);
    await owner.transaction().execute(async (trx) => {
      await deliveryArraysMigration.up(trx);
    });
    expect(await exists()).toBe(true);
    expect(await arrays(A, [{ d: 'json-2', h: now }])).toBe(1);
  });
});
