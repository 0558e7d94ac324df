// Site scopes on the fleet routes and the audit of every change (issue 42 §3, §4): a site-scoped operator (oscar,
// a real token of the test kit's issuer) and a named key limited to one site try every route on another site's
// devices and rollouts - refused with the answer an absent id gets, nothing changed, nothing in lists - and succeed
// on their own site, each change audited with its actor; rollout events name the actor; the driver's own abort is
// audited as `driver`; the specification's anonymous key works as before. A real PostgreSQL with the whole
// platform's migrations and the demo seeds.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { demoSites } from '@platform/enterprise-db';
import { opsUsers, type Issuer } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import type { GatewayApp } from '../src/app.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { startPeopleGateway, type PeopleGateway } from './support/people-gateway.js';

jest.setTimeout(120_000);

const ANON = 'scopes-anonymous-key-0123456789';
const HQ_TOOL = 'scopes-hq-tool-key-0123456789';
const HQ = demoSites.acmeHq.id;
const TOWER = demoSites.borealisTower.id;
/** A site id no portal row has. */
const NOWHERE = '5e000000-0000-4000-8000-00000000dead';
const OTHERS = 'borealis-tower-chiller-01';
const ABSENT = 'no-such-device-01';
const MINE = 'acme-hq-hvac-01';
const OSCAR = `user:${opsUsers.oscar.sub}`;

let owner: Kysely<GatewayDatabase>;
let issuer: Issuer;
let app: GatewayApp;
let olga: string;
let oscar: string;

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` });
const plan = { first_wave_count: 1, growth_factor: 2, success_share: 0.5, abort_share: 0.5, deadline_s: 60 };

let gw: PeopleGateway;

beforeAll(async () => {
  gw = await startPeopleGateway({
    name: 'people-scopes',
    keyLines: [ANON, `name=hq-tool role=operator sites=${HQ} key=${HQ_TOOL}`],
  });
  ({ owner, issuer, app } = gw);
  olga = await issuer.opsToken('olga');
  oscar = await issuer.opsToken('oscar');
});

afterAll(async () => {
  await gw.close();
});

interface AuditRow {
  principal: string;
  principal_kind: string;
  action: string;
  device_id: string | null;
  rollout_id: string | null;
  site_ids: string[];
  detail: Record<string, unknown>;
}

async function auditRows(): Promise<AuditRow[]> {
  const { rows } = await sql<AuditRow>`
    SELECT principal, principal_kind, action, device_id, rollout_id, site_ids::text[] AS site_ids, detail
    FROM device_gateway.audit_events ORDER BY id`.execute(owner);
  return rows;
}

/** Enabled devices of the registry at `siteId` (null: everywhere): what an unscoped fleet list shows. */
async function enabledAt(siteId: string | null): Promise<number> {
  const { rows } = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM device_gateway.device_registry
    WHERE enabled AND (${siteId}::uuid IS NULL OR site_id = ${siteId}::uuid)`.execute(owner);
  return rows[0]!.n;
}

/**
 * The audit rows after the first `from`, once there are `n` of them (a notify's and a clear's row is written after
 * the answer went out), within 5 s.
 */
async function rowsSoon(from: number, n: number): Promise<AuditRow[]> {
  const deadline = Date.now() + 5000;
  let rows = (await auditRows()).slice(from);
  while (rows.length < n && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    rows = (await auditRows()).slice(from);
  }
  return rows;
}

async function events(rolloutId: string): Promise<{ kind: string; actor: string }[]> {
  const { rows } = await sql<{ kind: string; actor: string }>`
    SELECT kind, actor FROM device_gateway.rollout_events WHERE rollout_id = ${rolloutId}::uuid
    ORDER BY event_id`.execute(owner);
  return rows;
}

/** A problem body with `id` replaced, so an out-of-scope answer compares with an absent one's. */
const without = (body: unknown, id: string): string =>
  JSON.stringify({ ...(body as Record<string, unknown>), request_id: undefined })
    .split(id)
    .join('<id>');

async function createRollout(token: string, body: Record<string, unknown>): Promise<string> {
  const res = await request(app.http).post('/api/rollouts').set(bearer(token)).send(body);
  expect(res.status).toBe(201);
  return (res.body as { rollout_id: string }).rollout_id;
}

