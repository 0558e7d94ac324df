// Every SECURITY DEFINER function of the gateway searches pg_catalog and then pg_temp, named last (migration
// 0007; the rollout functions of 0006 were written so). With `search_path = pg_catalog` alone PostgreSQL searches
// the session's temporary schema first for relations and types, and the gateway's login may create temporary
// objects: a cold review ran its own SQL as the functions' owner that way (review-27-rollouts.test.ts).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { createDb } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import { gatewayMigrations } from '../src/db/migrations.js';

let database: TestDatabase;
let owner: Kysely<unknown>;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<unknown>(database.url, { max: 1 });
});

afterAll(async () => {
  await owner?.destroy();
  await database?.drop();
});

describe('SECURITY DEFINER functions of the gateway', () => {
  it('each one sets search_path to pg_catalog, pg_temp', async () => {
    const { rows } = await sql<{ fn: string; config: string[] | null }>`
      SELECT p.oid::regprocedure::text AS fn, p.proconfig AS config
      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = 'device_gateway' AND p.prosecdef
      ORDER BY 1`.execute(owner);
    expect(rows.length).toBeGreaterThanOrEqual(6);
    const unsafe = rows.filter((r) => !(r.config ?? []).includes('search_path=pg_catalog, pg_temp'));
    expect(unsafe.map((r) => `${r.fn}: ${JSON.stringify(r.config)}`)).toEqual([]);
  });
});
