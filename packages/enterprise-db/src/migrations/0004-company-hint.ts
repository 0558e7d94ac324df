// The access decision once per request, not once per statement; the site ids stay the only grant.
//
// Why: every policy compared the row with `(SELECT authorized_company_id())` and
// `(SELECT authorized_site_ids())`, two SECURITY DEFINER lookups per statement (and per table and
// command in a write). For a caller who sees nothing, that fixed cost made a PostgREST count 1.3-1.5x
// the same query with a hand-written filter (issue 5's bench:rls target is 1.1x).
//
// What changes:
// - The company half of the tenant check reads `enterprise.company_hint()`: the company that
//   `enterprise.remember_caller_company()` stored in the transaction-local setting
//   `enterprise.company_hint` (postgrest.pre_request() calls it on every PostgREST request,
//   withRequestClaims at the start of every workflow transaction), falling back to
//   `authorized_company_id()` when nothing was stored. The nil uuid stands for "no company".
// - `enterprise_api.authorized_site_ids()` becomes an inlinable SQL wrapper: '{}' when the hint says
//   "no company", otherwise `enterprise.caller_site_ids()`, the STABLE SECURITY DEFINER lookup
//   that was its body (same text, same owner). Policies keep DESIGN 4.2's literal form.
//
// Why a setting any session can change is safe here: it can only take rows away.
// - A row passes only if its site_id is in `caller_site_ids()`, which reads the access map and never
//   the hint. Those sites all belong to the caller's company (principal_sites' foreign key to
//   sites (id, company_id)), and every row's company_id is its site's (foreign key to
//   sites (id, company_id) on every site table). So a forged company matches none of the rows the
//   sites allow, and a forged "no company" empties the site list: fewer rows, never others.
// - The companies table, where the company alone decides, keeps `authorized_company_id()`.
// - Both inlined functions pick between a narrowing answer and the definer's: whatever an operator
//   or a setting resolves to, they cannot return anything else.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { API_ROLE, AUTHZ_OWNER, PORTAL_ROLE } from '../roles.js';
import { ACCESS_FUNCTIONS_0002, PRE_REQUEST_0002, tenantCheckWith, tenantPolicies } from './0002-security.js';
import { accessFunction, SITE_IDS_BODY_0003 } from './0003-cheaper-access-functions.js';

/** The stored "caller has no company"; a CHECK keeps it from naming a company. */
export const NO_COMPANY = '00000000-0000-0000-0000-000000000000';

const hintedCheck = tenantCheckWith('(SELECT enterprise.company_hint())');
const definerCheck = tenantCheckWith('(SELECT enterprise_api.authorized_company_id())');

/** `DROP POLICY` for every policy `tenantPolicies` creates. */
const dropTenantPolicies = (): string =>
  [...tenantPolicies(definerCheck).matchAll(/CREATE POLICY (\w+) ON (\S+)/g)]
    .map(([, name, table]) => `DROP POLICY ${name} ON ${table};`)
    .join('\n');

const SITE_IDS_COMMENT_0002 = (() => {
  const comment = /COMMENT ON FUNCTION enterprise_api\.authorized_site_ids\(\) IS '(?:[^']|'')*';/.exec(
    ACCESS_FUNCTIONS_0002,
  )?.[0];
  if (comment === undefined) throw new Error('migration 0004: no comment on authorized_site_ids() in 0002');
  return comment;
})();

const PRE_REQUEST_STORES_HINT = (() => {
  const attributes = 'LANGUAGE plpgsql STABLE SECURITY DEFINER';
  const last = '  END IF;\nEND\n$$;';
  if (!PRE_REQUEST_0002.includes(attributes) || !PRE_REQUEST_0002.includes(last)) {
    throw new Error('migration 0004: postgrest.pre_request() of migration 0002 is not the expected text');
  }
  return (
    PRE_REQUEST_0002.replace('CREATE FUNCTION', 'CREATE OR REPLACE FUNCTION')
      .replace(attributes, 'LANGUAGE plpgsql VOLATILE SECURITY DEFINER')
      // A function, not a string: in a replacement string "$$" would mean one "$".
      .replace(last, () => '  END IF;\n  PERFORM enterprise.remember_caller_company();\nEND\n$$;')
  );
})();

