import {
  API_LOGIN,
  API_ROLE,
  AUTHENTICATOR,
  devRolePasswords,
  enterpriseMigrations,
  PORTAL_ANON,
  PORTAL_ROLE,
  urlForLogin,
} from '@platform/enterprise-db';
import { createDb, sqlState } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import request from 'supertest';
import { issueCredential, revokeDevice, revokeIdentity } from '../src/db/credential-repository.js';
import { GATEWAY_LOGIN_ROLE, gatewayMigrations } from '../src/db/migrations.js';
import { seedDevices } from '../src/db/seed.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';

const auth = { Authorization: `Bearer ${API_KEYS[0]}` };
const DEVICE = 'acme-hq-hvac-01';
const OTHER = 'acme-hq-lobby-sensor-03';
const KEY_32 = Buffer.from('0123456789abcdef0123456789abcdef', 'utf8');

async function sqlStateOf(promise: Promise<unknown>): Promise<string | undefined> {
  try {
    await promise;
  } catch (err) {
    return sqlState(err);
  }
  return 'no error';
}

describe('device_credentials: who may read and write it', () => {
  let database: TestDatabase;
  let owner: Kysely<GatewayDatabase>;

  beforeAll(async () => {
    // Both owners' migrations in one database, as `npm run migrate` applies them.
    database = await createTestDatabase({ migrations: [enterpriseMigrations, gatewayMigrations] });
    owner = createDb<GatewayDatabase>(database.url, { max: 2 });
    await seedDevices(owner);
    await issueCredential(owner, DEVICE, { validDays: 30 });
  });

  afterAll(async () => {
    await owner.destroy();
    await database.drop();
  });

  async function asLogin<T>(
    url: string,
    role: string | undefined,
    run: (c: pg.Client) => Promise<T>,
  ): Promise<T> {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      if (role !== undefined) await client.query(`SET ROLE ${role}`);
      return await run(client);
    } finally {
      await client.end();
    }
  }

  const authenticatorUrl = (): string =>
    urlForLogin(database.url, AUTHENTICATOR, devRolePasswords.authenticator);
  const apiLoginUrl = (): string => urlForLogin(database.url, API_LOGIN, devRolePasswords.enterpriseApi);

  it.each([
    ['authenticator', AUTHENTICATOR, undefined],
    ['authenticator as the portal role', AUTHENTICATOR, PORTAL_ROLE],
    ['authenticator as the anonymous role', AUTHENTICATOR, PORTAL_ANON],
    ['the workflow login', API_LOGIN, undefined],
    ['the workflow login as its role', API_LOGIN, API_ROLE],
  ])('%s cannot SELECT it (42501)', async (_name, login, role) => {
    const url = login === AUTHENTICATOR ? authenticatorUrl() : apiLoginUrl();
    const state = await asLogin(url, role, (c) =>
      sqlStateOf(c.query('SELECT psk_key FROM device_gateway.device_credentials')),
    );
    expect(state).toBe('42501');
  });

  it('no role but the gateway login holds any privilege on it (superusers and pg_* aside)', async () => {
    const { rows } = await sql<{ rolname: string }>`
      SELECT r.rolname FROM pg_catalog.pg_roles r
      WHERE NOT r.rolsuper AND r.rolname NOT LIKE 'pg\\_%'
        AND (has_any_column_privilege(r.oid, 'device_gateway.device_credentials', 'SELECT, INSERT, UPDATE, REFERENCES')
          OR has_table_privilege(r.oid, 'device_gateway.device_credentials', 'DELETE, TRUNCATE, TRIGGER'))
      ORDER BY 1`.execute(owner);
    expect(rows.map((r) => r.rolname)).toEqual([GATEWAY_LOGIN_ROLE]);
    // And PUBLIC has nothing: the ACL names the owner and the gateway login only.
    const acl = await sql<{ acl: string }>`
      SELECT relacl::text AS acl FROM pg_catalog.pg_class WHERE oid = 'device_gateway.device_credentials'::regclass`.execute(
      owner,
    );
    expect(acl.rows[0]!.acl).not.toMatch(/[{,]=/);
    expect(acl.rows[0]!.acl).toContain(`${GATEWAY_LOGIN_ROLE}=r/`);
  });

  it('the gateway login reads the keys but cannot write them', async () => {
    await asLogin(loginUrl(database.url), undefined, async (c) => {
      const read = await c.query('SELECT psk_identity, psk_key FROM device_gateway.device_credentials');
      expect(read.rows).toHaveLength(1);
      expect(Buffer.isBuffer(read.rows[0].psk_key)).toBe(true);
      expect(
        await sqlStateOf(
          c.query(`INSERT INTO device_gateway.device_credentials (psk_identity, psk_key, device_id)
                   VALUES ('x-identity', '\\x00112233445566778899aabbccddeeff', '${DEVICE}')`),
        ),
      ).toBe('42501');
      expect(
        await sqlStateOf(c.query('UPDATE device_gateway.device_credentials SET revoked_at = NULL')),
      ).toBe('42501');
      expect(await sqlStateOf(c.query('DELETE FROM device_gateway.device_credentials'))).toBe('42501');
    });
  });

  it.each([
    ['a 15-byte key', { psk_key: Buffer.alloc(15, 1) }, '23514'],
    ['a 65-byte key', { psk_key: Buffer.alloc(65, 1) }, '23514'],
    ['an identity with a space', { psk_identity: 'has space' }, '23514'],
    ['an identity with a control character', { psk_identity: 'bell\u0007' }, '23514'],
    ['a non-ASCII identity', { psk_identity: 'clé' }, '23514'],
    ['a 129-character identity', { psk_identity: 'i'.repeat(129) }, '23514'],
    ['the device id as identity', { psk_identity: DEVICE }, '23514'],
    [
      'not_after before not_before',
      { not_before: '2026-02-01T00:00:00Z', not_after: '2026-01-01T00:00:00Z' },
      '23514',
    ],
    ['an unknown device', { device_id: 'no-such-device' }, '23503'],
  ])('the table refuses %s', async (_name, change, state) => {
    const row = { psk_identity: 'valid-identity-1', psk_key: KEY_32, device_id: DEVICE, ...change };
    expect(
      await sqlStateOf(owner.insertInto('device_gateway.device_credentials').values(row).execute()),
    ).toBe(state);
  });

  it('accepts 16- and 64-byte keys and a 128-character identity; refuses a duplicate identity', async () => {
    await owner
      .insertInto('device_gateway.device_credentials')
      .values([
        { psk_identity: 'edge-16', psk_key: Buffer.alloc(16, 2), device_id: DEVICE },
        { psk_identity: 'e'.repeat(128), psk_key: Buffer.alloc(64, 3), device_id: DEVICE },
      ])
      .execute();
    expect(
      await sqlStateOf(
        owner
          .insertInto('device_gateway.device_credentials')
          .values({ psk_identity: 'edge-16', psk_key: KEY_32, device_id: OTHER })
          .execute(),
      ),
    ).toBe('23505');
  });
});

