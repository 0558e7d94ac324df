// The caller's company once per request, not once per statement; the site ids stay the only grant.
//
// Why: every policy compared the row with `(SELECT authorized_company_id())` and
// `(SELECT authorized_site_ids())`, two SECURITY DEFINER lookups per statement (and per table and
// command in a write). For a caller who sees nothing, that fixed cost made a PostgREST count 1.3-1.5x
// the same query with a hand-written filter (bench:rls's target is 1.1x).
//
// What changes:
// - `enterprise.remember_caller_company()` stores the caller's company in the transaction-local
//   setting `enterprise.company_hint` (the nil uuid for "no company"). postgrest.pre_request() calls
//   it on every PostgREST request, withRequestClaims at the start of every workflow transaction.
// - The tenant check's company half reads the stored value, falling back to `authorized_company_id()`
//   when nothing is stored; its site half is `'{}'` when the stored value says "no company", else
//   `authorized_site_ids()`, unchanged (0003's STABLE SECURITY DEFINER function).
// - The expressions are written into the policies, not wrapped in SQL functions: an inlined function
//   is parsed again whenever a statement is planned, and the workflow's statements are planned on
//   every request (unnamed statements); wrapped, its UPDATE of a work item took 0.24-0.26 ms against
//   0.18-0.20 ms before and 0.19 ms written out (pgbench, extended protocol, bench database).
//
// Why a setting any session can change is safe here: it can only take rows away.
// - A row passes only if its site_id is in `authorized_site_ids()`, which reads the access map and
//   never the setting. Those sites all belong to the caller's company (principal_sites' foreign key to
//   sites (id, company_id)), and every row's company_id is its site's (foreign key to
//   sites (id, company_id) on every site table). So a forged company matches none of the rows the
//   sites allow, and a forged "no company" empties the site list: fewer rows, never others.
// - The companies table, where the company alone decides, keeps `authorized_company_id()`.
// - Operators and casts in a policy are resolved when it is created, not in the caller's search_path.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { API_ROLE, AUTHZ_OWNER } from '../roles.js';
import { withGeneratedSql } from '@platform/service-kit';
import { PRE_REQUEST_0002, tenantCheckWith, tenantPolicies } from './0002-security.js';

/** The stored "caller has no company"; a CHECK keeps it from naming a company. */
export const NO_COMPANY = '00000000-0000-0000-0000-000000000000';

const STORED = `pg_catalog.current_setting('enterprise.company_hint', true)`;
const hintedCheck = tenantCheckWith(
  `(SELECT COALESCE(NULLIF(${STORED}, '')::pg_catalog.uuid, enterprise_api.authorized_company_id()))`,
  `(SELECT CASE WHEN ${STORED} OPERATOR(pg_catalog.=) '${NO_COMPANY}' THEN '{}'::pg_catalog.uuid[]
           ELSE enterprise_api.authorized_site_ids() END)`,
);
const definerCheck = tenantCheckWith('(SELECT enterprise_api.authorized_company_id())');

/** `DROP POLICY` for every policy `tenantPolicies` creates. */
const dropTenantPolicies = (): string =>
  [...tenantPolicies(definerCheck).matchAll(/CREATE POLICY (\w+) ON (\S+)/g)]
    .map(([, name, table]) => `DROP POLICY ${name} ON ${table};`)
    .join('\n');

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

const UP_SQL = `
-- The stored "no company" must never name a company.
ALTER TABLE enterprise.companies ADD CONSTRAINT companies_id_not_nil CHECK (id <> '${NO_COMPANY}');

GRANT CREATE ON SCHEMA enterprise TO ${AUTHZ_OWNER};
CREATE FUNCTION enterprise.remember_caller_company() RETURNS void
  LANGUAGE sql VOLATILE
  SET search_path = pg_catalog, pg_temp
AS $$
  SELECT pg_catalog.set_config('enterprise.company_hint',
    COALESCE(enterprise_api.authorized_company_id()::pg_catalog.text, '${NO_COMPANY}'), true)
$$;
COMMENT ON FUNCTION enterprise.remember_caller_company() IS 'Stores the current caller''s company (${NO_COMPANY}: none) in enterprise.company_hint for the rest of the transaction, which the tenant policies read instead of calling authorized_company_id() per statement. Anyone may set that setting, so the policies only let it narrow. Called by postgrest.pre_request() and by the workflow when it opens a transaction.';
ALTER FUNCTION enterprise.remember_caller_company() OWNER TO ${AUTHZ_OWNER};
REVOKE CREATE ON SCHEMA enterprise FROM ${AUTHZ_OWNER};
REVOKE EXECUTE ON FUNCTION enterprise.remember_caller_company() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION enterprise.remember_caller_company() TO ${API_ROLE};

${PRE_REQUEST_STORES_HINT}

${dropTenantPolicies()}
${tenantPolicies(hintedCheck)}
`;

const DOWN_SQL = `
${dropTenantPolicies()}
${tenantPolicies(definerCheck)}
${PRE_REQUEST_0002.replace('CREATE FUNCTION', 'CREATE OR REPLACE FUNCTION')}
DROP FUNCTION enterprise.remember_caller_company();
ALTER TABLE enterprise.companies DROP CONSTRAINT companies_id_not_nil;
`;

export const companyHintMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
