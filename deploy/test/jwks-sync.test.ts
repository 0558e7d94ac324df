// The JWKS sync against a real issuer (testkit's Keycloak-style JWKS endpoint) and a migrated database.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { enterpriseMigrations } from '@platform/enterprise-db';
import { createDb, createLogger } from '@platform/service-kit';
import { createTestDatabase, freePort, startIssuer } from '@platform/testkit';
import type { Issuer, TestDatabase } from '@platform/testkit';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import pg from 'pg';
import { Writable } from 'node:stream';
import { loadJwksSyncConfig, runSyncLoop, syncOnce, targetFromConfig } from '../src/jwks-sync.js';

const quietLogger = createLogger({
  service: 'jwks-sync-test',
  stream: new Writable({ write: (_chunk, _enc, done) => done() }),
});

describe('JWKS sync for PostgREST', () => {
  let database: TestDatabase;
  let issuer: Issuer;
  let db: Kysely<unknown>;
  beforeAll(async () => {
    database = await createTestDatabase({ migrations: [enterpriseMigrations] });
    issuer = await startIssuer();
    db = createDb(database.url, { max: 2 });
  });
  afterAll(async () => {
    await db.destroy();
    await issuer.stop();
    await database.drop();
  });

  const target = () =>
    targetFromConfig(
      loadJwksSyncConfig({
        DATABASE_URL: database.url,
        OIDC_ISSUER_URL: issuer.issuerUrl,
        OIDC_JWKS_URL: issuer.jwksUrl,
      }),
    );

  it('installs the issuer, client and public keys, notifies PostgREST once, and is idempotent', async () => {
    const listener = new pg.Client({ connectionString: database.url });
    await listener.connect();
    const notices: string[] = [];
    listener.on('notification', (n) => notices.push(n.payload ?? ''));
    await listener.query('LISTEN pgrst');
    try {
      const first = await syncOnce(db, target());
      expect(first.changed).toBe(true);
      expect(first.kids.length).toBeGreaterThan(0);
      const { rows } = await sql<{
        jwt_issuer: string;
        jwt_client_id: string;
        jwks: { keys: { kid: string; d?: string }[] };
      }>`
        SELECT jwt_issuer, jwt_client_id, jwks FROM enterprise.postgrest_settings`.execute(db);
      expect(rows[0]!.jwt_issuer).toBe(issuer.issuerUrl);
      expect(rows[0]!.jwt_client_id).toBe('platform-enterprise-web');
      expect(rows[0]!.jwks.keys.map((k) => k.kid)).toEqual(first.kids);
      expect(rows[0]!.jwks.keys.every((k) => k.d === undefined)).toBe(true);

      const second = await syncOnce(db, target());
      expect(second.changed).toBe(false);
      await new Promise((r) => setTimeout(r, 200));
      expect(notices).toEqual(['reload config']);
    } finally {
      await listener.end();
    }
  });

  it('a one-shot run writes the ready file after its first success', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'jwks-sync-'));
    try {
      const readyFile = join(dir, 'ready');
      await runSyncLoop({
        db,
        target: target(),
        logger: quietLogger,
        intervalS: 0,
        startupTimeoutMs: 5000,
        readyFile,
        signal: new AbortController().signal,
      });
      expect(readFileSync(readyFile, 'utf8')).toMatch(/^\d{4}-/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('gives up when the key set cannot be fetched before the startup timeout', async () => {
    const port = await freePort('tcp');
    const unreachable = { ...target(), jwksUrl: `http://127.0.0.1:${port}/certs`, fetchTimeoutMs: 500 };
    await expect(
      runSyncLoop({
        db,
        target: unreachable,
        logger: quietLogger,
        intervalS: 0,
        startupTimeoutMs: 1200,
        signal: new AbortController().signal,
      }),
    ).rejects.toThrow();
  });

  it('refuses a configuration without the database or the issuer', () => {
    expect(() => loadJwksSyncConfig({})).toThrow(
      /DATABASE_URL[\s\S]*OIDC_ISSUER_URL|OIDC_ISSUER_URL[\s\S]*DATABASE_URL/,
    );
  });
});