describe('credentials load with the registry', () => {
  let gw: GatewayFixture;
  const invalidations: string[][] = [];

  beforeAll(async () => {
    gw = await startGateway({ load: false });
    gw.app.registry.onCredentialsChanged((ids) => invalidations.push(ids));
  });

  afterAll(async () => {
    await gw.close();
  });

  beforeEach(() => {
    invalidations.length = 0;
  });

  const store = () => gw.app.registry.credentials;

  it('a key issued before startup works after the first load, as the UTF-8 bytes of its text', async () => {
    const issued = await issueCredential(gw.owner, DEVICE, { validDays: 30 });
    const summary = await gw.app.service.reload();
    expect(summary.pskIdentities).toBe(1);
    const credential = store().lookupPsk(issued.identity);
    expect(credential?.deviceId).toBe(DEVICE);
    expect(credential?.credentialId).toBe(issued.credentialId);
    expect(credential?.key.equals(Buffer.from(issued.keyText, 'utf8'))).toBe(true);
    expect(issued.keyText).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(issued.identity).not.toBe(DEVICE);
  });

  it('POST /api/reload-registry picks up a new key; revoking it invalidates it at the next reload', async () => {
    const issued = await issueCredential(gw.owner, OTHER, { validDays: 1 });
    expect(store().lookupPsk(issued.identity)).toBeUndefined();
    expect((await request(gw.app.http).post('/api/reload-registry').set(auth)).status).toBe(200);
    expect(store().lookupPsk(issued.identity)?.deviceId).toBe(OTHER);
    expect(invalidations).toEqual([]);

    await revokeIdentity(gw.owner, issued.identity);
    // Not before the reload: the gateway serves its snapshot until then.
    expect(store().lookupPsk(issued.identity)?.deviceId).toBe(OTHER);
    const summary = await gw.app.service.reload();
    expect(summary.pskInvalidated).toBe(1);
    expect(invalidations).toEqual([[issued.credentialId]]);
    expect(store().lookupPsk(issued.identity)).toBeUndefined();
  });

  it('two keys of one device overlap; disabling the device invalidates both, enabling restores them', async () => {
    const a = await issueCredential(gw.owner, OTHER, { validDays: 10 });
    const b = await issueCredential(gw.owner, OTHER, { validDays: 20 });
    await gw.app.service.reload();
    expect(store().lookupPsk(a.identity)?.deviceId).toBe(OTHER);
    expect(store().lookupPsk(b.identity)?.deviceId).toBe(OTHER);
    invalidations.length = 0;

    await gw.owner
      .updateTable('device_gateway.device_registry')
      .set({ enabled: false })
      .where('device_id', '=', OTHER)
      .execute();
    await gw.app.service.reload();
    expect(invalidations.flat().sort()).toEqual([a.credentialId, b.credentialId].sort());
    expect(store().lookupPsk(a.identity)).toBeUndefined();

    await gw.owner
      .updateTable('device_gateway.device_registry')
      .set({ enabled: true })
      .where('device_id', '=', OTHER)
      .execute();
    await gw.app.service.reload();
    expect(store().lookupPsk(b.identity)?.deviceId).toBe(OTHER);
    await revokeDevice(gw.owner, OTHER);
    await gw.app.service.reload();
    expect(store().lookupPsk(a.identity)).toBeUndefined();
    expect(store().lookupPsk(b.identity)).toBeUndefined();
  });

  it('a key whose not_after passes between reloads is refused at once and reported by the expiry timer', async () => {
    const row = await gw.owner
      .insertInto('device_gateway.device_credentials')
      .values({
        psk_identity: 'short-lived-1',
        psk_key: KEY_32,
        device_id: DEVICE,
        not_after: sql<Date>`now() + interval '400 milliseconds'`,
      })
      .returning(['credential_id', 'not_after'])
      .executeTakeFirstOrThrow();
    await gw.app.service.reload();
    expect(store().lookupPsk('short-lived-1')?.deviceId).toBe(DEVICE);
    const reported = new Promise<string[]>((resolve) => gw.app.registry.onCredentialsChanged(resolve));
    expect(await reported).toEqual([row.credential_id]);
    expect(Date.now()).toBeGreaterThanOrEqual(row.not_after!.getTime());
    expect(store().lookupPsk('short-lived-1')).toBeUndefined();
    // Reported once: the reload that drops the expired row does not report it again.
    invalidations.length = 0;
    await gw.app.service.reload();
    expect(invalidations).toEqual([]);
  });

  it('a failed reload keeps the previous registry and credentials', async () => {
    const issued = await issueCredential(gw.owner, DEVICE, { validDays: 5 });
    await gw.app.service.reload();
    await revokeIdentity(gw.owner, issued.identity);
    // The login loses its read right on the keys: the reload fails as a whole, the registry too.
    await sql
      .raw(`REVOKE SELECT ON device_gateway.device_credentials FROM ${GATEWAY_LOGIN_ROLE}`)
      .execute(gw.owner);
    try {
      await expect(gw.app.service.reload()).rejects.toThrow(/permission denied/);
    } finally {
      await sql
        .raw(`GRANT SELECT ON device_gateway.device_credentials TO ${GATEWAY_LOGIN_ROLE}`)
        .execute(gw.owner);
    }
    expect(store().lookupPsk(issued.identity)?.deviceId).toBe(DEVICE);
    expect(gw.app.state.settingsDocument(DEVICE)).toBeDefined();
    expect(invalidations).toEqual([]);
    await gw.app.service.reload();
    expect(store().lookupPsk(issued.identity)).toBeUndefined();
    expect(invalidations).toEqual([[issued.credentialId]]);
  });

  it('a deleted device takes its keys with it', async () => {
    await gw.owner
      .insertInto('device_gateway.device_registry')
      .values({
        device_id: 'short-lived-device',
        site_id: '00000000-0000-4000-8000-000000000001',
        name: 'n',
        model: 'm',
      })
      .execute();
    const issued = await issueCredential(gw.owner, 'short-lived-device', { validDays: 5 });
    await gw.app.service.reload();
    expect(store().lookupPsk(issued.identity)?.deviceId).toBe('short-lived-device');
    await gw.owner
      .deleteFrom('device_gateway.device_registry')
      .where('device_id', '=', 'short-lived-device')
      .execute();
    const left = await gw.owner
      .selectFrom('device_gateway.device_credentials')
      .select('credential_id')
      .where('device_id', '=', 'short-lived-device')
      .execute();
    expect(left).toEqual([]);
    await gw.app.service.reload();
    expect(invalidations).toEqual([[issued.credentialId]]);
  });

  it('no key text reaches /api/config, /metrics or a reload response', async () => {
    const issued = await issueCredential(gw.owner, DEVICE, { validDays: 5 });
    const reload = await request(gw.app.http).post('/api/reload-registry').set(auth);
    expect(store().lookupPsk(issued.identity)).toBeDefined();
    const config = await request(gw.app.http).get('/api/config').set(auth);
    const metrics = await request(gw.app.http).get('/metrics');
    const hex = Buffer.from(issued.keyText, 'utf8').toString('hex');
    for (const res of [reload, config, metrics]) {
      expect(res.status).toBe(200);
      expect(res.text).not.toContain(issued.keyText);
      expect(res.text).not.toContain(hex);
    }
  });
});