export const companyHintMigration: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql
      .raw(
        `
-- The stored "no company" must never name a company.
ALTER TABLE enterprise.companies ADD CONSTRAINT companies_id_not_nil CHECK (id <> '${NO_COMPANY}');

GRANT CREATE ON SCHEMA enterprise TO ${AUTHZ_OWNER};

${accessFunction('enterprise.caller_site_ids() RETURNS uuid[]', SITE_IDS_BODY_0003)}
COMMENT ON FUNCTION enterprise.caller_site_ids() IS 'Sorted ids of the sites the current caller (sub of request.jwt.claims) may see and act on, from the access map (empty: none). The only source of access: enterprise_api.authorized_site_ids() returns this or nothing.';

CREATE FUNCTION enterprise.company_hint() RETURNS uuid
  LANGUAGE sql STABLE PARALLEL SAFE
AS $$
  SELECT COALESCE(NULLIF(pg_catalog.current_setting('enterprise.company_hint', true), '')::pg_catalog.uuid,
                  enterprise_api.authorized_company_id())
$$;
COMMENT ON FUNCTION enterprise.company_hint() IS 'The caller''s company as stored for this transaction by enterprise.remember_caller_company() (${NO_COMPANY}: none), else authorized_company_id(). Anyone may set the setting, so it only ever narrows: policies AND it with the site check. Inlined into the policies (no SET, no SECURITY DEFINER).';

CREATE FUNCTION enterprise.remember_caller_company() RETURNS void
  LANGUAGE sql VOLATILE
AS $$
  SELECT pg_catalog.set_config('enterprise.company_hint',
    COALESCE(enterprise_api.authorized_company_id()::pg_catalog.text, '${NO_COMPANY}'), true)
$$;
COMMENT ON FUNCTION enterprise.remember_caller_company() IS 'Stores the current caller''s company for the rest of the transaction (enterprise.company_hint). Called by postgrest.pre_request() and by the workflow at the start of each transaction.';

ALTER FUNCTION enterprise.caller_site_ids() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION enterprise.company_hint() OWNER TO ${AUTHZ_OWNER};
ALTER FUNCTION enterprise.remember_caller_company() OWNER TO ${AUTHZ_OWNER};
REVOKE CREATE ON SCHEMA enterprise FROM ${AUTHZ_OWNER};

CREATE OR REPLACE FUNCTION enterprise_api.authorized_site_ids() RETURNS uuid[]
  LANGUAGE sql STABLE SECURITY INVOKER PARALLEL SAFE
AS $$
  SELECT CASE
    WHEN pg_catalog.current_setting('enterprise.company_hint', true) OPERATOR(pg_catalog.=) '${NO_COMPANY}'
    THEN '{}'::pg_catalog.uuid[]
    ELSE enterprise.caller_site_ids()
  END
$$;
COMMENT ON FUNCTION enterprise_api.authorized_site_ids() IS 'Sorted ids of the sites the current caller may see and act on (empty: none): enterprise.caller_site_ids(), or nothing when this transaction stored "no company". The one access decision for PostgREST reads and workflow writes; policies use it as site_id = ANY ((SELECT enterprise_api.authorized_site_ids())::uuid[]). Inlined: one function call per statement.';

REVOKE EXECUTE ON FUNCTION enterprise.caller_site_ids(), enterprise.company_hint(),
  enterprise.remember_caller_company() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION enterprise.caller_site_ids(), enterprise.company_hint() TO ${PORTAL_ROLE}, ${API_ROLE};
GRANT EXECUTE ON FUNCTION enterprise.remember_caller_company() TO ${API_ROLE};

${PRE_REQUEST_STORES_HINT}

${dropTenantPolicies()}
${tenantPolicies(hintedCheck)}
`,
      )
      .execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql
      .raw(
        `
${dropTenantPolicies()}
${tenantPolicies(definerCheck)}
${PRE_REQUEST_0002.replace('CREATE FUNCTION', 'CREATE OR REPLACE FUNCTION')}
${accessFunction('enterprise_api.authorized_site_ids() RETURNS uuid[]', SITE_IDS_BODY_0003)}
${SITE_IDS_COMMENT_0002}
DROP FUNCTION enterprise.remember_caller_company();
DROP FUNCTION enterprise.company_hint();
DROP FUNCTION enterprise.caller_site_ids();
ALTER TABLE enterprise.companies DROP CONSTRAINT companies_id_not_nil;
`,
      )
      .execute(db);
  },
};
