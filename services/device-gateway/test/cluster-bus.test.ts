// Replicas (design §3.6): the bus message format, the NOTIFY size bound, the rights migration 0002 gives the login, and
// migration 0003's rule that retained overrides do not outlive the replicas.
import { createDb, sqlState } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import {
  decodeMessage,
  encodeMessage,
  NOTIFY_PAYLOAD_LIMIT_BYTES,
  supersedes,
} from '../src/cluster/messages.js';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { DocumentTooLargeError } from '../src/domain/gateway-state.js';
import { loginUrl } from './support/gateway.js';
import { device, newState } from './support/harness.js';

describe('bus messages', () => {
  it('round-trip, and anything malformed is dropped', () => {
    const m = {
      k: 'override',
      d: 'dev-1',
      v: 1_700_000_000_000_000,
      o: 'abc123',
      s: { maintenance_mode: true },
    };
    expect(decodeMessage(encodeMessage(m as never))).toEqual(m);
    expect(decodeMessage('{"k":"reload","v":5,"o":"x"}')).toEqual({ k: 'reload', v: 5, o: 'x' });
    for (const bad of [
      'not json',
      '[]',
      '{"k":"reload","v":0,"o":"x"}',
      '{"k":"reload","v":1.5,"o":"x"}',
      '{"k":"reload","v":1,"o":"white space"}',
      '{"k":"override","d":"bad id!","v":1,"o":"x","s":{}}',
      '{"k":"override","d":"dev","v":1,"o":"x","s":[]}',
      '{"k":"drop","v":1,"o":"x"}',
    ]) {
      expect(decodeMessage(bad)).toBeUndefined();
    }
  });

  it('orders overrides by version, then origin', () => {
    expect(supersedes({ v: 2, o: 'a' }, { v: 1, o: 'z' })).toBe(true);
    expect(supersedes({ v: 2, o: 'b' }, { v: 2, o: 'a' })).toBe(true);
    expect(supersedes({ v: 2, o: 'a' }, { v: 2, o: 'a' })).toBe(false);
    expect(supersedes({ v: 1, o: 'z' }, { v: 2, o: 'a' })).toBe(false);
  });

  it('the largest override a replica accepts stays far below the 8,000-byte NOTIFY limit', () => {
    // Grow a settings object until the CoAP datagram bound refuses it: 16 thresholds with the longest keys
    // and wide numbers, the longest time zone and device id. The last accepted one is the worst case.
    const id = 'd'.repeat(128);
    const state = newState();
    state.replaceRegistry([device(id)]);
    const settings: Record<string, unknown> = {
      reporting_interval_s: 86400,
      sampling_interval_s: 3600,
      telemetry_enabled: false,
      maintenance_mode: false,
      firmware_channel: 'stable',
      timezone: 'America/Argentina/ComodRivadavia',
    };
    const thresholds: Record<string, unknown> = {};
    let largest = 0;
    let refused: unknown;
    for (let i = 0; i < 16; i++) {
      thresholds[`t${String(i).padStart(2, '0')}${'x'.repeat(28)}`] = {
        min: -1.234567890123456e-300,
        max: 1.234567890123456e300,
      };
      const candidate = { ...settings, thresholds: { ...thresholds } };
      const refusal = (() => {
        try {
          state.prepareOverride(id, candidate);
          return undefined;
        } catch (err) {
          return err;
        }
      })();
      if (refusal !== undefined) {
        refused = refusal;
        break;
      }
      const payload = encodeMessage({
        k: 'override',
        d: id,
        v: Number.MAX_SAFE_INTEGER,
        o: 'o'.repeat(64),
        s: candidate,
      });
      largest = Math.max(largest, Buffer.byteLength(payload));
    }
    expect(refused).toBeInstanceOf(DocumentTooLargeError);
    expect(largest).toBeGreaterThan(900);
    expect(largest).toBeLessThan(1500);
    expect(largest).toBeLessThan(NOTIFY_PAYLOAD_LIMIT_BYTES);
  });
});

