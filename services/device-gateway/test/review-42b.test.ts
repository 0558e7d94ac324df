// Second cold review of issue 42 (principals, tokens, site scopes and the audit on /api), after review-42. Each
// `HOLE` test failed against the code as reviewed (343e2b8) and passes since the hole was closed; every other test is
// an attack that held. Closed: a rollout whose selector names another site or its devices is outside a scoped
// caller's reach like one whose targets are (rollout/sql.ts withinScope, its audit rows carry those sites); audit
// rows the database did not take are kept and written later, and changes are refused while too many wait
// (audit/queue.ts); company scopes follow the portal's sites between reloads (GATEWAY_SITES_REFRESH_MS); a null
// scope claim is malformed; an audit row keeps each site's company at the change, and a site handed to another
// company takes none of its history there (migration 0037); row ids and cursors are sealed (http/cursor-seal.ts)
// and count nothing. Real parts: a real PostgreSQL with the platform's migrations and the demo seeds (plus
// a few devices of this file's own), the test kit's issuer (real RS256 tokens and its JWKS), a named key file.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { demoCompanies, demoSites } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';
import { OPERATIONS_CLIENT, opsUsers, type Issuer, type TestDatabase } from '@platform/testkit';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import type { GatewayApp } from '../src/app.js';
import { commandPrincipal } from '../src/auth/principal.js';
import { issueAudited } from '../src/cli/device-key-command.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { startPeopleGateway, type PeopleGateway } from './support/people-gateway.js';

jest.setTimeout(120_000);

