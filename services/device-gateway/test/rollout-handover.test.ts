// A rollout reaching a site the portal hands to another company (issue 42, fourth cold review; migration 0043,
// design §3.9): the driver pauses it at its next tick as one of its own halts, audited as `driver`; an unscoped
// operator's resume stands until a further handover; the login cannot pause for a replica that does not hold the
// lease; and every audit row about the rollout keeps the companies the rollout keeps, so it is read by those who may
// read the rollout. Real parts: a real PostgreSQL with the platform's migrations and demo seeds (plus this file's
// sites and devices), named keys, the test kit's issuer, the app over supertest, the driver ticked by the tests.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { demoCompanies, demoSites } from '@platform/enterprise-db';
import { opsUsers } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import request from 'supertest';
import type { GatewayApp } from '../src/app.js';
import { recordAudit } from '../src/audit/writer.js';
import { DRIVER } from '../src/auth/principal.js';
import { gatewayLoginUrl } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { startPeopleGateway, type PeopleGateway } from './support/people-gateway.js';

jest.setTimeout(60_000);

const ACME_OPS = 'handover-acme-ops-key-0123456789';
const BOREALIS_OPS = 'handover-borealis-ops-key-0123456789';
const ACME = demoCompanies.acme.id;
const BOREALIS = demoCompanies.borealis.id;
const HQ = demoSites.acmeHq.id;
/** Acme's sites of this file, each handed to Borealis by one of the tests. */
const GATE = '5e000000-0000-4000-8000-00000000a0e1';
const FIELD = '5e000000-0000-4000-8000-00000000a0e2';
const LOT = '5e000000-0000-4000-8000-00000000a0e3';
const YARD = '5e000000-0000-4000-8000-00000000a0e4';
const SITES = { gate: GATE, field: FIELD, lot: LOT, yard: YARD } as const;
const REASON = 'a site it reaches was handed to another company since its creation';

