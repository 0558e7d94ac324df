// Review of issue 29 item 6 (database side): PostgREST exposes the schema enterprise_api, functions included
// (/rpc/...). The sweep's SECURITY DEFINER functions (0007, 0009, 0010, 0013) see every company's rows: neither the
// portal's role nor the anonymous role, nor PostgREST's login, may execute any of them.
// The test asserts the secure behaviour; a failing test is a finding.
import { sql } from 'kysely';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(async () => {
  await h.close();
});

it('no role PostgREST can become may execute a definer function of enterprise_api that ignores the caller', async () => {
  const { rows } = await sql<{ role: string; fn: string }>`
    SELECT r.rolname AS role, p.oid::regprocedure::text AS fn
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'enterprise_api'
    CROSS JOIN pg_roles r
    WHERE p.prosecdef
      AND r.rolname IN (
        SELECT rolname FROM pg_roles WHERE pg_has_role('authenticator', oid, 'MEMBER') OR rolname = 'authenticator')
      AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
      AND p.proname IN ('expired_multipart_uploads', 'record_upload_abandoned', 'unclaimed_multipart_uploads',
        'abandon_unstarted_multipart_uploads', 'record_object_created', 'note_upload_assembled')
    ORDER BY 1, 2`.execute(h.admin);
  expect(rows).toEqual([]);
  // The check looks at the right roles: PostgREST's login can become the portal role and the anonymous one.
  const roles = await sql<{ rolname: string }>`
    SELECT rolname FROM pg_roles WHERE pg_has_role('authenticator', oid, 'MEMBER') ORDER BY 1`.execute(
    h.admin,
  );
  expect(roles.rows.map((r) => r.rolname)).toEqual(
    expect.arrayContaining(['authenticator', 'enterprise_portal_role']),
  );
  // And it would see a grant: the workflow's own role may execute them.
  const api = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'enterprise_api' AND p.proname = 'abandon_unstarted_multipart_uploads'
      AND has_function_privilege('enterprise_api_role', p.oid, 'EXECUTE')`.execute(h.admin);
  expect(api.rows[0]?.n).toBe(1);
});
