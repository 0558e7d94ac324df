// One site id across the platform (issue 42 §1, design §3.2): the gateway reads the portal's sites through
// device_gateway.platform_sites() with every reload; a device at a site the platform does not know is refused at
// load (and the reload says so); the demo seed is on the portal's ids; sites carry an IANA time zone, checked at
// read; a principal limited to companies sees their sites only; unknownSite() is 404 problem+json. A real
// PostgreSQL with the whole platform's migrations, the portal's demo seed and a key file of named keys only.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { compileValidator, gatewayPublicConfigSchema, validateProblemDocument } from '@platform/contracts';
import {
  demoCompanies,
  demoSites as portalSites,
  enterpriseMigrations,
  seedEnterprise,
} from '@platform/enterprise-db';
import { addRoutes, createDb, createHttpApp, createLogger, finishHttpApp } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import { buildApp, type GatewayApp } from '../src/app.js';
import { recordAudit } from '../src/audit/writer.js';
import { Principal } from '../src/auth/principal.js';
import { loadGatewayConfig, readApiKeys } from '../src/config.js';
import { issueCredential } from '../src/db/credential-repository.js';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import { demoSites as gatewaySeedSites, seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import type { GatewayReloadSummary } from '../src/registry-loader.js';
import { SiteCatalogue, unknownSite } from '../src/sites/catalogue.js';
import { loadSites } from '../src/sites/repository.js';

jest.setTimeout(120_000);

const ADMIN = 'sites-fleet-admin-key-0123456789';
const ACME_OPERATOR = 'sites-acme-operator-key-0123456789';
const BOREALIS_OPERATOR = 'sites-borealis-operator-key-0123456789';
const ACME = demoCompanies.acme.id;
const BOREALIS = demoCompanies.borealis.id;
const HQ = portalSites.acmeHq.id;
const TOWER = portalSites.borealisTower.id;
/** A site id no portal row has. */
const NOWHERE = '5e000000-0000-4000-8000-00000000dead';
const STRAY = 'stray-sensor-01';

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let reader: Kysely<GatewayDatabase>;
let app: GatewayApp;
let summaryAtStart: GatewayReloadSummary;
const logLines: Record<string, unknown>[] = [];

const bearer = (key: string) => ({ Authorization: `Bearer ${key}` });
const acmeSiteIds = Object.values(portalSites)
  .filter((s) => s.companyId === ACME)
  .map((s) => s.id)
  .sort();

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [enterpriseMigrations, gatewayMigrations] });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await seedEnterprise(owner);
  await seedDevices(owner);
  await owner
    .insertInto('device_gateway.device_registry')
    .values({
      device_id: STRAY,
      site_id: NOWHERE,
      name: 'A sensor at a site the portal does not know',
      model: 'aq-200',
      desired_settings: '{}',
    })
    .execute();
  const dir = mkdtempSync(join(tmpdir(), 'people-sites-keys-'));
  const keyFile = join(dir, 'keys');
  // Named keys only: no anonymous key at all (issue 42 §2).
  writeFileSync(
    keyFile,
    [
      `name=fleet-admin role=admin key=${ADMIN}`,
      `name=acme-operator role=operator companies=${ACME} key=${ACME_OPERATOR}`,
      `name=borealis-operator role=operator companies=${BOREALIS} key=${BOREALIS_OPERATOR}`,
    ].join('\n'),
  );
  const config = loadGatewayConfig({
    DATABASE_URL: gatewayLoginUrl(database.url),
    GATEWAY_API_KEYS_FILE: keyFile,
    GATEWAY_CLUSTER_BUS: 'false',
    GATEWAY_DELIVERY_RECORD: 'false',
    GATEWAY_ROLLOUT_DRIVER: 'false',
  });
  const keys = readApiKeys(config);
  reader = createDb<GatewayDatabase>(config.database.url, { max: 2, logger: { warn: () => undefined } });
  const stream = new PassThrough();
  stream.on('data', (chunk: Buffer) => {
    for (const line of chunk.toString('utf8').split('\n'))
      if (line.trim() !== '') logLines.push(JSON.parse(line) as Record<string, unknown>);
  });
  app = buildApp({
    config,
    logger: createLogger({ service: 'people-sites-test', level: 'info', stream }),
    db: reader,
    apiKeys: () => keys,
  });
  summaryAtStart = await app.service.reload();
});