let owner: Kysely<GatewayDatabase>;
let app: GatewayApp;
let gw: PeopleGateway;
let olga: string;

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` });
const plan = { first_wave_count: 1, growth_factor: 2, success_share: 0.5, abort_share: 0.5, deadline_s: 60 };

beforeAll(async () => {
  gw = await startPeopleGateway({
    name: 'handover',
    keyLines: [
      `name=acme-ops role=operator companies=${ACME} key=${ACME_OPS}`,
      `name=borealis-ops role=operator companies=${BOREALIS} key=${BOREALIS_OPS}`,
    ],
    seed: async (o) => {
      await sql`INSERT INTO enterprise.sites (id, company_id, name, timezone)
        VALUES (${GATE}::uuid, ${ACME}::uuid, 'Acme gate (handover)', 'Europe/Oslo'),
          (${FIELD}::uuid, ${ACME}::uuid, 'Acme field (handover)', 'Europe/Oslo'),
          (${LOT}::uuid, ${ACME}::uuid, 'Acme lot (handover)', 'Europe/Oslo'),
          (${YARD}::uuid, ${ACME}::uuid, 'Acme yard (handover)', 'Europe/Oslo')`.execute(o);
      await o
        .insertInto('device_gateway.device_registry')
        .values(
          Object.entries(SITES).flatMap(([name, site]) =>
            [1, 2].map((n) => ({
              device_id: `handover-${name}-0${n}`,
              site_id: site,
              name: `${name} ${n}`,
              model: 'aq-sense-2',
              desired_settings: '{}',
            })),
          ),
        )
        .execute();
    },
  });
  ({ owner, app } = gw);
  olga = await gw.issuer.opsToken('olga');
});

afterAll(async () => {
  await app.audit.flush();
  await gw.close();
});

const create = async (key: string, siteIds: string[], deviceIds: string[]) => {
  const res = await request(app.http)
    .post('/api/rollouts')
    .set(bearer(key))
    .send({
      selector: { site_ids: siteIds, device_ids: deviceIds },
      settings: { reporting_interval_s: 91 },
      plan,
    });
  expect(res.status).toBe(201);
  return (res.body as { rollout_id: string }).rollout_id;
};

const handOver = async (site: string) => {
  await sql`UPDATE enterprise.sites SET company_id = ${BOREALIS}::uuid WHERE id = ${site}::uuid`.execute(
    owner,
  );
  await app.service.reload();
};

const rolloutRow = async (id: string) => {
  const { rows } = await sql<{ state: string; reason: string | null; site_companies: string[] }>`
    SELECT state, reason, site_companies FROM device_gateway.rollouts WHERE rollout_id = ${id}::uuid`.execute(
    owner,
  );
  return rows[0]!;
};

const act = async (token: string, id: string, action: string) =>
  (await request(app.http).post(`/api/rollouts/${id}/${action}`).set(bearer(token))).status;

/** The rollout's audit rows as an unscoped reader reads them, oldest first. */
const auditOf = async (token: string, id: string) => {
  await app.audit.flush();
  const res = await request(app.http).get('/api/audit?limit=100').set(bearer(token));
  expect(res.status).toBe(200);
  return (
    res.body as {
      items: { action: string; principal: string; rollout_id: string | null; detail: { reason?: string } }[];
    }
  ).items
    .filter((r) => r.rollout_id === id)
    .reverse();
};

describe('a rollout reaching a site the portal hands to another company', () => {
  let both = '';
  let kept = '';

  it('is paused by the driver at its next tick, as one of its halts (its event and audit row), while a rollout on a kept site goes on', async () => {
    both = await create(ACME_OPS, [GATE, FIELD], ['handover-gate-01', 'handover-field-01']);
    kept = await create(ACME_OPS, [FIELD], ['handover-field-02']);
    await app.rollouts.driver.tick();
    expect((await rolloutRow(both)).state).toBe('active');

    await handOver(GATE);
    await app.rollouts.driver.tick();
    expect(await rolloutRow(both)).toEqual({
      state: 'paused',
      reason: REASON,
      site_companies: [`${FIELD}/${ACME}`, `${GATE}/${ACME}`].sort(),
    });
    expect((await rolloutRow(kept)).state).toBe('active');

    const { rows: events } = await sql<{ kind: string; actor: string; detail: string | null }>`
      SELECT kind, actor, detail FROM device_gateway.rollout_events WHERE rollout_id = ${both}::uuid
      ORDER BY event_id DESC LIMIT 1`.execute(owner);
    expect(events[0]).toEqual({
      kind: 'paused',
      actor: expect.stringMatching(/^driver [0-9a-f]{16} term [0-9]+$/),
      detail: 'a site it reaches was handed to another company',
    });
    // Audited as `driver`, with the reason, and stamped with the rollout's companies (the creation's).
    const rows = await auditOf(olga, both);
    expect(rows.map((r) => `${r.action} by ${r.principal}`)).toEqual([
      'rollout.created by key:acme-ops',
      'rollout.paused by driver',
    ]);
    expect(rows[1]!.detail.reason).toBe(REASON);
    const { rows: stamps } = await sql<{ action: string; site_companies: string[] }>`
      SELECT action, site_companies FROM device_gateway.audit_events WHERE rollout_id = ${both}::uuid
      ORDER BY id`.execute(owner);
    expect(stamps).toEqual([
      { action: 'rollout.created', site_companies: (await rolloutRow(both)).site_companies },
      { action: 'rollout.paused', site_companies: (await rolloutRow(both)).site_companies },
    ]);
    // Neither company's operators see it or its rows; Acme still sees its rollout on the field.
    for (const key of [ACME_OPS, BOREALIS_OPS]) {
      expect((await request(app.http).get(`/api/rollouts/${both}`).set(bearer(key))).status).toBe(404);
      expect(await auditOf(key, both)).toEqual([]);
    }
    expect((await request(app.http).get(`/api/rollouts/${kept}`).set(bearer(ACME_OPS))).status).toBe(200);
    // Borealis is told why it cannot name the rollout that holds its gate's device.
    const refused = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(BOREALIS_OPS))
      .send({ selector: { site_ids: [GATE] }, settings: { reporting_interval_s: 92 }, plan });
    expect(refused.status).toBe(409);
    expect(JSON.stringify(refused.body)).not.toContain(both);
    expect((refused.body as { detail: string }).detail).toMatch(
      /was created while one of its sites belonged to another company .*an unscoped operator can pause, cancel or roll it back/,
    );
  });

  it("an unscoped operator's resume stands; a further handover pauses it (and the field's rollout) again", async () => {
    expect(both).not.toBe('');
    expect(await act(olga, both, 'resume')).toBe(200);
    await app.rollouts.driver.tick();
    await app.rollouts.driver.tick();
    expect((await rolloutRow(both)).state).toBe('active');

    await handOver(FIELD);
    await app.rollouts.driver.tick();
    expect((await rolloutRow(both)).state).toBe('paused');
    expect(await rolloutRow(kept)).toMatchObject({ state: 'paused', reason: REASON });
    expect((await auditOf(olga, both)).map((r) => `${r.action} by ${r.principal}`)).toEqual([
      'rollout.created by key:acme-ops',
      'rollout.paused by driver',
      `rollout.resumed by user:${opsUsers.olga.sub}`,
      'rollout.paused by driver',
    ]);
    // The admin's cancel is audited with the rollout's companies: still no row of it for Borealis.
    expect(await act(olga, both, 'cancel')).toBe(200);
    expect(await act(olga, kept, 'cancel')).toBe(200);
    expect(await auditOf(BOREALIS_OPS, both)).toEqual([]);
    expect(await auditOf(BOREALIS_OPS, kept)).toEqual([]);
  });

  it('the login pauses nothing for a replica that does not hold the lease; the holder does', async () => {
    const lot = await create(ACME_OPS, [LOT], ['handover-lot-01']);
    await handOver(LOT);
    const client = new pg.Client({ connectionString: gatewayLoginUrl(gw.database.url) });
    await client.connect();
    try {
      const { rows } = await client.query<{ ids: string[] }>(
        `SELECT device_gateway.rollout_pause_handed_over('0123456789abcdef')::text[] AS ids`,
      );
      expect(rows[0]!.ids).toEqual([]);
      expect((await rolloutRow(lot)).state).toBe('active');
      // Nor can it write the column that makes a resume stand.
      await expect(
        client.query(`UPDATE device_gateway.rollouts SET handed_over = site_companies`),
      ).rejects.toMatchObject({ code: '42501' });
    } finally {
      await client.end();
    }
    await app.rollouts.driver.tick();
    expect((await rolloutRow(lot)).state).toBe('paused');
    expect(await act(olga, lot, 'cancel')).toBe(200);
  });

  it("a rollout its operator paused stays paused through the handover; an unscoped operator's resume is met by the driver's pause once", async () => {
    const yard = await create(ACME_OPS, [YARD], ['handover-yard-01']);
    expect(await act(ACME_OPS, yard, 'pause')).toBe(200);
    await handOver(YARD);
    await app.rollouts.driver.tick();
    expect(await rolloutRow(yard)).toMatchObject({ state: 'paused', reason: 'paused by an operator' });
    expect(await act(olga, yard, 'resume')).toBe(200);
    await app.rollouts.driver.tick();
    expect(await rolloutRow(yard)).toMatchObject({ state: 'paused', reason: REASON });
    expect(await act(olga, yard, 'resume')).toBe(200);
    await app.rollouts.driver.tick();
    expect((await rolloutRow(yard)).state).toBe('active');
    expect(await act(olga, yard, 'cancel')).toBe(200);
  });
});

describe("an audit row about a rollout that brings no companies (0043's stamp)", () => {
  it("takes the rollout's pair for each site the rollout keeps one for, and today's company for any other site", async () => {
    const id = await create(ACME_OPS, [HQ], ['acme-hq-hvac-01']);
    const { rows: stamped } = await sql<{ site_companies: string[] }>`
      SELECT site_companies FROM device_gateway.rollouts WHERE rollout_id = ${id}::uuid`.execute(owner);
    expect(stamped[0]!.site_companies).toEqual([`${HQ}/${ACME}`]);
    // A row about it naming the HQ and the gate (Borealis's now), written as the rollouts' rows are (no pairs).
    await recordAudit(owner, { principal: DRIVER, requestId: 'handover-stamp' }, 'rollout.paused', {
      rolloutId: id,
      siteIds: [HQ, GATE],
    });
    // A row naming a rollout that does not exist takes today's companies.
    await recordAudit(owner, { principal: DRIVER, requestId: 'handover-stamp-none' }, 'rollout.paused', {
      rolloutId: '00000000-0000-4000-8000-000000000043',
      siteIds: [GATE],
    });
    const { rows } = await sql<{ request_id: string; site_companies: string[] }>`
      SELECT request_id, site_companies FROM device_gateway.audit_events
      WHERE request_id IN ('handover-stamp', 'handover-stamp-none') ORDER BY request_id`.execute(owner);
    expect(rows).toEqual([
      { request_id: 'handover-stamp', site_companies: [`${GATE}/${BOREALIS}`, `${HQ}/${ACME}`].sort() },
      { request_id: 'handover-stamp-none', site_companies: [`${GATE}/${BOREALIS}`] },
    ]);
    expect(await act(olga, id, 'cancel')).toBe(200);
  });
});
