// Sixth cold review of issue 42 (principals, tokens, site scopes, the audit, the sealed cursors on /api), after
// review-42 and -42b..e. Each test named `HOLE` fails against the code as reviewed (a373a82) and passes once the hole
// is closed; every other test is an attack that held. Real parts: a real PostgreSQL with the platform's migrations
// and the demo seeds (plus sites and devices of this file's own), the test kit's issuer (real RS256 tokens and its
// JWKS), a named key file, the app over supertest.
//
// The fourth and fifth reviews' fixes read the portal's sites of now only for a caller scoped by COMPANIES
// (sites/confirm.ts returns `not_needed` for everyone else; rollout-routes' control reads sitesNow only when
// `companies !== null`). But the company a row or a rollout keeps is compared for EVERY scoped reader (audit-routes'
// `site_companies && owned`, rollout/sql.ts withinScope's pairs), and the queue stamps every caller's row from the
// catalogue. So a caller scoped by sites (a key's `sites=`, a token's `fleet_sites`) or an unscoped one, acting in
// the GATEWAY_SITES_REFRESH_MS window after a handover, reopens the holes those reviews closed.
//
// Closed at once: a site-scoped key's resume (rollout actions read the sites of now for every scoped caller). Left
// open in issue 42 as it.failing: the stamp of a change by a site-scoped or unscoped caller in the window (needs the
// companies read at the change for every caller without a cost on the notify path: an indexed definer lookup, or a
// history of each site's company stamped as of the queued row's time), and a target the registry moves to another
// company's site (a check at the reload, for the moved devices only). Closed since: an audit detail truncated whole
// when thresholds spell long (it keeps the scalar settings).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { demoCompanies, demoSites } from '@platform/enterprise-db';
import { type Issuer } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import type { GatewayApp } from '../src/app.js';
import { parseKeyFile, KeyFileError } from '../src/auth/api-keys.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { startPeopleGateway, type PeopleGateway } from './support/people-gateway.js';

jest.setTimeout(120_000);

const ANON = 'review42f-anonymous-key-0123456789';
const ACME_OPS = 'review42f-acme-ops-key-0123456789';
const BOREALIS_OPS = 'review42f-borealis-ops-key-0123456789';
const QUAY_OPS = 'review42f-quay-ops-key-0123456789';
const WHARF_OPS = 'review42f-wharf-ops-key-0123456789';
const HQ = demoSites.acmeHq.id;
const ACME = demoCompanies.acme.id;
const BOREALIS = demoCompanies.borealis.id;
/** A site of Acme's with a site-scoped key of its own (quay-ops); handed to Borealis by the first attack. */
const QUAY = '5e000000-0000-4000-8000-0000000042f1';
const QUAY_DEVICES = ['review42f-quay-01', 'review42f-quay-02'] as const;
/** A site of Acme's with a site-scoped key (wharf-ops) that runs a rollout on it; handed to Borealis mid-rollout. */
const WHARF = '5e000000-0000-4000-8000-0000000042f2';
const WHARF_DEVICES = ['review42f-wharf-01', 'review42f-wharf-02', 'review42f-wharf-03'] as const;
/** A site of Acme's handed to Borealis, whose operator then runs a rollout there inside Acme's refresh window. */
const PORT = '5e000000-0000-4000-8000-0000000042f3';
const PORT_DEVICE = 'review42f-port-01';
/** A site of Acme's whose rollout's target the registry then moves to Borealis's tower. */
const HARBOR = '5e000000-0000-4000-8000-0000000042f4';
const HARBOR_DEVICES = ['review42f-harbor-01', 'review42f-harbor-02', 'review42f-harbor-03'] as const;
const TOWER = demoSites.borealisTower.id;

