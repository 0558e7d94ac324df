// Issue 39 §2 (third item): the gateway's login could release the driver's lease and take it under an id of its
// own invention, for up to ten minutes and as often as it liked, and step rollouts itself. Migration 0019 ties
// the lease to a replica that is up (a session of the login named `device-gateway-bus <id>`, or
// `device-gateway-driver <id>` for a replica without the bus) and bounds it to 60 s from its last renewal. Played
// here as the gateway's login in SQL, as the issue's probe did.
import { sqlState } from '@platform/service-kit';
import { sql } from 'kysely';
import pg from 'pg';
import request from 'supertest';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';

const INVENTED = '0123456789abcdef';
const R = '3939393939393939';
const S = '5151515151515151';
const key = `Bearer ${API_KEYS[0]}`;

let gw: GatewayFixture;
const sessions: pg.Client[] = [];

/** A session of the gateway's login, named `name` (a replica's bus session, or none). */
async function session(name = 'psql'): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: loginUrl(gw.database.url), application_name: name });
  await c.connect();
  sessions.push(c);
  return c;
}

/** Ends the session named `name` and waits until pg_stat_activity no longer lists it (its backend exited). */
async function end(c: pg.Client, name: string): Promise<void> {
  sessions.splice(sessions.indexOf(c), 1);
  await c.end();
  for (let i = 0; i < 50; i++) {
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = ${name}`.execute(gw.owner);
    if (rows[0]!.n === 0) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function lease(c: pg.Client, replica: string, ttlMs: number): Promise<boolean> {
  const { rows } = await c.query<{ ok: boolean }>('SELECT device_gateway.rollout_lease($1, $2) AS ok', [
    replica,
    ttlMs,
  ]);
  return rows[0]!.ok;
}

async function step(c: pg.Client, replica: string, lagMs = 0): Promise<Record<string, unknown>> {
  const { rows } = await c.query<{ r: Record<string, unknown> }>(
    'SELECT device_gateway.rollout_step($1, 1000, true, $2) AS r',
    [replica, lagMs],
  );
  return rows[0]!.r;
}

async function holder(): Promise<string | null> {
  const { rows } = await sql<{ holder: string | null }>`
    SELECT holder FROM device_gateway.rollout_driver WHERE expires_at > clock_timestamp()`.execute(gw.owner);
  return rows[0]?.holder ?? null;
}

beforeAll(async () => {
  gw = await startGateway();
});

afterEach(async () => {
  for (const c of sessions.splice(0)) await c.end();
  await sql`UPDATE device_gateway.rollout_driver SET holder = NULL, expires_at = NULL`.execute(gw.owner);
});

afterAll(async () => {
  await gw.close();
});

describe('issue 39: the lease belongs to a replica that is up', () => {
  it('the login cannot take the lease, or step, under an invented holder', async () => {
    const psql = await session();
    // Before: true, a lease of ten minutes that no replica could take over.
    expect(await lease(psql, INVENTED, 60_000)).toBe(false);
    expect(await holder()).toBeNull();
    // Before: {driver: true, ...}, as long as the invented lease stood.
    expect(await step(psql, INVENTED)).toEqual({ driver: false });
  });

  it('a lease longer than 60 s is refused', async () => {
    const bus = await session(`device-gateway-bus ${R}`);
    // Before: a lease of ten minutes.
    const err = await lease(bus, R, 600_000).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(sqlState(err)).toBe('22023');
    expect(await lease(bus, R, 60_000)).toBe(true);
  });

  it('a released lease cannot be taken by the login under an invented id; the replica takes it back', async () => {
    const bus = await session(`device-gateway-bus ${R}`);
    expect(await lease(bus, R, 3000)).toBe(true);
    const psql = await session();
    await psql.query('SELECT device_gateway.rollout_release($1)', [R]);
    // Before: true, and R's next renewal false for ten minutes (the issue's "no replica drives").
    expect(await lease(psql, INVENTED, 60_000)).toBe(false);
    expect(await lease(bus, R, 3000)).toBe(true);
    expect(await holder()).toBe(R);
  });

  it('a holder whose session ended loses the lease at once, not at its expiry', async () => {
    const r = await session(`device-gateway-bus ${R}`);
    const s = await session(`device-gateway-bus ${S}`);
    expect(await lease(r, R, 60_000)).toBe(true);
    expect(await lease(s, S, 3000)).toBe(false);
    await end(r, `device-gateway-bus ${R}`);
    // Before: false until the 60 s lease expired.
    expect(await lease(s, S, 3000)).toBe(true);
    expect(await holder()).toBe(S);
    // And a step in the ended replica's name is refused, as the lease is S's.
    expect(await step(s, R)).toEqual({ driver: false });
  });

  it('a replica without the bus drives through its own connection, named after it', async () => {
    expect(gw.app.bus).toBeUndefined();
    await gw.app.rollouts.driver.tick();
    expect(gw.app.rollouts.driver.isDriver).toBe(true);
    expect(await holder()).toBe(gw.app.replicaId);
    const { rows } = await sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE application_name = ${`device-gateway-driver ${gw.app.replicaId}`}`.execute(gw.owner);
    expect(rows[0]!.n).toBe(1);
    // Its lease, like every other, is refused to the login under an invented id meanwhile.
    const psql = await session();
    expect(await lease(psql, INVENTED, 3000)).toBe(false);
    const res = await request(gw.app.http).get('/api/config').set('Authorization', key);
    expect(res.body.rollouts.lease_ms).toBeLessThanOrEqual(60_000);
  });
});
