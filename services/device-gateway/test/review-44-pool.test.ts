// Review 44 (delivery visibility, cold): one session of the gateway's login holding one row lock in
// device_gateway.inspect_answers made every answer write of every replica wait its statement timeout on a pool
// connection; with device-view requests coming in (here sent by the login itself, whose pid every replica
// trusts; on-call's own views do the same), a replica's whole pool (DB_POOL_MAX 4) was held by answer writes,
// starving its API, its bus publishes and its delivery recorder (503s). Since migration 0016 an answer waits
// at most 200 ms for a lock and skips held rows, and a replica writes at most two answers at once.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { gatewayChannels } from './support/channels.js';
import { API_KEYS, loginUrl } from './support/gateway.js';
import { startReplica, type Replica } from './support/replicas.js';

jest.setTimeout(300_000);

/** The device view's channel: its name with the installation's secret (migration 0035), read in beforeAll. */
let CHANNEL = 'device_gateway_inspect';
const DEVICE = 'acme-hq-hvac-01';
const FAKE = 'fa4efa4efa4efa4e';
const auth = { Authorization: `Bearer ${API_KEYS[0]!}` };

let pg0: PostgresServer;
let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let a: Replica;
const logins: pg.Client[] = [];

async function login(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: loginUrl(database.url) });
  await c.connect();
  logins.push(c);
  return c;
}

beforeAll(async () => {
  pg0 = await startPostgres();
  database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg0.url });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  CHANNEL = (await gatewayChannels(owner)).inspect;
  await seedDevices(owner);
  a = await startReplica('A', database.url, { LOG_LEVEL: 'info' });
  await a.waitReady();
});

afterAll(async () => {
  for (const c of logins) await c.end().catch(() => undefined);
  await a?.stop();
  await owner?.destroy();
  await database?.drop();
  await pg0?.stop();
});

/** Device-view requests as the login, ~50 a second (the replicas' answer rate), until stopped. */
async function requests(c: pg.Client, stopped: () => boolean): Promise<void> {
  while (!stopped()) {
    await c.query(
      `SELECT pg_notify($1, json_build_object('k', 'q', 'q', gen_random_uuid()::text, 'd', $2::text,
         'o', $3::text)::text) FROM generate_series(1, 5)`,
      [CHANNEL, DEVICE, FAKE],
    );
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** What A's API does now: the fleet list, a notify-settings (bus publish), readiness; status and time each. */
async function probe(): Promise<string> {
  const out: string[] = [];
  const time = async (what: string, f: () => Promise<Response>) => {
    const t0 = Date.now();
    try {
      const res = await f();
      const text = await res.text();
      out.push(
        `${what} ${res.status} ${Date.now() - t0}ms${res.status >= 500 ? ` ${text.slice(0, 120)}` : ''}`,
      );
    } catch (err) {
      out.push(`${what} error ${(err as Error).message}`);
    }
  };
  await Promise.all([
    time('list', () => fetch(`${a.url}/api/devices?limit=1`, { headers: auth })),
    time('notify', () =>
      fetch(`${a.url}/api/notify-settings`, {
        method: 'POST',
        headers: { ...auth, 'Content-Type': 'application/json' },
        body: JSON.stringify({
          device_id: DEVICE,
          settings: { reporting_interval_s: 60 + Math.floor(Math.random() * 100) },
        }),
      }),
    ),
  ]);
  return out.join(', ');
}

describe("one row lock of the login's on inspect_answers", () => {
  it("does not starve a replica's pool through its answer writes (before 0016 and the cap on answers in flight: its API answered 503)", async () => {
    const holder = await login();
    const sender = await login();
    // An answer row that will be past inspect_answer's retention (15 s since 0016; a minute before).
    await holder.query(
      `SELECT device_gateway.inspect_answer(gen_random_uuid(), 'aaaaaaaaaaaaaaaa', '{}'::json)`,
    );
    const idle = await probe();
    let stop = false;
    let flood = requests(sender, () => stop);
    await new Promise((r) => setTimeout(r, 2000));
    const floodOnly = await probe();
    stop = true;
    await flood;
    // Past any retention (a minute before 0016, 15 s since), without waiting for it.
    await sql`UPDATE device_gateway.inspect_answers SET created_at = now() - interval '2 minutes'`.execute(
      owner,
    );
    // The login deletes the old row in a transaction it leaves open: the row stays locked.
    await holder.query('BEGIN');
    await holder.query(
      `SELECT device_gateway.inspect_answer(gen_random_uuid(), 'bbbbbbbbbbbbbbbb', '{}'::json)`,
    );
    stop = false;
    flood = requests(sender, () => stop);
    const during: string[] = [];
    try {
      await new Promise((r) => setTimeout(r, 3000));
      for (let i = 0; i < 3; i++) during.push(await probe());
      const { rows } = await owner
        .selectNoFrom((eb) => eb.val(1).as('x'))
        .execute()
        .then(async () => {
          const c = new pg.Client({ connectionString: database.url });
          await c.connect();
          try {
            return await c.query<{ waiting: string }>(
              `SELECT count(*) AS waiting FROM pg_stat_activity WHERE usename = 'device_gateway_login'
                 AND wait_event_type = 'Lock' AND query LIKE '%inspect_answer%'`,
            );
          } finally {
            await c.end();
          }
        });
      console.log(
        `A idle: ${idle}\nA during 50 requests/s, no lock: ${floodOnly}\n` +
          `A's login sessions waiting on the lock: ${rows[0]!.waiting}\nA during 50 requests/s with the lock held:\n  ${during.join('\n  ')}`,
      );
    } finally {
      stop = true;
      await flood;
      await holder.query('ROLLBACK');
    }
    const warned = (a.logs().match(/answer not written/g) ?? []).length;
    console.log(`A's log: ${warned} 'answer not written' warnings`);
    // The replica's own API keeps working whatever the answer writes meet.
    expect(during.every((p) => p.includes('list 200') && p.includes('notify 200'))).toBe(true);
  });
});