let owner: Kysely<GatewayDatabase>;
let issuer: Issuer;
let app: GatewayApp;
let gw: PeopleGateway;

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` });
const plan = { first_wave_count: 1, growth_factor: 2, success_share: 0.5, abort_share: 0.5, deadline_s: 60 };
type AuditItem = { principal: string; request_id: string; site_ids: string[]; action: string };

beforeAll(async () => {
  gw = await startPeopleGateway({
    name: 'review42f',
    keyLines: [
      ANON,
      `name=acme-ops role=operator companies=${ACME} key=${ACME_OPS}`,
      `name=borealis-ops role=operator companies=${BOREALIS} key=${BOREALIS_OPS}`,
      `name=quay-ops role=operator sites=${QUAY} key=${QUAY_OPS}`,
      `name=wharf-ops role=operator sites=${WHARF} key=${WHARF_OPS}`,
    ],
    seed: async (o) => {
      await sql`INSERT INTO enterprise.sites (id, company_id, name, timezone)
        VALUES (${QUAY}::uuid, ${ACME}::uuid, 'Acme quay (review 42f)', 'America/Chicago'),
          (${WHARF}::uuid, ${ACME}::uuid, 'Acme wharf (review 42f)', 'America/Chicago'),
          (${PORT}::uuid, ${ACME}::uuid, 'Acme port (review 42f)', 'America/Chicago'),
          (${HARBOR}::uuid, ${ACME}::uuid, 'Acme harbor (review 42f)', 'America/Chicago')`.execute(o);
      await o
        .insertInto('device_gateway.device_registry')
        .values(
          [...QUAY_DEVICES, ...WHARF_DEVICES, PORT_DEVICE, ...HARBOR_DEVICES].map((id) => ({
            device_id: id,
            site_id: id.includes('-quay-')
              ? QUAY
              : id.includes('-wharf-')
                ? WHARF
                : id.includes('-harbor-')
                  ? HARBOR
                  : PORT,
            name: id,
            model: 'aq-sense-2',
            desired_settings: '{}',
          })),
        )
        .execute();
    },
  });
  ({ owner, issuer, app } = gw);
  // No catalogue refresh timer: the tests decide when the gateway re-reads the portal's sites (production's
  // GATEWAY_SITES_REFRESH_MS, 10 s by default, is the window the attacks use).
});

afterAll(async () => {
  await app.audit.flush();
  await gw.close();
});

const stateOf = async (id: string) =>
  (
    await sql<{
      state: string;
    }>`SELECT state FROM device_gateway.rollouts WHERE rollout_id = ${id}::uuid`.execute(owner)
  ).rows[0]?.state;

describe("the company a site-scoped or unscoped caller's change keeps, in the catalogue's refresh window", () => {
  // Left open (issue 42): see the file's header.
  it.failing(
    "HOLE: after the portal hands the quay to Borealis, changes to its devices by the quay's site key, a person scoped to the quay and an admin are stamped with Acme (the stale catalogue), so Borealis, which owns the devices, never sees them, nor does their own author",
    async () => {
      await sql`UPDATE enterprise.sites SET company_id = ${BOREALIS}::uuid WHERE id = ${QUAY}::uuid`.execute(
        owner,
      );
      // Within GATEWAY_SITES_REFRESH_MS: confirmCompanies answers `not_needed` for all three (none is scoped by
      // companies), so each row is stamped by the queue from the catalogue, which still says Acme.
      const quayToken = await issuer.opsToken('oscar', { fleet_sites: [QUAY] });
      const byKey = await gw.notify(QUAY_OPS, QUAY_DEVICES[0], 'r42f-quay-key', 71);
      const byPerson = await gw.notify(quayToken, QUAY_DEVICES[1], 'r42f-quay-person', 72);
      const byAdmin = await gw.notify(ANON, QUAY_DEVICES[0], 'r42f-quay-admin', 73);
      // An override clear by the site key: audited through the same queue, stamped the same way.
      const clear = await request(app.http)
        .delete(`/api/devices/${QUAY_DEVICES[1]}/override`)
        .set(bearer(QUAY_OPS))
        .set('X-Request-Id', 'r42f-quay-clear');
      expect([byKey, byPerson, byAdmin, clear.status]).toEqual([200, 200, 200, 200]);
      expect((clear.body as { cleared: boolean }).cleared).toBe(true);
      await app.audit.flush();
      await app.registry.refreshSites();
      const stamps = await sql<{ request_id: string; site_companies: string[] }>`
      SELECT request_id, site_companies FROM device_gateway.audit_events
      WHERE request_id LIKE 'r42f-quay-%' ORDER BY request_id`.execute(owner);
      const seenBy = async (token: string) =>
        (
          (await request(app.http).get('/api/audit?limit=100').set(bearer(token))).body as {
            items: AuditItem[];
          }
        ).items
          .filter((r) => r.request_id.startsWith('r42f-quay-'))
          .map((r) => r.request_id)
          .sort();
      // The whole picture in one comparison. Before the fix: every row stamped `<quay>/<acme>`; Borealis reads none of
      // the four changes to its own devices, and the quay's key cannot read even its own row (its pairs are now
      // quay/Borealis). Fixed: the companies of now, as a caller scoped by companies gets (sites/confirm.ts).
      expect({
        stamps: stamps.rows.map(
          (r) => `${r.request_id} ${r.site_companies.map((p) => p.split('/')[1]).join(',')}`,
        ),
        borealisSees: await seenBy(BOREALIS_OPS),
        quayKeySees: await seenBy(QUAY_OPS),
        acmeSees: await seenBy(ACME_OPS),
      }).toEqual({
        stamps: [
          `r42f-quay-admin ${BOREALIS}`,
          `r42f-quay-clear ${BOREALIS}`,
          `r42f-quay-key ${BOREALIS}`,
          `r42f-quay-person ${BOREALIS}`,
        ],
        borealisSees: ['r42f-quay-admin', 'r42f-quay-clear', 'r42f-quay-key', 'r42f-quay-person'],
        quayKeySees: ['r42f-quay-admin', 'r42f-quay-clear', 'r42f-quay-key', 'r42f-quay-person'],
        acmeSees: [],
      });
    },
  );
});

describe("the driver's handover pause, resumed by the site's own key in the refresh window", () => {
  it("HOLE: the wharf's site key resumes the rollout the driver paused for the wharf's handover (control reads the sites of now only for callers scoped by companies); the driver never pauses it again, and after the refresh no scoped operator can see, pause or cancel it", async () => {
    const created = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(WHARF_OPS))
      .send({ selector: { site_ids: [WHARF] }, settings: { reporting_interval_s: 81 }, plan });
    expect(created.status).toBe(201);
    const id = (created.body as { rollout_id: string }).rollout_id;
    await sql`UPDATE enterprise.sites SET company_id = ${BOREALIS}::uuid WHERE id = ${WHARF}::uuid`.execute(
      owner,
    );
    await app.rollouts.driver.tick();
    const pausedByDriver = await stateOf(id);
    // Within GATEWAY_SITES_REFRESH_MS the stale catalogue gives the wharf key the pair wharf/Acme, the rollout's
    // stamp (0041), so withinScope lets it act; 0043 keeps the handed-over pairs, so the driver leaves it running.
    const resume = await request(app.http).post(`/api/rollouts/${id}/resume`).set(bearer(WHARF_OPS));
    await app.rollouts.driver.tick();
    await app.rollouts.driver.tick();
    const afterTicks = await stateOf(id);
    await app.registry.refreshSites();
    const pauses = await Promise.all(
      [WHARF_OPS, BOREALIS_OPS, ACME_OPS].map(
        async (key) => (await request(app.http).post(`/api/rollouts/${id}/pause`).set(bearer(key))).status,
      ),
    );
    expect({ pausedByDriver, resume: resume.status, afterTicks, pauses }).toEqual({
      pausedByDriver: 'paused',
      // Fixed: as for a caller scoped by companies (fifth review), the wharf's pair now is wharf/Borealis, not the
      // rollout's wharf/Acme: refused as an absent rollout, and the driver's pause stands for an unscoped operator.
      resume: 404,
      afterTicks: 'paused',
      pauses: [404, 404, 404],
    });
  });
});

describe("a rollout's target moved by the registry to another company's site", () => {
  // Left open (issue 42): see the file's header.
  it.failing(
    "HOLE: Acme's rollout goes on to assign its settings to a device the registry moved to Borealis's tower, and neither company's operators can see, pause or cancel it (0043 checks the stamped sites only, not where the targets are now)",
    async () => {
      const created = await request(app.http)
        .post('/api/rollouts')
        .set(bearer(ACME_OPS))
        .send({
          selector: { site_ids: [HARBOR] },
          settings: { reporting_interval_s: 77 },
          plan: { ...plan, first_wave_count: 3 },
        });
      expect(created.status).toBe(201);
      const id = (created.body as { rollout_id: string }).rollout_id;
      // Before its first wave, an admin moves one target to Borealis's tower (the portal's sites are unchanged).
      await sql`UPDATE device_gateway.device_registry SET site_id = ${TOWER}::uuid
      WHERE device_id = ${HARBOR_DEVICES[2]}`.execute(owner);
      await app.service.reload();
      await app.rollouts.driver.tick();
      await app.rollouts.assignments.sync();
      const { rows } = await sql<{
        device_id: string;
      }>`SELECT device_id FROM device_gateway.rollout_assignments
      WHERE rollout_id = ${id}::uuid ORDER BY device_id`.execute(owner);
      const movedAssigned = rows.some((r) => r.device_id === HARBOR_DEVICES[2]);
      const state = await stateOf(id);
      const statusAs = async (key: string, action?: string) =>
        action === undefined
          ? (await request(app.http).get(`/api/rollouts/${id}`).set(bearer(key))).status
          : (await request(app.http).post(`/api/rollouts/${id}/${action}`).set(bearer(key))).status;
      const acts = {
        acmeRead: await statusAs(ACME_OPS),
        borealisRead: await statusAs(BOREALIS_OPS),
        acmePause: await statusAs(ACME_OPS, 'pause'),
        borealisPause: await statusAs(BOREALIS_OPS, 'pause'),
      };
      // Borealis's own device view: a rollout it may not see sets its tower device's settings.
      const towerView = JSON.stringify(
        (await request(app.http).get(`/api/devices/${HARBOR_DEVICES[2]}`).set(bearer(BOREALIS_OPS))).body,
      );
      // The whole picture; before the fix: assigned, active, 404 for every scoped read and pause, the layer withheld.
      expect({
        movedAssigned,
        state,
        acts,
        towerLayerWithheld: towerView.includes('rollout_outside_scope'),
        outcome:
          movedAssigned && state === 'active' ? 'Acme settings on a Borealis device, unstoppable' : 'held',
      }).toMatchObject({ outcome: 'held' });
    },
  );
});

describe('a rollout made after a handover, read by the old company in its refresh window (held)', () => {
  it("an admin's rollout on the port just handed to Borealis, and its audit row, are not Acme's to see, though Acme's catalogue still gives it the port (the rollout keeps the companies of its creation's commit, 0041/0043)", async () => {
    await sql`UPDATE enterprise.sites SET company_id = ${BOREALIS}::uuid WHERE id = ${PORT}::uuid`.execute(
      owner,
    );
    const created = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(ANON))
      .set('X-Request-Id', 'r42f-port-rollout')
      .send({ selector: { site_ids: [PORT] }, settings: { reporting_interval_s: 76 }, plan });
    expect(created.status).toBe(201);
    const id = (created.body as { rollout_id: string }).rollout_id;
    // Its first wave assigns the port's one device: a layer of the device Acme still reaches.
    await app.rollouts.driver.tick();
    await app.rollouts.assignments.sync();
    // Still stale: Acme's key reaches the port's device (reads answer from the catalogue, by design).
    const device = await request(app.http).get(`/api/devices/${PORT_DEVICE}`).set(bearer(ACME_OPS));
    const read = await request(app.http).get(`/api/rollouts/${id}`).set(bearer(ACME_OPS));
    const list = await request(app.http).get('/api/rollouts?limit=100').set(bearer(ACME_OPS));
    const audit = await request(app.http).get('/api/audit?limit=100').set(bearer(ACME_OPS));
    const layers = JSON.stringify(device.body);
    const admins = JSON.stringify(
      (await request(app.http).get(`/api/devices/${PORT_DEVICE}`).set(bearer(ANON))).body,
    );
    expect({
      device: device.status,
      adminSeesLayer: admins.includes(id),
      layerNamesIt: layers.includes(id),
      layerMarked: layers.includes('rollout_outside_scope'),
      read: read.status,
      listed: (list.body as { items: { rollout_id: string }[] }).items.some((r) => r.rollout_id === id),
      audited: (audit.body as { items: AuditItem[] }).items.some((r) => r.request_id === 'r42f-port-rollout'),
    }).toEqual({
      device: 200,
      adminSeesLayer: true,
      layerNamesIt: false,
      layerMarked: true,
      read: 404,
      listed: false,
      audited: false,
    });
    await app.registry.refreshSites();
  });
});

describe('a genuine token whose claims the audit cannot hold (held)', () => {
  it('a preferred_username holding a NUL is 401 before any change (PostgreSQL text takes no NUL): neither a notify nor a rollout is made unaudited', async () => {
    const token = await issuer.opsToken('oscar', { preferred_username: 'oscar\u0000admin' });
    const notified = await gw.notify(token, 'acme-hq-hvac-01', 'r42f-nul-name', 74);
    const created = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(token))
      .send({ selector: { site_ids: [HQ] }, settings: { reporting_interval_s: 75 }, plan });
    expect([notified, created.status, await gw.auditRowsOf('r42f-nul-name', 1, 500)]).toEqual([401, 401, 0]);
    expect((created.body as { detail: string }).detail).toContain('NUL');
  });
});

describe("what the audit keeps of a change's settings", () => {
  // Fixed: a detail too long keeps its scalar fields and its settings' (audit/writer.ts); it.failing until then.
  it("HOLE (low): an operator hides what a notify set (maintenance mode, the beta firmware channel) behind thresholds jsonb spells long: the row's detail is only {truncated, bytes}", async () => {
    // The first review's fix keeps the row of a detail past 4 KiB as jsonb prints it, but drops the detail whole.
    // Valid Device Settings that fit one datagram (JSON spells 1.7976931348623157e+308 in 23 characters).
    const big = 1.7976931348623157e308;
    const thresholds = Object.fromEntries(
      Array.from({ length: 8 }, (_, i) => [`t${i}`, { min: -big, max: big }]),
    );
    const settings = {
      maintenance_mode: true,
      firmware_channel: 'beta',
      reporting_interval_s: 10,
      thresholds,
    };
    // Oscar: an HQ operator (the test kit's user), on a device of his site.
    const oscar = await issuer.opsToken('oscar');
    const answer = await request(app.http)
      .post('/api/notify-settings')
      .set(bearer(oscar))
      .set('X-Request-Id', 'r42f-hidden-settings')
      .send({ device_id: 'acme-hq-hvac-01', settings });
    expect(answer.status).toBe(200);
    expect(await gw.auditRowsOf('r42f-hidden-settings')).toBe(1);
    const { rows } = await sql<{ detail: Record<string, unknown> }>`
      SELECT detail FROM device_gateway.audit_events WHERE request_id = 'r42f-hidden-settings'`.execute(
      owner,
    );
    const kept = (rows[0]!.detail as { settings?: Record<string, unknown> }).settings;
    // Fixed: the row says what was set (at least every field but the long numbers; a threshold may be abridged).
    expect({
      maintenance_mode: kept?.maintenance_mode,
      firmware_channel: kept?.firmware_channel,
      reporting_interval_s: kept?.reporting_interval_s,
    }).toEqual({ maintenance_mode: true, firmware_channel: 'beta', reporting_interval_s: 10 });
  });
});

describe('named keys (held)', () => {
  it('an empty or blank scope field is refused, never read as no scope (an unscoped key)', () => {
    for (const line of [
      `name=a role=admin sites= key=k0123456789abcdef`,
      `name=a role=admin companies= key=k0123456789abcdef`,
      `name=a role=admin sites=, key=k0123456789abcdef`,
      `name=a role=admin sites=${HQ},, key=k0123456789abcdef`,
    ])
      expect(() => parseKeyFile(line)).toThrow(KeyFileError);
    // Upper case is the same site (the parser lower-cases), never another or none.
    expect(
      parseKeyFile(`name=a role=viewer sites=${HQ.toUpperCase()} key=k0123456789abcdef`).named[0]!.sites,
    ).toEqual([HQ]);
  });
});