describe('scopes: another site is as absent as nothing', () => {
  const callers: [string, () => string][] = [
    ['oscar (token, operator of Acme HQ)', () => oscar],
    ['hq-tool (named key of Acme HQ)', () => HQ_TOOL],
  ];

  it.each(callers)(
    '%s: the device routes answer for another site exactly as for an absent device',
    async (_n, who) => {
      const token = who();
      const before = await request(app.http).get(`/api/devices/${OTHERS}`).set(bearer(olga));
      expect(before.status).toBe(200);
      const auditBefore = (await auditRows()).length;
      const tries = [
        (id: string) => request(app.http).get(`/api/devices/${id}`).set(bearer(token)),
        (id: string) =>
          request(app.http)
            .post('/api/notify-settings')
            .set(bearer(token))
            .send({ device_id: id, settings: { reporting_interval_s: 77 } }),
        (id: string) =>
          request(app.http)
            .post('/api/update-settings')
            .set(bearer(token))
            .send({ device_id: id, settings: { reporting_interval_s: 77 } }),
        (id: string) => request(app.http).delete(`/api/devices/${id}/override`).set(bearer(token)),
      ];
      for (const attempt of tries) {
        const other = await attempt(OTHERS);
        const absent = await attempt(ABSENT);
        expect(other.status).toBe(404);
        expect(absent.status).toBe(404);
        expect((other.body as { code: string }).code).toBe('unknown_device');
        expect(without(other.body, OTHERS)).toBe(without(absent.body, ABSENT));
        expect(other.headers['content-type']).toBe(absent.headers['content-type']);
      }
      // Nothing changed, nothing audited.
      const after = await request(app.http).get(`/api/devices/${OTHERS}`).set(bearer(olga));
      expect((after.body as { settings: unknown }).settings).toEqual(
        (before.body as { settings: unknown }).settings,
      );
      expect((await auditRows()).length).toBe(auditBefore);
    },
  );

  it.each(callers)(
    '%s: the fleet list holds its site only; another site is 404 unknown_site like an unknown one',
    async (_n, who) => {
      const token = who();
      const all = await request(app.http).get('/api/devices?limit=100').set(bearer(token));
      expect(all.status).toBe(200);
      const items = (all.body as { items: { device_id: string; site_id: string }[] }).items;
      expect(items.length).toBe(await enabledAt(HQ));
      expect(items.every((d) => d.site_id === HQ)).toBe(true);
      expect(JSON.stringify(all.body)).not.toContain(TOWER);
      const filtered = await request(app.http)
        .get(`/api/devices?site_id=${HQ}&delivery=not_applied,applied`)
        .set(bearer(token));
      expect((filtered.body as { items: unknown[] }).items.length).toBe(await enabledAt(HQ));
      // Several states (the merged walk) are filtered too.
      const states = await request(app.http).get('/api/devices?delivery=unobserved,stale').set(bearer(token));
      for (const d of (states.body as { items: { site_id: string }[] }).items) expect(d.site_id).toBe(HQ);
      const other = await request(app.http).get(`/api/devices?site_id=${TOWER}`).set(bearer(token));
      const unknown = await request(app.http).get(`/api/devices?site_id=${NOWHERE}`).set(bearer(token));
      expect(other.status).toBe(404);
      expect((other.body as { code: string }).code).toBe('unknown_site');
      expect(without(other.body, TOWER)).toBe(without(unknown.body, NOWHERE));
      // An unscoped admin gets the same 404 for a site the platform does not know, and the other site's devices.
      expect((await request(app.http).get(`/api/devices?site_id=${NOWHERE}`).set(bearer(olga))).status).toBe(
        404,
      );
      const tower = await request(app.http).get(`/api/devices?site_id=${TOWER}`).set(bearer(olga));
      expect((tower.body as { items: unknown[] }).items.length).toBe(await enabledAt(TOWER));
    },
  );

  it('overrides of another site are not listed to a scoped caller; an admin sees them', async () => {
    await request(app.http)
      .post('/api/notify-settings')
      .set(bearer(olga))
      .send({ device_id: OTHERS, settings: { reporting_interval_s: 90 } })
      .expect(200);
    await request(app.http)
      .post('/api/notify-settings')
      .set(bearer(oscar))
      .send({ device_id: MINE, settings: { reporting_interval_s: 91 } })
      .expect(200);
    const listed = async (token: string) =>
      (await request(app.http).get('/api/overrides?limit=1').set(bearer(token))).body as {
        items: { device_id: string }[];
        next_cursor: string | null;
      };
    const scoped = await listed(HQ_TOOL);
    expect(scoped.items.map((o) => o.device_id)).toEqual([MINE]);
    expect(scoped.next_cursor).toBeNull();
    const admin = await listed(olga);
    expect(admin.items.length).toBe(1);
    expect(admin.next_cursor).not.toBeNull();
    // The other site's override is still there: the scoped clear of it was a 404.
    expect(
      (await request(app.http).delete(`/api/devices/${OTHERS}/override`).set(bearer(oscar))).status,
    ).toBe(404);
    const cleared = await request(app.http).delete(`/api/devices/${OTHERS}/override`).set(bearer(olga));
    expect((cleared.body as { cleared: boolean }).cleared).toBe(true);
  });

  it('a selector reaching another site is refused naming only the caller input; no rollout is made', async () => {
    const settings = { reporting_interval_s: 300 };
    const count = async () =>
      Number(
        (await sql<{ n: string }>`SELECT count(*) AS n FROM device_gateway.rollouts`.execute(owner)).rows[0]!
          .n,
      );
    const n = await count();
    for (const token of [oscar, HQ_TOOL]) {
      const other = await request(app.http)
        .post('/api/rollouts')
        .set(bearer(token))
        .send({ selector: { site_ids: [TOWER] }, settings, plan });
      const unknown = await request(app.http)
        .post('/api/rollouts')
        .set(bearer(token))
        .send({ selector: { site_ids: [NOWHERE] }, settings, plan });
      expect(other.status).toBe(400);
      expect(without(other.body, TOWER)).toBe(without(unknown.body, NOWHERE));
      expect((other.body as { errors: { path: string }[] }).errors[0]!.path).toBe('/selector/site_ids/0');
      // A device of another site by id, with the caller's own site: as if the device did not exist.
      const byId = await request(app.http)
        .post('/api/rollouts')
        .set(bearer(token))
        .send({ selector: { site_ids: [HQ], device_ids: [OTHERS] }, settings, plan });
      const byAbsent = await request(app.http)
        .post('/api/rollouts')
        .set(bearer(token))
        .send({ selector: { site_ids: [HQ], device_ids: [ABSENT] }, settings, plan });
      expect(byId.status).toBe(400);
      expect(without(byId.body, OTHERS)).toBe(without(byAbsent.body, ABSENT));
      // No sites named: refused (a model or device id alone could reach any site).
      const bare = await request(app.http)
        .post('/api/rollouts')
        .set(bearer(token))
        .send({ selector: { models: ['chiller-cx-900'] }, settings, plan });
      expect(bare.status).toBe(400);
      expect((bare.body as { errors: { path: string }[] }).errors[0]!.path).toBe('/selector/site_ids');
      expect(JSON.stringify(bare.body)).not.toContain(TOWER);
    }
    // An unscoped admin naming a site the platform does not know: 400 too.
    const admin = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(olga))
      .send({ selector: { site_ids: [NOWHERE] }, settings, plan });
    expect(admin.status).toBe(400);
    expect(await count()).toBe(n);
  });
});