afterAll(async () => {
  await app.rollouts.driver.stop();
  app.rollouts.assignments.stop();
  await reader.destroy();
  await owner.destroy();
  await database.drop();
});

/** Log lines with this message logged since `from` (an index into logLines). */
const logged = (message: string, from = 0) => logLines.slice(from).filter((l) => l.message === message);

describe('sites: one id across the platform', () => {
  it("the gateway's demo seed is on the portal's site ids, and every seeded device loads", async () => {
    for (const [name, id] of Object.entries(gatewaySeedSites))
      expect(id).toBe(portalSites[name as keyof typeof portalSites].id);
    const rows = await owner
      .selectFrom('device_gateway.device_registry')
      .select(['device_id', 'site_id', 'enabled'])
      .where('device_id', '!=', STRAY)
      .execute();
    const portalIds = new Set<string>(Object.values(portalSites).map((s) => s.id));
    expect(rows.length).toBeGreaterThan(0);
    for (const r of rows) {
      expect(portalIds.has(r.site_id)).toBe(true);
      // Enabled devices are served; a disabled one is answered as unknown (design §3.2), not refused.
      expect(app.state.hasDevice(r.device_id)).toBe(r.enabled);
    }
    expect(summaryAtStart.rejected).toEqual([{ deviceId: STRAY, reason: 'site unknown to the platform' }]);
    // The names say where: acme-hq-* at Acme HQ, borealis-tower-* at Borealis Tower.
    for (const r of rows.filter((d) => d.device_id.startsWith('acme-hq-'))) expect(r.site_id).toBe(HQ);
    for (const r of rows.filter((d) => d.device_id.startsWith('borealis-tower-')))
      expect(r.site_id).toBe(TOWER);
  });

  it('a device at a site the platform does not know is refused at load: in the summary, the log, nowhere else', async () => {
    const key = await issueCredential(owner, STRAY);
    const from = logLines.length;
    const summary = await app.service.reload();
    expect(summary.rejected).toContainEqual({ deviceId: STRAY, reason: 'site unknown to the platform' });
    expect(app.state.hasDevice(STRAY)).toBe(false);
    // Its key is not loaded either: a refused device holds no DTLS session.
    expect(app.registry.credentials.lookupPsk(key.identity)).toBeUndefined();
    expect(logged('registry rows refused: site unknown to the platform', from)).toEqual([
      expect.objectContaining({ level: 'warn', devices: 1, device_ids: [STRAY] }),
    ]);
    // Over HTTP: the reload answers 200 (the rest of the registry serves) and its log line counts the refusal.
    const reload = await request(app.http).post('/api/reload-registry').set(bearer(ADMIN));
    expect(reload.status).toBe(200);
    expect(logged('registry reloaded', from)).toContainEqual(expect.objectContaining({ rejected: 1 }));
    expect((await request(app.http).get(`/api/devices/${STRAY}`).set(bearer(ADMIN))).status).toBe(404);
  });

  it('once the portal has the site, the next reload places the device there (checked at every reload)', async () => {
    await sql`INSERT INTO enterprise.sites (id, company_id, name, timezone)
              VALUES (${NOWHERE}, ${ACME}, 'Acme annex', 'America/Chicago')`.execute(owner);
    try {
      const summary = await app.service.reload();
      expect(summary.rejected.map((r) => r.deviceId)).not.toContain(STRAY);
      expect(app.state.hasDevice(STRAY)).toBe(true);
    } finally {
      await sql`DELETE FROM enterprise.sites WHERE id = ${NOWHERE}`.execute(owner);
      await app.service.reload();
    }
    expect(app.state.hasDevice(STRAY)).toBe(false);
  });

  it("the gateway's login reads the portal's sites only through platform_sites(), four columns", async () => {
    await expect(sql`SELECT id FROM enterprise.sites`.execute(reader)).rejects.toMatchObject({
      code: '42501',
    });
    const { rows } = await sql<Record<string, unknown>>`
      SELECT * FROM device_gateway.platform_sites() ORDER BY site_id`.execute(reader);
    expect(Object.keys(rows[0]!).sort()).toEqual(['company_id', 'name', 'site_id', 'timezone']);
    expect(rows.map((r) => r.site_id)).toEqual(
      Object.values(portalSites)
        .map((s) => s.id)
        .sort(),
    );
  });

  it('a gateway database without the enterprise schema checks no site (a standalone gateway)', async () => {
    const alone = await createTestDatabase({ migrations: [gatewayMigrations] });
    const login = createDb<GatewayDatabase>(gatewayLoginUrl(alone.url), {
      max: 1,
      logger: { warn: () => undefined },
    });
    try {
      const { catalogue } = await loadSites(login);
      expect(catalogue.platform).toBe(false);
      expect(catalogue.size).toBe(0);
      expect(catalogue.knows(NOWHERE)).toBe(true);
    } finally {
      await login.destroy();
      await alone.drop();
    }
  });
});

