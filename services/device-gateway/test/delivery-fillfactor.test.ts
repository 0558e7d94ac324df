// Migration 0012: the delivery record's pages keep room for a row's next version (fillfactor 60), so an update
// that changes no indexed column is HOT (no new index entries) and a page's dead versions are pruned by the next
// update of the page. Checked through the function the recorder calls, with the table's own statistics.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import { deliveryFillfactorMigration } from '../src/db/delivery-fillfactor-migration.js';
import type { DeliveryRow } from '../src/delivery/recorder.js';
import { toBatch } from './support/delivery.js';

jest.setTimeout(120_000);

const SITE = 'c0c0c0c0-0000-4000-8000-000000000012';
const A = 'aaaaaaaaaaaaaaaa';
const N = 600;
const CALL = `SELECT device_gateway.delivery_record_arrays($1, $2::text[], $3::bigint[], $4::text[], $5::text[],
  $6::double precision[], $7::bigint[], $8::text[], $9::double precision[], $10::text[], $11::boolean[],
  $12::bigint[], $13::text[], $14::double precision[], $15::text[], $16::double precision[], $17::integer[]) AS n`;

let database: TestDatabase;
let owner: Kysely<unknown>;
let login: pg.Client;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
  login = new pg.Client({ connectionString: gatewayLoginUrl(database.url) });
  await login.connect();
});

afterAll(async () => {
  await login?.end();
  await owner?.destroy();
  await database?.drop();
});

const ids = (prefix: string): string[] =>
  Array.from({ length: N }, (_, i) => `${prefix}${String(i).padStart(4, '0')}`);
const write = async (rows: DeliveryRow[]): Promise<number> =>
  (await login.query<{ n: number }>(CALL, [A, ...toBatch(rows).columns])).rows[0]!.n;
const fillfactor = async (): Promise<string | undefined> =>
  (
    await sql<{ o: string[] | null }>`
      SELECT reloptions AS o FROM pg_catalog.pg_class WHERE oid = 'device_gateway.device_delivery'::regclass`.execute(
      owner,
    )
  ).rows[0]!.o?.find((o) => o.startsWith('fillfactor='));

/** Updates and HOT updates of the table so far (the login's own statistics flushed first). */
async function updates(): Promise<{ upd: number; hot: number }> {
  await login.query('SELECT pg_catalog.pg_stat_force_next_flush()');
  await sql`SELECT pg_catalog.pg_stat_clear_snapshot()`.execute(owner);
  const { rows } = await sql<{ upd: string; hot: string }>`
    SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_catalog.pg_stat_user_tables
    WHERE relid = 'device_gateway.device_delivery'::regclass`.execute(owner);
  return { upd: Number(rows[0]!.upd), hot: Number(rows[0]!.hot) };
}

/** Rows of `devices`: registered here (sent unconfirmed, heard, a relation), then one part at a time. */
async function fleet(prefix: string): Promise<string[]> {
  const devices = ids(prefix);
  await sql`
    INSERT INTO device_gateway.device_registry (device_id, site_id, name, model)
    SELECT d, ${SITE}::uuid, d, 'fillfactor' FROM unnest(${devices}::text[]) d`.execute(owner);
  const now = Date.now();
  const v = now * 1000;
  // Desired and acknowledged alike (state acknowledged), the rows written in one batch: packed pages.
  expect(
    await write(
      devices.map((d) => ({
        d,
        dv: v,
        ds: 'registry',
        dc: '00000000000000aa',
        da: now,
        sv: v,
        sc: '00000000000000aa',
        sa: now,
        st: 'plain',
        sk: true,
        av: v,
        ac: '00000000000000aa',
        aa: now,
        at: 'plain',
        h: now,
        r: 1,
      })),
    ),
  ).toBe(N);
  return devices;
}

describe('delivery record fillfactor (migration 0012)', () => {
  it('keeps room on each page: a row heard from, or acknowledged again, is updated HOT (not with full pages)', async () => {
    expect(await fillfactor()).toBe('fillfactor=60');
    /** Heard from (heard_at only), then acknowledged again with a newer version of the same content (state stays
     * acknowledged): no indexed column changes. The HOT updates among the 2 × N. */
    const hotUpdates = async (devices: string[]): Promise<number> => {
      const before = await updates();
      const heard = Date.now() + 5;
      expect(await write(devices.map((d) => ({ d, h: heard })))).toBe(N);
      const v = (Date.now() + 10) * 1000;
      expect(
        await write(devices.map((d) => ({ d, av: v, ac: '00000000000000aa', aa: Date.now(), at: 'dtls' }))),
      ).toBe(N);
      const after = await updates();
      expect(after.upd - before.upd).toBe(2 * N);
      return after.hot - before.hot;
    };
    // Full pages first (0012 undone: fillfactor 100), then the same on pages filled to 60 %.
    await owner.transaction().execute(async (trx) => {
      await deliveryFillfactorMigration.down!(trx);
    });
    const full = await hotUpdates(await fleet('full-'));
    await owner.transaction().execute(async (trx) => {
      await deliveryFillfactorMigration.up(trx);
    });
    const room = await hotUpdates(await fleet('ff-'));
    expect(full).toBeLessThanOrEqual(0.25 * 2 * N);
    expect(room).toBeGreaterThanOrEqual(0.75 * 2 * N);
  });

  it('a new desired content is not HOT at any fillfactor: desired_at and state are the fleet list keys', async () => {
    const devices = ids('ff-');
    const before = await updates();
    const now = Date.now() + 20;
    expect(
      await write(
        devices.map((d) => ({ d, dv: now * 1000, ds: 'override', dc: '00000000000000bb', da: now })),
      ),
    ).toBe(N);
    const after = await updates();
    expect(after.upd - before.upd).toBe(N);
    expect(after.hot - before.hot).toBe(0);
  });

  it("0012's down restores the default fillfactor; up sets it again", async () => {
    await owner.transaction().execute(async (trx) => {
      await deliveryFillfactorMigration.down!(trx);
    });
    expect(await fillfactor()).toBeUndefined();
    await owner.transaction().execute(async (trx) => {
      await deliveryFillfactorMigration.up(trx);
    });
    expect(await fillfactor()).toBe('fillfactor=60');
  });
});