describe('scopes: rollouts and the audit', () => {
  let towerRollout: string;

  it("another site's rollout is 404 to a scoped caller for every route, not listed, and unchanged", async () => {
    towerRollout = await createRollout(olga, {
      selector: { site_ids: [TOWER] },
      settings: { reporting_interval_s: 240 },
      plan: { ...plan, first_wave_count: 2, abort_share: 0.5, deadline_s: 2 },
    });
    const absent = '0f000000-0000-4000-8000-0000000000ff';
    for (const token of [oscar, HQ_TOOL]) {
      const one = await request(app.http).get(`/api/rollouts/${towerRollout}`).set(bearer(token));
      const none = await request(app.http).get(`/api/rollouts/${absent}`).set(bearer(token));
      expect(one.status).toBe(404);
      expect(without(one.body, towerRollout)).toBe(without(none.body, absent));
      for (const action of ['pause', 'resume', 'cancel', 'rollback']) {
        const acted = await request(app.http)
          .post(`/api/rollouts/${towerRollout}/${action}`)
          .set(bearer(token));
        const absentActed = await request(app.http)
          .post(`/api/rollouts/${absent}/${action}`)
          .set(bearer(token));
        expect(acted.status).toBe(404);
        expect(without(acted.body, towerRollout)).toBe(without(absentActed.body, absent));
      }
      const list = await request(app.http).get('/api/rollouts?limit=100').set(bearer(token));
      expect(list.status).toBe(200);
      expect(JSON.stringify(list.body)).not.toContain(towerRollout);
    }
    const state = await request(app.http).get(`/api/rollouts/${towerRollout}`).set(bearer(olga));
    expect((state.body as { state: string }).state).toBe('active');
    expect((await events(towerRollout)).map((e) => e.kind)).toEqual(['created', 'wave_started']);
  });

  it('a scoped caller creates, pauses, resumes, cancels and rolls back on its site; each audited, events name it', async () => {
    const first = await createRollout(HQ_TOOL, {
      selector: { site_ids: [HQ], device_ids: [MINE] },
      settings: { reporting_interval_s: 310 },
      plan,
    });
    const listed = await request(app.http).get('/api/rollouts?limit=100').set(bearer(oscar));
    expect(JSON.stringify(listed.body)).toContain(first);
    expect((await request(app.http).get(`/api/rollouts/${first}`).set(bearer(oscar))).status).toBe(200);
    for (const action of ['pause', 'resume', 'cancel'])
      await request(app.http).post(`/api/rollouts/${first}/${action}`).set(bearer(oscar)).expect(200);
    const second = await createRollout(oscar, {
      selector: { site_ids: [HQ], models: ['aq-sense-2'] },
      settings_patch: { reporting_interval_s: 320 },
      plan,
    });
    await request(app.http).post(`/api/rollouts/${second}/pause`).set(bearer(HQ_TOOL)).expect(200);
    await request(app.http).post(`/api/rollouts/${second}/rollback`).set(bearer(oscar)).expect(200);

    expect(await events(first)).toEqual([
      { kind: 'created', actor: 'key:hq-tool' },
      { kind: 'wave_started', actor: 'key:hq-tool' },
      { kind: 'paused', actor: OSCAR },
      { kind: 'resumed', actor: OSCAR },
      { kind: 'cancelled', actor: OSCAR },
    ]);
    expect((await events(second)).map((e) => `${e.kind} ${e.actor}`)).toEqual([
      `created ${OSCAR}`,
      `wave_started ${OSCAR}`,
      'paused key:hq-tool',
      `rolled_back ${OSCAR}`,
    ]);
    // The API's view of the events shows the actor too.
    const view = await request(app.http).get(`/api/rollouts/${first}`).set(bearer(oscar));
    expect((view.body as { events: { actor: string }[] }).events[0]!.actor).toBe('key:hq-tool');

    const rows = (await auditRows()).filter((r) => r.rollout_id === first || r.rollout_id === second);
    expect(rows.map((r) => `${r.action} ${r.principal}`)).toEqual([
      'rollout.created key:hq-tool',
      `rollout.paused ${OSCAR}`,
      `rollout.resumed ${OSCAR}`,
      `rollout.cancelled ${OSCAR}`,
      `rollout.created ${OSCAR}`,
      'rollout.paused key:hq-tool',
      `rollout.rolled_back ${OSCAR}`,
    ]);
    for (const r of rows) expect(r.site_ids).toEqual([HQ]);
    expect(rows[0]!.detail).toEqual({
      targets: 1,
      selector: { site_ids: [HQ], device_ids: [MINE] },
    });
  });

  it('notify and a clear on its own site are audited with the actor and the site; a clear of nothing is not', async () => {
    const from = (await auditRows()).length;
    await request(app.http)
      .post('/api/notify-settings')
      .set(bearer(HQ_TOOL))
      .send({ device_id: MINE, settings: { reporting_interval_s: 123 } })
      .expect(200);
    await request(app.http).delete(`/api/devices/${MINE}/override`).set(bearer(oscar)).expect(200);
    await request(app.http).delete(`/api/devices/${MINE}/override`).set(bearer(oscar)).expect(200);
    const rows = await rowsSoon(from, 2);
    // No third row comes for the clear that cleared nothing.
    await new Promise((r) => setTimeout(r, 200));
    expect((await auditRows()).slice(from).length).toBe(2);
    expect(rows.map((r) => `${r.action} ${r.principal}`)).toEqual([
      'settings.notified key:hq-tool',
      `override.cleared ${OSCAR}`,
    ]);
    expect(rows[0]!.site_ids).toEqual([HQ]);
    expect(rows[0]!.detail).toMatchObject({ settings: { reporting_interval_s: 123 } });
    // Visible to the scoped caller in GET /api/audit.
    const audit = await request(app.http).get(`/api/audit?device_id=${MINE}&limit=2`).set(bearer(oscar));
    const items = (audit.body as { items: { action: string; source_address: string | null }[] }).items;
    expect(items.map((r) => r.action)).toEqual(['override.cleared', 'settings.notified']);
    // Where the tool acted from is not oscar's to read; his own change keeps its address, and an unscoped reader
    // reads both.
    expect(items.map((r) => r.source_address === null)).toEqual([false, true]);
    const all = await request(app.http).get(`/api/audit?device_id=${MINE}&limit=2`).set(bearer(ANON));
    const everything = (all.body as { items: { source_address: string | null }[] }).items;
    expect(everything.map((r) => r.source_address === null)).toEqual([false, false]);
  });

  it('a burst of notifies is audited row for row (queued after the answers, written in batches)', async () => {
    const from = (await auditRows()).length;
    const answers = await Promise.all(
      Array.from({ length: 300 }, (_, i) =>
        request(app.http)
          .post('/api/notify-settings')
          .set(bearer(HQ_TOOL))
          .send({ device_id: MINE, settings: { reporting_interval_s: 1000 + i } }),
      ),
    );
    expect(answers.every((r) => r.status === 200)).toBe(true);
    const rows = await rowsSoon(from, 300);
    expect(rows.length).toBe(300);
    expect(
      new Set(rows.map((r) => (r.detail.settings as { reporting_interval_s: number }).reporting_interval_s))
        .size,
    ).toBe(300);
    await request(app.http).delete(`/api/devices/${MINE}/override`).set(bearer(HQ_TOOL)).expect(200);
  });

  it("the driver's own abort is audited as driver, with the rollout's sites and reason", async () => {
    const deadline = Date.now() + 30_000;
    const driverRows = async () =>
      (await auditRows()).filter((r) => r.rollout_id === towerRollout && r.principal === 'driver');
    let rows = await driverRows();
    while (rows.length === 0) {
      if (Date.now() > deadline) throw new Error('the driver did not abort the rollout in 30 s');
      await app.rollouts.driver.tick();
      rows = await driverRows();
      if (rows.length === 0) await new Promise((r) => setTimeout(r, 250));
    }
    expect(rows.map((r) => r.action)).toEqual(['rollout.aborted']);
    expect(rows[0]!.principal_kind).toBe('driver');
    expect(rows[0]!.site_ids).toEqual([TOWER]);
    expect(String(rows[0]!.detail.reason)).toMatch(/fail/);
    expect(rows[0]!.detail.event_id).toMatch(/^[0-9]+$/);
    const aborted = (await events(towerRollout)).find((e) => e.kind === 'aborted');
    expect(aborted?.actor).toMatch(/^driver /);
    // Later ticks do not audit it again.
    await app.rollouts.driver.tick();
    expect((await driverRows()).length).toBe(1);
  });

  it('the anonymous key works as before: the whole fleet, its rollout events say api, its audit rows api-key', async () => {
    const all = await request(app.http).get('/api/devices?limit=100').set(bearer(ANON));
    expect((all.body as { items: unknown[] }).items.length).toBe(await enabledAt(null));
    const id = await createRollout(ANON, {
      selector: { models: ['door-ctl-7'] },
      settings: { reporting_interval_s: 330 },
      plan,
    });
    await request(app.http).post(`/api/rollouts/${id}/pause`).set(bearer(ANON)).expect(200);
    expect((await events(id)).map((e) => e.actor)).toEqual(['api', 'api', 'api']);
    const rows = (await auditRows()).filter((r) => r.rollout_id === id);
    expect(rows.map((r) => `${r.action} ${r.principal}`)).toEqual([
      'rollout.created api-key',
      'rollout.paused api-key',
    ]);
    expect(rows[0]!.site_ids).toEqual([demoSites.acmeWarehouse.id]);
    // Scoped callers do not see it (its targets are at the warehouse).
    expect((await request(app.http).get(`/api/rollouts/${id}`).set(bearer(oscar))).status).toBe(404);
  });

  it('an actor of another shape is written as api (migration 0030)', async () => {
    const unset = await sql<{ a: string }>`SELECT device_gateway.rollout_actor() AS a`.execute(owner);
    expect(unset.rows[0]!.a).toBe('api');
    const inOne = await owner.transaction().execute(async (trx) => {
      await sql`SELECT set_config('device_gateway.actor', ${"user:x'; DROP TABLE x"}, true)`.execute(trx);
      const odd = (await sql<{ a: string }>`SELECT device_gateway.rollout_actor() AS a`.execute(trx)).rows[0]!
        .a;
      await sql`SELECT set_config('device_gateway.actor', 'key:hq-tool', true)`.execute(trx);
      const good = (await sql<{ a: string }>`SELECT device_gateway.rollout_actor() AS a`.execute(trx))
        .rows[0]!.a;
      return { odd, good };
    });
    expect(inOne).toEqual({ odd: 'api', good: 'key:hq-tool' });
  });
});
