// The workflow's own transaction opening (one round trip) gives the database exactly the identity
// enterprise-db's withRequestClaims gives, survives hostile claim values, and never returns a
// connection to the pool inside a transaction.
import {
  API_LOGIN,
  demoSites,
  demoUserSubs,
  enterpriseMigrations,
  devRolePasswords,
  seedEnterprise,
  urlForLogin,
  withRequestClaims,
} from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import { inUserTransaction } from '../src/db/database.js';
import type { WorkflowDb } from '../src/db/database.js';
import type { PortalUser } from '../src/domain/ports.js';

let database: TestDatabase;
let db: Kysely<WorkflowDb>;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [enterpriseMigrations] });
  const admin = createDb<WorkflowDb>(database.url, { max: 1 });
  await seedEnterprise(admin);
  await admin.destroy();
  // One connection: whatever a transaction leaves behind, the next one sees.
  db = createDb<WorkflowDb>(urlForLogin(database.url, API_LOGIN, devRolePasswords.enterpriseApi), {
    max: 1,
  });
});
afterAll(async () => {
  await db.destroy();
  await database.drop();
});

const user = (sub: string, extra: Record<string, unknown> = {}): PortalUser => ({
  sub,
  claims: { sub, role: 'enterprise_portal_role', ...extra },
});

const identity = sql<{ who: string; sub: string | null; sites: string[]; in_tx: boolean }>`
  SELECT current_user AS who, enterprise_api.request_sub() AS sub,
         enterprise_api.authorized_site_ids()::text[] AS sites,
         now() <> statement_timestamp() OR true AS in_tx`;

it('sets the same role, claims and site access as withRequestClaims', async () => {
  const bob = user(demoUserSubs.bob, { name: 'O\'Brien \\ "q" $c00$' });
  const ours = await inUserTransaction(db, bob, async (trx) => (await identity.execute(trx)).rows[0]);
  const theirs = await withRequestClaims(
    db,
    bob.claims,
    async (trx) => (await identity.execute(trx)).rows[0],
  );
  expect(ours).toEqual(theirs);
  expect(ours).toMatchObject({
    who: 'enterprise_api_role',
    sub: demoUserSubs.bob,
    sites: [demoSites.acmeHq.id],
  });
  const claims = await inUserTransaction(
    db,
    bob,
    async (trx) =>
      (await sql<{ c: string }>`SELECT current_setting('request.jwt.claims') AS c`.execute(trx)).rows[0]?.c,
  );
  expect(JSON.parse(claims ?? '')).toEqual(bob.claims);
});

it('rolls back on failure and returns a clean connection', async () => {
  await expect(
    inUserTransaction(db, user(demoUserSubs.alice), async (trx) => {
      await sql`SELECT 1`.execute(trx);
      throw new Error('boom');
    }),
  ).rejects.toThrow('boom');
  const after = await sql<{ who: string; claims: string | null; tx: string }>`
    SELECT current_user AS who, current_setting('request.jwt.claims', true) AS claims,
           pg_current_xact_id_if_assigned()::text AS tx`.execute(db);
  expect(after.rows[0]).toEqual({ who: API_LOGIN, claims: '', tx: null });
});