describe('sites: IANA time zones', () => {
  it("each site carries the portal's zone", () => {
    for (const s of Object.values(portalSites))
      expect(app.registry.sites.site(s.id)?.timezone).toBe(s.timezone);
  });

  it('a zone this runtime does not know is refused at read (null, counted in the log); the site still exists', async () => {
    const company = 'c0000000-0000-4000-8000-0000000000c3';
    const bad = ['Mars/Phobos', 'europe/london', '+01:00', ''];
    await sql`INSERT INTO enterprise.companies (id, name) VALUES (${company}, 'Zone test')`.execute(owner);
    const ids = bad.map((_, i) => `5e000000-0000-4000-8000-0000000c30${i}0`);
    for (const [i, zone] of bad.entries())
      await sql`INSERT INTO enterprise.sites (id, company_id, name, timezone)
                VALUES (${ids[i]}, ${company}, ${`Zone ${i}`}, ${zone})`.execute(owner);
    try {
      const from = logLines.length;
      await app.service.reload();
      for (const id of ids) {
        expect(app.registry.sites.knows(id)).toBe(true);
        expect(app.registry.sites.site(id)?.timezone).toBeNull();
      }
      expect(logged('platform sites without an IANA time zone', from)).toEqual([
        expect.objectContaining({ level: 'warn', sites: bad.length }),
      ]);
      // A site without a zone is still a site: only the stray device is refused, as before.
      expect(logged('registry rows refused: site unknown to the platform', from)).toEqual([
        expect.objectContaining({ devices: 1, device_ids: [STRAY] }),
      ]);
    } finally {
      await sql`DELETE FROM enterprise.sites WHERE company_id = ${company}`.execute(owner);
      await sql`DELETE FROM enterprise.companies WHERE id = ${company}`.execute(owner);
      await app.service.reload();
    }
  });
});

/** A user principal (an operator) limited to these sites and companies. */
const limitedTo = (scope: { sites?: string[]; companies?: string[] }) =>
  new Principal({ kind: 'user', id: 'user:scoped', name: 'scoped', role: 'operator', ...scope });

