// Named principals on /api (issue 42 §2, §3, §4): real access tokens from the test kit's issuer (the operations
// client), named keys from a real key file, the specification's anonymous key, the role check on every route, the
// audit rows of the changes this step audits, and the audit table's append-only rights, on a real PostgreSQL with
// the whole platform's migrations and the demo seed.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { demoCompanies, demoSites, enterpriseMigrations, seedEnterprise } from '@platform/enterprise-db';
import { createDb, createLogger } from '@platform/service-kit';
import {
  createTestDatabase,
  OPERATIONS_CLIENT,
  startIssuer,
  type Issuer,
  type TestDatabase,
} from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import { buildApp, type GatewayApp } from '../src/app.js';
import { recordAudit } from '../src/audit/writer.js';
import { Principal } from '../src/auth/principal.js';
import { loadGatewayConfig, readApiKeys } from '../src/config.js';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';

jest.setTimeout(120_000);

const ANON = 'people-anonymous-key-0123456789';
const HQ_OPERATOR = 'people-hq-operator-key-0123456789';
const SCOPED_ADMIN = 'people-scoped-admin-key-0123456789';
const VIEWER = 'people-viewer-key-0123456789';
const HQ = demoSites.acmeHq.id;
const WAREHOUSE = demoSites.acmeWarehouse.id;

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let reader: Kysely<GatewayDatabase>;
let issuer: Issuer;
let app: GatewayApp;

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` });
const opsRole = (role: string) => ({ resource_access: { [OPERATIONS_CLIENT]: { roles: [role] } } });

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [enterpriseMigrations, gatewayMigrations] });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await seedEnterprise(owner);
  await seedDevices(owner);
  issuer = await startIssuer({ clientId: OPERATIONS_CLIENT });
  const dir = mkdtempSync(join(tmpdir(), 'people-keys-'));
  const keyFile = join(dir, 'keys');
  writeFileSync(
    keyFile,
    [
      '# the specification’s anonymous key',
      ANON,
      `name=hq-tool role=operator sites=${HQ} key=${HQ_OPERATOR}`,
      `name=acme-admin role=admin companies=${demoCompanies.acme.id} key=${SCOPED_ADMIN}`,
      `name=dashboard role=viewer key=${VIEWER}`,
    ].join('\n'),
  );
  const config = loadGatewayConfig({
    DATABASE_URL: gatewayLoginUrl(database.url),
    GATEWAY_API_KEYS_FILE: keyFile,
    GATEWAY_CLUSTER_BUS: 'false',
    GATEWAY_DELIVERY_RECORD: 'false',
    GATEWAY_OIDC_ISSUER_URL: issuer.issuerUrl,
    // A rotation is seen at the first token under the new kid (production: at most every 30 s).
    GATEWAY_OIDC_JWKS_COOLDOWN_MS: '0',
  });
  const keys = readApiKeys(config);
  reader = createDb<GatewayDatabase>(config.database.url, { max: 2, logger: { warn: () => undefined } });
  app = buildApp({
    config,
    logger: createLogger({ service: 'people-auth-test', level: 'error' }),
    db: reader,
    apiKeys: () => keys,
  });
  await app.service.reload();
});

afterAll(async () => {
  await app.rollouts.driver.stop();
  app.rollouts.assignments.stop();
  await reader.destroy();
  await owner.destroy();
  await issuer.stop();
  await database.drop();
});

describe('people: access tokens of the operations client', () => {
  it('an operator token lists the fleet; a viewer token cannot notify (403), an operator can', async () => {
    const operator = await issuer.sign(opsRole('operator'));
    expect((await request(app.http).get('/api/devices').set(bearer(operator))).status).toBe(200);
    const viewer = await issuer.sign(opsRole('viewer'));
    const body = { device_id: 'acme-hq-hvac-01', settings: { reporting_interval_s: 120 } };
    const refused = await request(app.http).post('/api/notify-settings').set(bearer(viewer)).send(body);
    expect(refused.status).toBe(403);
    expect(refused.body.code).toBe('forbidden');
    expect(
      (await request(app.http).post('/api/notify-settings').set(bearer(operator)).send(body)).status,
    ).toBe(200);
  });

  it.each([
    ['expired', () => issuer.sign(opsRole('admin'), { expiresInS: -120 })],
    ['issued to another client (azp, aud)', () => issuer.sign({ ...opsRole('admin'), azp: 'x', aud: 'x' })],
    ['malformed scope', () => issuer.sign({ ...opsRole('admin'), fleet_sites: ['not-a-uuid'] })],
    ['alg none', () => issuer.signUnsafe('alg-none', opsRole('admin'))],
  ])('refuses a token %s with 401 invalid_token', async (_what, token) => {
    const res = await request(app.http)
      .get('/api/devices')
      .set(bearer(await token()));
    expect(res.status).toBe(401);
    expect(res.headers['www-authenticate']).toContain('invalid_token');
  });

  it('refuses a token of another issuer (401) and one without a fleet role (403)', async () => {
    const stranger = await startIssuer({ clientId: OPERATIONS_CLIENT });
    try {
      const foreign = await stranger.sign(opsRole('admin'));
      expect((await request(app.http).get('/api/devices').set(bearer(foreign))).status).toBe(401);
    } finally {
      await stranger.stop();
    }
    const noRole = await issuer.sign({ resource_access: { [OPERATIONS_CLIENT]: { roles: ['other'] } } });
    const res = await request(app.http).get('/api/devices').set(bearer(noRole));
    expect(res.status).toBe(403);
  });

  it('accepts a token signed with a key the realm published after start (JWKS rotation)', async () => {
    const kid = await issuer.addKey('RS256');
    const token = await issuer.sign(opsRole('viewer'), { kid });
    expect((await request(app.http).get('/api/devices').set(bearer(token))).status).toBe(200);
    // A second rotation, the first new key withdrawn: the next key is found as well.
    issuer.removeKey(kid);
    const next = await issuer.sign(opsRole('viewer'), { kid: await issuer.addKey('RS256') });
    expect((await request(app.http).get('/api/devices').set(bearer(next))).status).toBe(200);
  });

  it('an operator limited to one site may not reload (admin only): 403, nothing audited', async () => {
    const oscar = await issuer.opsToken('oscar');
    const before = await auditCount();
    const res = await request(app.http).post('/api/reload-registry').set(bearer(oscar));
    expect(res.status).toBe(403);
    expect(await auditCount()).toBe(before);
  });

  it('an admin token reloads, and the audit names the person', async () => {
    const olga = await issuer.opsToken('olga');
    const res = await request(app.http)
      .post('/api/reload-registry')
      .set(bearer(olga))
      .set('X-Request-Id', 'olga-1');
    expect(res.status).toBe(200);
    const row = await waitForAudit('olga-1');
    expect(row).toMatchObject({
      principal: 'user:0b0a11ce-0000-4000-8000-0000000001a0',
      principal_kind: 'user',
      principal_name: 'olga',
      role: 'admin',
      action: 'registry.reloaded',
    });
  });
});

describe('people: named API keys and the anonymous key', () => {
  it('the anonymous key still does everything it did: config, reload (audited as api-key)', async () => {
    const config = await request(app.http).get('/api/config').set(bearer(ANON));
    expect(config.status).toBe(200);
    expect(config.body.api_keys.count).toBe(1);
    const named = config.body.named_api_keys as { name: string; role: string; fingerprint: string }[];
    expect(named.map((k) => [k.name, k.role])).toEqual([
      ['hq-tool', 'operator'],
      ['acme-admin', 'admin'],
      ['dashboard', 'viewer'],
    ]);
    expect(JSON.stringify(config.body)).not.toContain(HQ_OPERATOR);
    const reload = await request(app.http)
      .post('/api/reload-registry')
      .set(bearer(ANON))
      .set('X-Request-Id', 'anon-1');
    expect(reload.status).toBe(200);
    expect(await waitForAudit('anon-1')).toMatchObject({
      principal: 'api-key',
      principal_kind: 'anonymous_key',
    });
  });

  it('a named key is its principal: a viewer reads, may not notify; scoped keys may not reload or read config', async () => {
    expect((await request(app.http).get('/api/devices').set(bearer(VIEWER))).status).toBe(200);
    expect(
      (
        await request(app.http)
          .post('/api/notify-settings')
          .set(bearer(VIEWER))
          .send({ device_id: 'acme-hq-hvac-01', settings: { reporting_interval_s: 60 } })
      ).status,
    ).toBe(403);
    // An admin limited to a company: fleet-wide actions are refused whatever the role.
    expect((await request(app.http).post('/api/reload-registry').set(bearer(SCOPED_ADMIN))).status).toBe(403);
    expect((await request(app.http).get('/api/config').set(bearer(SCOPED_ADMIN))).status).toBe(403);
    expect((await request(app.http).get('/api/config').set(bearer(HQ_OPERATOR))).status).toBe(403);
  });

  it('a wrong key is 401 and a key of the file is not accepted with a changed byte', async () => {
    expect(
      (
        await request(app.http)
          .get('/api/devices')
          .set(bearer(`${VIEWER}x`))
      ).status,
    ).toBe(401);
  });
});

describe('people: GET /api/audit', () => {
  it('an unscoped reader sees every row; a reader limited to a site only rows (and site ids) of its site', async () => {
    const tool = new Principal({ kind: 'api_key', id: 'key:seed-tool', name: 'seed-tool', role: 'operator' });
    await recordAudit(
      reader,
      { principal: tool },
      'settings.notified',
      { siteIds: [HQ], deviceId: 'acme-hq-hvac-01' },
      { v: 1 },
    );
    await recordAudit(
      reader,
      { principal: tool },
      'rollout.created',
      { siteIds: [HQ, WAREHOUSE] },
      { selector: { site_ids: [HQ, WAREHOUSE] } },
    );
    await recordAudit(
      reader,
      { principal: tool },
      'settings.notified',
      { siteIds: [WAREHOUSE], deviceId: 'acme-wh-door-01' },
      { v: 2 },
    );

    const all = await request(app.http).get('/api/audit?principal=key:seed-tool').set(bearer(ANON));
    expect(all.status).toBe(200);
    expect(all.body.items).toHaveLength(3);

    const scoped = await request(app.http).get('/api/audit?principal=key:seed-tool').set(bearer(HQ_OPERATOR));
    expect(scoped.status).toBe(200);
    const items = scoped.body.items as { action: string; site_ids: string[]; detail: object }[];
    expect(items.map((i) => i.action)).toEqual(['rollout.created', 'settings.notified']);
    expect(items.every((i) => i.site_ids.length === 1 && i.site_ids[0] === HQ)).toBe(true);
    // The rollout also reached the warehouse: its selector is not shown to a reader of Acme HQ only.
    expect(items[0]!.detail).toEqual({});
    expect(JSON.stringify(scoped.body)).not.toContain(WAREHOUSE);
  });

  it('pages by cursor and filters by device; a viewer may not read it (403); a bad query is 400', async () => {
    const first = await request(app.http).get('/api/audit?limit=1').set(bearer(ANON));
    expect(first.body.items).toHaveLength(1);
    expect(typeof first.body.next_cursor).toBe('string');
    const second = await request(app.http)
      .get(`/api/audit?limit=1&cursor=${first.body.next_cursor as string}`)
      .set(bearer(ANON));
    expect(second.body.items[0].id).not.toBe(first.body.items[0].id);
    const byDevice = await request(app.http).get('/api/audit?device_id=acme-wh-door-01').set(bearer(ANON));
    expect((byDevice.body.items as { device_id: string }[]).map((i) => i.device_id)).toEqual([
      'acme-wh-door-01',
    ]);
    expect((await request(app.http).get('/api/audit').set(bearer(VIEWER))).status).toBe(403);
    const bad = await request(app.http).get('/api/audit?since=yesterday&cursor=zz').set(bearer(ANON));
    expect(bad.status).toBe(400);
    expect(bad.body.code).toBe('invalid_query');
  });

  it('the gateway login may insert and read audit rows but never change, delete, truncate or back-date them', async () => {
    for (const statement of [
      sql`UPDATE device_gateway.audit_events SET principal = 'someone-else'`,
      sql`DELETE FROM device_gateway.audit_events`,
      sql`TRUNCATE device_gateway.audit_events`,
      sql`INSERT INTO device_gateway.audit_events (at, principal, principal_kind, action) VALUES (now() - interval '1 year', 'x', 'driver', 'x')`,
    ]) {
      await expect(statement.execute(reader)).rejects.toMatchObject({ code: '42501' });
    }
    // Not even the owner changes a row: the table is append-only for everyone.
    await expect(
      sql`UPDATE device_gateway.audit_events SET principal = 'x'`.execute(owner),
    ).rejects.toMatchObject({
      code: '42501',
    });
    await expect(sql`DELETE FROM device_gateway.audit_events`.execute(owner)).rejects.toMatchObject({
      code: '42501',
    });
  });
});

async function auditCount(): Promise<number> {
  const { rows } = await sql<{
    n: number;
  }>`SELECT count(*)::int AS n FROM device_gateway.audit_events`.execute(owner);
  return rows[0]!.n;
}

/** The reload's row is written once its answer finished: waited for, within 5 s. */
async function waitForAudit(requestId: string): Promise<Record<string, unknown>> {
  const deadline = Date.now() + 5000;
  for (;;) {
    const { rows } = await sql<Record<string, unknown>>`
      SELECT * FROM device_gateway.audit_events WHERE request_id = ${requestId}`.execute(owner);
    if (rows.length > 0) return rows[0]!;
    if (Date.now() > deadline) throw new Error(`no audit row for ${requestId}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