const ANON = 'review42b-anonymous-key-0123456789';
const ACME_OPS = 'review42b-acme-ops-key-0123456789';
const HQ = demoSites.acmeHq.id;
const TOWER = demoSites.borealisTower.id;
const ACME = demoCompanies.acme.id;
const BOREALIS = demoCompanies.borealis.id;
const MINE = 'acme-hq-hvac-01';
const LOBBY = 'acme-hq-lobby-sensor-03';
const OTHERS = 'borealis-tower-chiller-01';
const LIFT = 'borealis-tower-lift-02';
const ABSENT = 'no-such-device-01';
/** HQ devices of this file (HQ has only two enabled demo devices). */
const EXTRA = ['review42b-hq-01', 'review42b-hq-02', 'review42b-hq-03', 'review42b-hq-04'] as const;
/** A portal site of Acme's that the "site changes company" attack hands to Borealis, and its one device. */
const ANNEX = '5e000000-0000-4000-8000-0000000042b1';
const ANNEX_DEVICE = 'review42b-annex-01';
const OSCAR = `user:${opsUsers.oscar.sub}`;

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let issuer: Issuer;
let app: GatewayApp;
let olga: string;
let oscar: string;
/** An operator limited to the tower (a second contractor). */
let tom: string;

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` });
const plan = { first_wave_count: 1, growth_factor: 2, success_share: 0.5, abort_share: 0.5, deadline_s: 60 };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let gw: PeopleGateway;

beforeAll(async () => {
  gw = await startPeopleGateway({
    name: 'review42b',
    keyLines: [ANON, `name=acme-ops role=operator companies=${ACME} key=${ACME_OPS}`],
    env: { DB_STATEMENT_TIMEOUT_MS: '1500', DB_QUERY_TIMEOUT_MS: '3000' },
    seed: async (o) => {
      await sql`INSERT INTO enterprise.sites (id, company_id, name, timezone)
      VALUES (${ANNEX}::uuid, ${ACME}::uuid, 'Acme annex (review 42b)', 'America/Chicago')`.execute(o);
      await o
        .insertInto('device_gateway.device_registry')
        .values([
          ...EXTRA.map((id) => ({
            device_id: id,
            site_id: HQ,
            name: id,
            model: 'aq-sense-2',
            desired_settings: '{}',
          })),
          {
            device_id: ANNEX_DEVICE,
            site_id: ANNEX,
            name: 'annex',
            model: 'aq-sense-2',
            desired_settings: '{}',
          },
        ])
        .execute();
    },
  });
  ({ database, owner, issuer, app } = gw);
  // As run.ts starts it, at a test's pace (the default is 10 s).
  app.registry.refreshSitesEvery(200);
  olga = await issuer.opsToken('olga');
  oscar = await issuer.opsToken('oscar');
  tom = await issuer.opsToken('oscar', {
    sub: '0b0a11ce-0000-4000-8000-000000000042',
    preferred_username: 'tom',
    fleet_sites: [TOWER],
  });
});

afterAll(async () => {
  await gw.close();
});

interface AuditItem {
  id?: unknown;
  principal: string;
  action: string;
  request_id: string | null;
  device_id: string | null;
  rollout_id: string | null;
  site_ids: string[];
  detail: Record<string, unknown>;
}

const rowsOf = (requestId: string, n?: number): Promise<number> => gw.auditRowsOf(requestId, n);

const notify = (token: string, deviceId: string, requestId: string, interval?: number): Promise<number> =>
  gw.notify(token, deviceId, requestId, interval);

async function createRollout(token: string, selector: Record<string, unknown>): Promise<string> {
  const res = await request(app.http)
    .post('/api/rollouts')
    .set(bearer(token))
    .send({ selector, settings: { reporting_interval_s: 95 }, plan });
  expect([res.status, res.body]).toEqual([201, expect.anything()]);
  return (res.body as { rollout_id: string }).rollout_id;
}

async function cancel(rolloutId: string): Promise<void> {
  const res = await request(app.http).post(`/api/rollouts/${rolloutId}/cancel`).set(bearer(olga));
  expect(res.status).toBe(200);
}

/** An integer a position marker (an audit id, a keyset cursor) spells, if it spells one. */
function spelledInteger(marker: unknown): number | undefined {
  if (typeof marker !== 'string') return undefined;
  if (/^[0-9]+$/.test(marker)) return Number(marker);
  const decoded = Buffer.from(marker, 'base64url').toString('latin1');
  const m = /^(?:[a-z]:)?([0-9]+)$/.exec(decoded);
  return m === null ? undefined : Number(m[1]);
}

describe('rollouts seen by a scoped caller name nothing of other sites', () => {
  let wide: string;
  let byDevice: string;

  beforeAll(async () => {
    // An unscoped admin's rollouts whose every target is at HQ, but whose selectors name the tower and a tower
    // device: the tower has no device among the ids (first), the tower device is not at the named site (second).
    wide = await createRollout(olga, { site_ids: [HQ, TOWER], device_ids: [MINE] });
    byDevice = await createRollout(olga, { site_ids: [HQ], device_ids: [LOBBY, OTHERS] });
  });

  afterAll(async () => {
    await cancel(wide);
    await cancel(byDevice);
  });

  it('their targets are all at HQ, but their selectors name the tower: oscar (HQ only) may not see them', async () => {
    for (const id of [wide, byDevice]) {
      const res = await request(app.http).get(`/api/rollouts/${id}`).set(bearer(oscar));
      expect(res.status).toBe(404);
      expect((await request(app.http).get(`/api/rollouts/${id}`).set(bearer(olga))).status).toBe(200);
    }
  });

  it("HOLE: the rollout detail's selector names the tower's site id and a tower device to oscar", async () => {
    const a = await request(app.http).get(`/api/rollouts/${wide}`).set(bearer(oscar));
    const b = await request(app.http).get(`/api/rollouts/${byDevice}`).set(bearer(oscar));
    expect(JSON.stringify(a.body)).not.toContain(TOWER);
    expect(JSON.stringify(b.body)).not.toContain(OTHERS);
  });

  it("HOLE: the rollout.created audit row's detail names them to oscar as well", async () => {
    const res = await request(app.http).get('/api/audit?limit=100').set(bearer(oscar));
    expect(res.status).toBe(200);
    const created = (res.body as { items: AuditItem[] }).items.filter((r) => r.action === 'rollout.created');
    expect(created.length).toBeGreaterThanOrEqual(2);
    for (const row of created) {
      expect(JSON.stringify(row)).not.toContain(TOWER);
      expect(JSON.stringify(row)).not.toContain(OTHERS);
      expect(row.rollout_id).not.toBe(wide);
      expect(row.rollout_id).not.toBe(byDevice);
    }
  });

  it('the rollouts list carries no selector (held)', async () => {
    const res = await request(app.http).get('/api/rollouts?limit=100').set(bearer(oscar));
    expect(res.status).toBe(200);
    expect(JSON.stringify(res.body)).not.toContain(TOWER);
    expect(JSON.stringify(res.body)).not.toContain(OTHERS);
  });
});

describe('counts of other sites through position markers', () => {
  it("HOLE: oscar's own audit rows' ids (and the cursor) count the changes made at other sites between them", async () => {
    expect(await notify(oscar, MINE, 'r42b-count-0', 89)).toBe(200);
    expect(await rowsOf('r42b-count-0')).toBe(1);
    expect(await notify(oscar, MINE, 'r42b-count-1')).toBe(200);
    expect(await rowsOf('r42b-count-1')).toBe(1);
    // Three changes at the tower, which oscar may not know of.
    for (const i of [1, 2, 3]) {
      expect(await notify(olga, OTHERS, `r42b-count-tower-${i}`, 90 + i)).toBe(200);
      expect(await rowsOf(`r42b-count-tower-${i}`)).toBe(1);
    }
    expect(await notify(oscar, MINE, 'r42b-count-2', 91)).toBe(200);
    expect(await rowsOf('r42b-count-2')).toBe(1);
    const res = await request(app.http)
      .get(`/api/audit?principal=${encodeURIComponent(OSCAR)}&limit=1`)
      .set(bearer(oscar));
    expect(res.status).toBe(200);
    const page = res.body as { items: AuditItem[]; next_cursor: string | null };
    expect(page.items[0]!.request_id).toBe('r42b-count-2');
    const next = await request(app.http)
      .get(`/api/audit?principal=${encodeURIComponent(OSCAR)}&limit=1&cursor=${page.next_cursor}`)
      .set(bearer(oscar));
    const older = (next.body as { items: AuditItem[]; next_cursor: string | null }).items[0]!;
    expect(older.request_id).toBe('r42b-count-1');
    // Two consecutive rows of oscar's own: a gap of 4 says 3 changes happened elsewhere in between.
    const gap = (a: unknown, b: unknown): number => {
      const x = spelledInteger(a);
      const y = spelledInteger(b);
      return x !== undefined && y !== undefined ? x - y : 1;
    };
    // The cursors are the ids in base64url: the same count for whoever decodes them.
    expect(gap(page.next_cursor, (next.body as { next_cursor: string | null }).next_cursor)).toBe(1);
    expect(gap(page.items[0]!.id, older.id)).toBe(1);
  });

  it("HOLE: the rollouts list's cursor counts rollouts created at other sites", async () => {
    const r1 = await createRollout(oscar, { site_ids: [HQ], device_ids: [EXTRA[0]] });
    const r2 = await createRollout(oscar, { site_ids: [HQ], device_ids: [EXTRA[1]] });
    const t1 = await createRollout(olga, { site_ids: [TOWER], device_ids: [OTHERS] });
    const t2 = await createRollout(olga, { site_ids: [TOWER], device_ids: [LIFT] });
    const r3 = await createRollout(oscar, { site_ids: [HQ], device_ids: [EXTRA[2]] });
    try {
      const first = await request(app.http).get('/api/rollouts?limit=1').set(bearer(oscar));
      const p1 = first.body as { items: { rollout_id: string }[]; next_cursor: string };
      expect(p1.items[0]!.rollout_id).toBe(r3);
      const second = await request(app.http)
        .get(`/api/rollouts?limit=1&cursor=${p1.next_cursor}`)
        .set(bearer(oscar));
      const p2 = second.body as { items: { rollout_id: string }[]; next_cursor: string };
      expect(p2.items[0]!.rollout_id).toBe(r2);
      // Two consecutive rollouts of oscar's: a gap of 3 says two were created elsewhere in between.
      const a = spelledInteger(p1.next_cursor);
      const b = spelledInteger(p2.next_cursor);
      expect(a !== undefined && b !== undefined ? a - b : 1).toBe(1);
    } finally {
      for (const id of [r1, r2, t1, t2, r3]) await cancel(id);
    }
  });
});

describe('a change that escapes the audit', () => {
  it('HOLE: a notify answered 200 while the audit table is briefly locked is never audited (the row is dropped after one try)', async () => {
    const before = await request(app.http).get(`/api/devices/${EXTRA[3]}`).set(bearer(olga));
    expect(before.status).toBe(200);
    // The owner holds the table (a migration, a VACUUM FULL, a failover) a little longer than one statement may
    // wait; the gateway keeps answering notifies (with the bus off they touch no table).
    const locker = createDb<GatewayDatabase>(database.url, { max: 1, logger: { warn: () => undefined } });
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    const held = locker.transaction().execute(async (trx) => {
      await sql`LOCK TABLE device_gateway.audit_events IN ACCESS EXCLUSIVE MODE`.execute(trx);
      await released;
    });
    await sleep(200);
    try {
      expect(await notify(oscar, EXTRA[3], 'r42b-escape-1', 97)).toBe(200);
      await sleep(2500); // past the login's statement timeout (1.5 s here)
    } finally {
      release();
      await held;
      await locker.destroy();
    }
    // The change stands: the device serves the settings.
    const after = await request(app.http).get(`/api/devices/${EXTRA[3]}`).set(bearer(olga));
    expect(JSON.stringify((after.body as { settings: unknown }).settings)).toContain('97');
    // ...and once the table is free again, its row must still come.
    expect(await rowsOf('r42b-escape-1')).toBe(1);
  });

  it('a notify while the table is free is audited (held: the control case of the attack above)', async () => {
    expect(await notify(oscar, EXTRA[3], 'r42b-escape-2', 98)).toBe(200);
    expect(await rowsOf('r42b-escape-2')).toBe(1);
  });
});

describe("company scopes after the platform's sites change", () => {
  it("HOLE: a site handed to another company stays in the old company's scope until someone reloads the registry", async () => {
    // Acme's key sees and changes the annex's device.
    expect((await request(app.http).get(`/api/devices/${ANNEX_DEVICE}`).set(bearer(ACME_OPS))).status).toBe(
      200,
    );
    expect(await notify(ACME_OPS, ANNEX_DEVICE, 'r42b-annex-0', 98)).toBe(200);
    expect(await rowsOf('r42b-annex-0')).toBe(1);
    // The portal hands the annex to Borealis (the building was sold).
    await sql`UPDATE enterprise.sites SET company_id = ${BOREALIS}::uuid WHERE id = ${ANNEX}::uuid`.execute(
      owner,
    );
    await sleep(1000);
    const view = await request(app.http).get(`/api/devices/${ANNEX_DEVICE}`).set(bearer(ACME_OPS));
    const change = await notify(ACME_OPS, ANNEX_DEVICE, 'r42b-annex-1', 99);
    // Whether or not the hole is closed: after a reload the new owner's scope holds.
    await app.service.reload();
    expect((await request(app.http).get(`/api/devices/${ANNEX_DEVICE}`).set(bearer(ACME_OPS))).status).toBe(
      404,
    );
    expect([view.status, change]).toEqual([404, 404]);
  });

  it("HOLE (low): once the annex is Borealis', a Borealis operator reads Acme's people, keys and addresses in its history", async () => {
    // The enterprise side's rule for a tenant's history (design §4: a decider who is not a user of the row's
    // company shows as NULL); the gateway's audit is read by the row's site as the catalogue says now.
    const borealisOperator = await issuer.opsToken('vera', {
      resource_access: { [OPERATIONS_CLIENT]: { roles: ['operator'] } },
    });
    const res = await request(app.http)
      .get(`/api/audit?limit=100&device_id=${ANNEX_DEVICE}`)
      .set(bearer(borealisOperator));
    expect(res.status).toBe(200);
    const acmeTime = (res.body as { items: AuditItem[] }).items.filter(
      (r) => r.request_id === 'r42b-annex-0',
    );
    for (const row of acmeTime) expect(row.principal).not.toBe('key:acme-ops');
    // Acme's row is gone for her, not merely renamed; a change made since the handover is hers to read.
    expect(acmeTime).toEqual([]);
    expect(await notify(olga, ANNEX_DEVICE, 'r42b-annex-2', 96)).toBe(200);
    expect(await rowsOf('r42b-annex-2')).toBe(1);
    const since = await request(app.http)
      .get(`/api/audit?limit=100&device_id=${ANNEX_DEVICE}`)
      .set(bearer(borealisOperator));
    expect((since.body as { items: AuditItem[] }).items.map((r) => [r.request_id, r.site_ids])).toEqual([
      ['r42b-annex-2', [ANNEX]],
    ]);
  });
});

describe('tokens (held)', () => {
  it('HOLE (low): a fleet scope claim of JSON null is read as no scope at all: the whole fleet', async () => {
    // Absent is documented as the whole fleet; null is a value, and a malformed scope is refused, never widened.
    const t = await issuer.opsToken('oscar', { fleet_sites: null });
    const res = await request(app.http).get(`/api/devices/${OTHERS}`).set(bearer(t));
    expect([401, 404]).toContain(res.status);
  });

  it('a token that carries its own key (jwk, jku, x5u headers) under the realm kid is refused', async () => {
    const { kid } = JSON.parse(Buffer.from(olga.split('.')[0]!, 'base64url').toString('utf8')) as {
      kid: string;
    };
    const claims = JSON.parse(Buffer.from(olga.split('.')[1]!, 'base64url').toString('utf8')) as Record<
      string,
      unknown
    >;
    const { privateKey, publicKey } = await generateKeyPair('RS256');
    const jwk = await exportJWK(publicKey);
    for (const extra of [{ jwk }, { jku: 'http://127.0.0.1:1/jwks' }, { x5u: 'http://127.0.0.1:1/x5' }]) {
      const t = await new SignJWT(claims)
        .setProtectedHeader({ alg: 'RS256', typ: 'JWT', kid, ...extra })
        .sign(privateKey);
      const res = await request(app.http).get('/api/devices?limit=1').set(bearer(t));
      expect(res.status).toBe(401);
    }
  });

  it('credentials elsewhere than a Bearer header are not read: query, Basic, a cookie', async () => {
    for (const r of [
      request(app.http).get(`/api/devices?limit=1&access_token=${ANON}`),
      request(app.http)
        .get('/api/devices?limit=1')
        .set('Authorization', `Basic ${Buffer.from(`${ANON}:`).toString('base64')}`),
      request(app.http).get('/api/devices?limit=1').set('Cookie', `access_token=${ANON}`),
      request(app.http).get('/api/devices?limit=1').set('Authorization', `Bearer ${ANON.toUpperCase()}`),
      request(app.http).get('/api/devices?limit=1').set('Authorization', `Bearer${ANON}`),
    ])
      expect((await r).status).toBe(401);
    // The scheme is case-insensitive and trailing spaces are allowed (RFC 9110 §11.1): still the key.
    const ok = await request(app.http).get('/api/devices?limit=1').set('Authorization', `bEaReR ${ANON}  `);
    expect(ok.status).toBe(200);
  });

  it('a token held in the verifier cache keeps its scope: oscar stays HQ-only on a cached token', async () => {
    for (let i = 0; i < 3; i++)
      expect((await request(app.http).get(`/api/devices/${OTHERS}`).set(bearer(oscar))).status).toBe(404);
  });
});

describe('scopes on odd spellings and side channels (held)', () => {
  /** The problem body without what differs per request or echoes the asked id. */
  async function answer(path: string, token: string, id: string) {
    const res = await request(app.http).get(path).set(bearer(token));
    const headers = Object.keys(res.headers)
      .filter((h) => !['date', 'x-request-id', 'content-length', 'etag'].includes(h))
      .sort();
    const { request_id: _requestId, ...body } = res.body as Record<string, unknown>;
    return { status: res.status, body: JSON.stringify(body).split(id).join('<id>'), headers };
  }

  it("another site's device under odd spellings is answered as an absent one", async () => {
    const absent = await answer(`/api/devices/${ABSENT}`, oscar, ABSENT);
    expect(absent.status).toBe(404);
    // The id itself in other spellings: the bytes of an absent id (the asked id echoed, as for any).
    for (const [spelled, asked] of [
      [OTHERS, OTHERS],
      [OTHERS.toUpperCase(), OTHERS.toUpperCase()],
      [encodeURIComponent(OTHERS).replace(/-/g, '%2D'), OTHERS],
      [`${OTHERS}/`, OTHERS],
    ] as const)
      expect(await answer(`/api/devices/${spelled}`, oscar, asked)).toEqual(absent);
    // Paths that walk out of the parameter: never the device.
    for (const spelled of [`${MINE}%2F..%2F${OTHERS}`, `%2e%2e/${OTHERS}`, `${MINE}/../${OTHERS}`])
      expect((await request(app.http).get(`/api/devices/${spelled}`).set(bearer(oscar))).status).toBe(404);
  });

  it("a crafted overrides cursor naming another site's device lists only the caller's overrides", async () => {
    expect(await notify(olga, LIFT, 'r42b-ovr-tower', 93)).toBe(200);
    expect(await notify(oscar, LOBBY, 'r42b-ovr-hq', 93)).toBe(200);
    const cursor = Buffer.from(`o:${OTHERS}`).toString('base64url');
    for (const q of ['limit=100', `limit=100&cursor=${cursor}`, 'limit=1']) {
      const res = await request(app.http).get(`/api/overrides?${q}`).set(bearer(oscar));
      expect(res.status).toBe(200);
      expect(JSON.stringify(res.body)).not.toContain('borealis');
    }
  });

  it("audit filters naming another site's device or a tower rollout answer what an unknown one does", async () => {
    const tower = await createRollout(olga, { site_ids: [TOWER], device_ids: [OTHERS] });
    try {
      const q = (f: string) => request(app.http).get(`/api/audit?limit=100&${f}`).set(bearer(oscar));
      const unknown = (await q(`device_id=${ABSENT}`)).body as unknown;
      expect((await q(`device_id=${OTHERS}`)).body).toEqual(unknown);
      expect((await q(`rollout_id=${tower}`)).body).toEqual(unknown);
      expect((await q('principal=user:nobody')).body).toEqual(unknown);
      // Olga's tower changes are not oscar's to see, by her principal either.
      const byOlga = (await q(`principal=${encodeURIComponent(`user:${opsUsers.olga.sub}`)}`)).body as {
        items: AuditItem[];
      };
      for (const row of byOlga.items) expect(row.site_ids).not.toContain(TOWER);
    } finally {
      await cancel(tower);
    }
  });

  it('/api/devices?site_id= in another spelling of a foreign site is still 404 unknown_site', async () => {
    for (const s of [TOWER, TOWER.toUpperCase(), `{${TOWER}}`, TOWER.replace(/-/g, '')]) {
      const res = await request(app.http)
        .get(`/api/devices?site_id=${encodeURIComponent(s)}`)
        .set(bearer(oscar));
      expect([400, 404]).toContain(res.status);
      expect(JSON.stringify(res.body)).not.toContain('borealis');
    }
    const twice = await request(app.http)
      .get(`/api/devices?site_id=${HQ}&site_id=${TOWER}`)
      .set(bearer(oscar));
    expect([400, 404]).toContain(twice.status);
  });

  it('an operator cannot reach admin or unlisted routes with method tricks', async () => {
    for (const r of [
      request(app.http).post('/api/reload-registry').set(bearer(oscar)).set('X-HTTP-Method-Override', 'GET'),
      request(app.http).get('/api/config').set(bearer(oscar)),
      request(app.http).get('/API/CONFIG').set(bearer(oscar)),
      request(app.http).get('/api/config/').set(bearer(oscar)),
    ]) {
      const res = await r;
      expect([403, 404, 405]).toContain(res.status);
      expect(JSON.stringify(res.body)).not.toContain('named_api_keys');
    }
    // OPTIONS is express's own answer (the methods of the path, no handler runs), with or without a credential.
    const options = await request(app.http).options('/api/config').set(bearer(oscar));
    const anonymous = await request(app.http).options('/api/config');
    expect([options.status, options.headers.allow]).toEqual([anonymous.status, anonymous.headers.allow]);
    expect(JSON.stringify(options.body) + options.text).not.toContain('named_api_keys');
  });
});

describe("the device-key command's audit (held)", () => {
  it("a key issued for an HQ device is oscar's to read, not tom's, and its row holds no key", async () => {
    const issued = await issueAudited(
      owner,
      MINE,
      { validDays: 1 },
      { principal: commandPrincipal('ops-alice') },
    );
    const read = async (token: string) =>
      (
        (await request(app.http).get(`/api/audit?limit=100&device_id=${MINE}`).set(bearer(token))).body as {
          items: AuditItem[];
        }
      ).items.filter((r) => r.action === 'device_key.issued');
    const mine = await read(oscar);
    expect(mine).toHaveLength(1);
    expect(mine[0]).toMatchObject({ principal: 'command:ops-alice', site_ids: [HQ] });
    expect(JSON.stringify(mine[0])).not.toContain(issued.keyText);
    expect(await read(tom)).toEqual([]);
  });
});

describe('a device moved between sites and its rollout', () => {
  it("HOLE: an HQ operator's rollout whose device moved to the tower shows the tower's operator HQ's selector", async () => {
    const mine = await createRollout(oscar, { site_ids: [HQ], device_ids: [EXTRA[3]] });
    await sql`UPDATE device_gateway.device_registry SET site_id = ${TOWER}::uuid WHERE device_id = ${EXTRA[3]}`.execute(
      owner,
    );
    await app.service.reload();
    try {
      // Oscar lost it (its target is the tower's now); tom (tower) may not see it either (its selector names HQ):
      // it is the unscoped principals' now.
      expect((await request(app.http).get(`/api/rollouts/${mine}`).set(bearer(oscar))).status).toBe(404);
      const seen = await request(app.http).get(`/api/rollouts/${mine}`).set(bearer(tom));
      expect(seen.status).toBe(404);
      expect(JSON.stringify(seen.body)).not.toContain(HQ);
      expect((await request(app.http).get(`/api/rollouts/${mine}`).set(bearer(olga))).status).toBe(200);
    } finally {
      await cancel(mine);
    }
  });
});