describe('sites: company scope', () => {
  const acme = limitedTo({ companies: [ACME] });

  it("a principal limited to a company sees that company's sites, and only them", () => {
    const sites = app.registry.sites;
    expect(acme.siteIds(sites)).toEqual(acmeSiteIds);
    expect(acme.seesSite(HQ, sites)).toBe(true);
    expect(acme.seesSite(TOWER, sites)).toBe(false);
    expect(acme.seesSite(NOWHERE, sites)).toBe(false);
    // Sites and companies together: the union.
    const both = limitedTo({ sites: [TOWER], companies: [ACME] });
    expect(both.siteIds(sites)).toEqual([...acmeSiteIds, TOWER].sort());
    // A company scope on a gateway without the platform's sites sees nothing (it cannot tell a company's sites).
    expect(acme.siteIds(SiteCatalogue.empty)).toEqual([]);
    expect(acme.seesSite(HQ, SiteCatalogue.empty)).toBe(false);
  });

  it("siteCondition filters a real query to the company's devices; unscoped matches all", async () => {
    const devicesSeen = async (p: Principal) =>
      (
        await reader
          .selectFrom('device_gateway.device_registry as r')
          .select(['r.device_id', 'r.site_id'])
          .where(p.siteCondition(sql.ref('r.site_id'), app.registry.sites))
          .orderBy('r.device_id')
          .execute()
      ).map((r) => r.device_id);
    const all = await devicesSeen(
      new Principal({ kind: 'user', id: 'user:all', name: 'all', role: 'viewer' }),
    );
    const mine = await devicesSeen(acme);
    expect(mine.length).toBeGreaterThan(0);
    expect(mine.every((d) => d.startsWith('acme-'))).toBe(true);
    expect(all.filter((d) => d.startsWith('acme-'))).toEqual(mine);
    expect(all.some((d) => d.startsWith('borealis-'))).toBe(true);
    // A company the platform does not know: nothing, not everything.
    const stranger = limitedTo({ companies: ['c0000000-0000-4000-8000-00000000ffff'] });
    expect(await devicesSeen(stranger)).toEqual([]);
  });

  it("GET /api/audit with a company-limited key: only rows of the company's sites", async () => {
    const tool = new Principal({
      kind: 'api_key',
      id: 'key:sites-tool',
      name: 'sites-tool',
      role: 'operator',
    });
    await recordAudit(reader, { principal: tool }, 'settings.notified', { siteIds: [HQ] }, { v: 1 });
    await recordAudit(reader, { principal: tool }, 'settings.notified', { siteIds: [TOWER] }, { v: 2 });
    const read = async (key: string) => {
      const res = await request(app.http).get('/api/audit?principal=key:sites-tool').set(bearer(key));
      expect(res.status).toBe(200);
      return (res.body as { items: { site_ids: string[] }[] }).items.map((i) => i.site_ids);
    };
    expect(await read(ACME_OPERATOR)).toEqual([[HQ]]);
    expect(await read(BOREALIS_OPERATOR)).toEqual([[TOWER]]);
    expect(await read(ADMIN)).toEqual([[TOWER], [HQ]]);
  });
});

describe('sites: the answer for a site the caller may not name', () => {
  it('unknown and out-of-scope read the same: 404 unknown_site, problem+json, no site id echoed', async () => {
    const logger = createLogger({ service: 'people-sites-edge', level: 'error' });
    const http = createHttpApp({ logger });
    // What a route does with a site id from a request: the caller's scope and the platform's sites decide.
    addRoutes(http, [
      {
        method: 'GET',
        path: '/sites/:site_id',
        handler: (req, res) => {
          const id = String(req.params.site_id);
          const sites = app.registry.sites;
          const acme = limitedTo({ companies: [ACME] });
          if (!sites.site(id) || !acme.seesSite(id, sites)) throw unknownSite();
          res.json({ site_id: id });
        },
      },
    ]);
    finishHttpApp(http, logger);
    expect((await request(http).get(`/sites/${HQ}`)).status).toBe(200);
    const answers = [];
    for (const id of [TOWER, NOWHERE]) {
      const res = await request(http).get(`/sites/${id}`).set('X-Request-Id', 'same');
      expect(res.status).toBe(404);
      expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(validateProblemDocument(res.body).ok).toBe(true);
      expect(res.body.code).toBe('unknown_site');
      expect(res.text).not.toContain(id);
      answers.push(res.text);
    }
    expect(answers[0]).toBe(answers[1]);
  });
});

describe('sites: /api/config with named keys only', () => {
  it('answers what its schema says: no anonymous key, three named keys, no issuer', async () => {
    const res = await request(app.http).get('/api/config').set(bearer(ADMIN));
    expect(res.status).toBe(200);
    expect(compileValidator(gatewayPublicConfigSchema)(res.body)).toMatchObject({ ok: true });
    expect(res.body.api_keys).toEqual({ count: 0, fingerprints: [] });
    expect((res.body.named_api_keys as { name: string }[]).map((k) => k.name)).toEqual([
      'fleet-admin',
      'acme-operator',
      'borealis-operator',
    ]);
    expect(res.body.oidc).toBeNull();
    for (const key of [ADMIN, ACME_OPERATOR, BOREALIS_OPERATOR]) expect(res.text).not.toContain(key);
  });
});