describe('migration 0002: what the gateway login may do', () => {
  let database: TestDatabase;
  let owner: Kysely<GatewayDatabase>;
  let login: Kysely<GatewayDatabase>;

  beforeAll(async () => {
    database = await createTestDatabase({ migrations: [gatewayMigrations] });
    owner = createDb<GatewayDatabase>(database.url, { max: 1 });
    await seedDevices(owner);
    login = createDb<GatewayDatabase>(loginUrl(database.url), { max: 1 });
  });
  afterAll(async () => {
    await login.destroy();
    await owner.destroy();
    await database.drop();
  });

  const publish = (payload: string) =>
    sql<{
      written: boolean[];
    }>`SELECT device_gateway.bus_publish_overrides(${[payload]}::text[]) AS written`.execute(login);
  const override = (v: number, o: string, s: object) =>
    JSON.stringify({ k: 'override', d: 'acme-hq-hvac-01', v, o, s });

  it('publishes through the functions only, last writer wins', async () => {
    expect((await publish(override(10, 'b', { maintenance_mode: true }))).rows[0]!.written).toEqual([true]);
    expect((await publish(override(9, 'z', { maintenance_mode: false }))).rows[0]!.written).toEqual([false]);
    expect((await publish(override(10, 'a', { maintenance_mode: false }))).rows[0]!.written).toEqual([false]);
    expect((await publish(override(10, 'c', { telemetry_enabled: true }))).rows[0]!.written).toEqual([true]);
    const rows = await login
      .selectFrom('device_gateway.bus_overrides' as never)
      .selectAll()
      .execute();
    expect(rows).toEqual([
      expect.objectContaining({
        device_id: 'acme-hq-hvac-01',
        origin: 'c',
        settings: { telemetry_enabled: true },
      }),
    ]);
  });

  it('retains and sends nothing for a device the registry does not have enabled (migration 0003)', async () => {
    const about = (d: string) =>
      JSON.stringify({ k: 'override', d, v: 40, o: 'a', s: { maintenance_mode: true } });
    const result = await sql<{
      written: (boolean | null)[];
    }>`SELECT device_gateway.bus_publish_overrides(${[about('acme-hq-meter-02'), about('no-such-device')]}::text[]) AS written`.execute(
      login,
    );
    expect(result.rows[0]!.written).toEqual([null, null]);
    const rows =
      await sql`SELECT 1 FROM device_gateway.bus_overrides WHERE device_id IN ('acme-hq-meter-02', 'no-such-device')`.execute(
        owner,
      );
    expect(rows.rows).toEqual([]);
  });

  it('cannot write the table or the registry directly', async () => {
    for (const statement of [
      sql`INSERT INTO device_gateway.bus_overrides (device_id, version, origin, settings) VALUES ('x', 1, 'o', '{}')`,
      sql`DELETE FROM device_gateway.bus_overrides`,
      sql`UPDATE device_gateway.device_registry SET enabled = false`,
    ]) {
      const err = await statement.execute(login).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(sqlState(err)).toBe('42501');
    }
  });

  it('a reload message drops retained overrides of devices that left the registry', async () => {
    await publish(
      JSON.stringify({ k: 'override', d: 'acme-wh-door-01', v: 20, o: 'a', s: { maintenance_mode: true } }),
    );
    await sql`UPDATE device_gateway.device_registry SET enabled = false WHERE device_id = 'acme-wh-door-01'`.execute(
      owner,
    );
    await sql`SELECT device_gateway.bus_publish_reload(${JSON.stringify({ k: 'reload', v: 21, o: 'a' })})`.execute(
      login,
    );
    const ids = await sql<{
      device_id: string;
    }>`SELECT device_id FROM device_gateway.bus_overrides ORDER BY 1`.execute(login);
    expect(ids.rows.map((r) => r.device_id)).toEqual(['acme-hq-hvac-01']);
    const wrongKind = await sql`SELECT device_gateway.bus_publish_reload('{"k":"override"}')`
      .execute(login)
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(sqlState(wrongKind)).toBe('22023');
  });

  it('bus_join clears the retained overrides only when no other synchronised replica is connected', async () => {
    await publish(override(30, 'a', { maintenance_mode: false }));
    const join = async () =>
      (
        await sql<{
          cleared: number;
          top_version: string | null;
        }>`SELECT cleared, top_version::text AS top_version FROM device_gateway.bus_join()`.execute(login)
      ).rows[0];
    const session = async (applicationName: string, url = loginUrl(database.url)): Promise<pg.Client> => {
      const client = new pg.Client({ connectionString: url, application_name: applicationName });
      await client.connect();
      return client;
    };
    const gone = async (client: pg.Client): Promise<void> => {
      const pid = (client as unknown as { processID: number }).processID;
      await client.end();
      // A backend leaves pg_stat_activity a moment after its client disconnects.
      for (let i = 0; i < 200; i++) {
        const left = await sql`SELECT 1 FROM pg_stat_activity WHERE pid = ${pid}`.execute(owner);
        if (left.rows.length === 0) return;
        await new Promise((r) => setTimeout(r, 10));
      }
      throw new Error('backend did not exit');
    };
    const count = async () =>
      Number(
        (await sql<{ n: string }>`SELECT count(*) AS n FROM device_gateway.bus_overrides`.execute(owner))
          .rows[0]!.n,
      );
    const retained = await count();
    expect(retained).toBeGreaterThan(0);

    // Another replica is up (synchronised, or of the previous release): the overrides are the live gateway's.
    const peer = await session('device-gateway-bus peer');
    expect(await join()).toEqual({ cleared: 0, top_version: null });
    expect(await count()).toBe(retained);
    await gone(peer);

    // A replica still starting does not count, nor does another login using the name: the table belongs
    // to a gateway that stopped altogether.
    const starting = await session('device-gateway-bus other joining');
    const impostor = await session('device-gateway-bus impostor', database.url);
    expect(await join()).toEqual({ cleared: retained, top_version: '30' });
    expect(await count()).toBe(0);
    await gone(starting);
    await gone(impostor);
    expect(await join()).toEqual({ cleared: 0, top_version: null });
  });
});
