// PostgREST's configuration checked against what the migrations create (design §4.2): the schemas it
// serves, the anonymous role, the authenticator login and the roles it must be able to switch to, and the
// pre-request / pre-config functions with the grants PostgREST needs to call them.
import pg from 'pg';
import type { Problem } from './problems.js';

/** PostgREST settings by their config-file names (db-anon-role, jwt-aud, ...). */
export type PostgrestSettings = Record<string, string>;

/** `PGRST_DB_ANON_ROLE` → `db-anon-role`; other variables are ignored. */
export function settingsFromEnvironment(env: Record<string, string | undefined>): PostgrestSettings {
  const out: PostgrestSettings = {};
  for (const [k, v] of Object.entries(env))
    if (k.startsWith('PGRST_') && v !== undefined) out[k.slice(6).toLowerCase().replace(/_/g, '-')] = v;
  return out;
}

/** PostgREST's config file format: `key = "value"` / `key = value`, `#` comments. */
export function settingsFromConfigFile(text: string): PostgrestSettings {
  const out: PostgrestSettings = {};
  for (const raw of text.split(/\r?\n/)) {
    const m = /^\s*([a-z][a-z0-9-.]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^#\s]+)/.exec(raw);
    if (m) out[m[1]!] = m[2]!.startsWith('"') ? m[2]!.slice(1, -1) : m[2]!;
  }
  return out;
}

export interface PostgrestExpectations {
  /** The login PostgREST connects as when db-uri does not say (it comes from a Secret). */
  defaultAuthenticator: string;
  /** Values the JWT `role` claim takes (the realm's hardcoded claim). */
  roleClaims: string[];
  /** The client id the realm puts into `aud`. */
  audience: string;
}

function qualified(name: string): { schema: string; fn: string } | undefined {
  const m = /^([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)$/.exec(name);
  return m ? { schema: m[1]!, fn: m[2]! } : undefined;
}

/**
 * Runs the checks on `ownerUrl` (a superuser or the migration owner of a migrated database).
 * Role switching is checked with pg_has_role(authenticator, role, 'SET'), what PostgREST's SET ROLE needs.
 */
export async function checkPostgrestAgainstDatabase(
  settings: PostgrestSettings,
  ownerUrl: string,
  expect: PostgrestExpectations,
  file = 'postgrest',
): Promise<Problem[]> {
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file, message });
  };
  const schemas = (settings['db-schemas'] ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
  const anon = settings['db-anon-role'];
  const uri = settings['db-uri'];
  const authenticator =
    uri !== undefined && !uri.includes('$(') && URL.canParse(uri) && new URL(uri).username !== ''
      ? decodeURIComponent(new URL(uri).username)
      : expect.defaultAuthenticator;
  if (schemas.length === 0) add('db-schemas is not set');
  if (anon === undefined) add('db-anon-role is not set');
  if (settings['jwt-aud'] !== expect.audience)
    add(`jwt-aud must be ${expect.audience} (the realm's audience)`);
  if (settings['jwt-role-claim-key'] !== undefined && settings['jwt-role-claim-key'] !== '.role')
    add('jwt-role-claim-key must be .role (the realm maps the claim "role")');
  if (settings['db-config'] !== undefined && settings['db-config'] !== 'true')
    add('db-config must be true (pre-config serves the JWKS from the database)');

  const client = new pg.Client({ connectionString: ownerUrl });
  await client.connect();
  try {
    for (const schema of schemas) {
      const { rowCount } = await client.query('SELECT 1 FROM pg_namespace WHERE nspname = $1', [schema]);
      if (rowCount === 0) add(`db-schemas: schema ${schema} does not exist`);
    }
    const role = async (name: string): Promise<{ rolcanlogin: boolean; rolinherit: boolean } | undefined> =>
      (
        await client.query<{ rolcanlogin: boolean; rolinherit: boolean }>(
          'SELECT rolcanlogin, rolinherit FROM pg_roles WHERE rolname = $1',
          [name],
        )
      ).rows[0];
    const auth = await role(authenticator);
    if (auth === undefined) add(`authenticator login ${authenticator} does not exist`);
    else {
      if (!auth.rolcanlogin) add(`${authenticator} cannot log in`);
      if (auth.rolinherit)
        add(`${authenticator} must be NOINHERIT (it has no rights until it switches role)`);
    }
    const targets = [...(anon === undefined ? [] : [anon]), ...expect.roleClaims];
    for (const target of targets) {
      const r = await role(target);
      if (r === undefined) {
        add(`role ${target} does not exist`);
        continue;
      }
      if (r.rolcanlogin) add(`role ${target} must not be able to log in`);
      if (auth === undefined) continue;
      // PostgREST's switch is SET ROLE from the authenticator session. A superuser session may SET ROLE to
      // anything, so ask the catalogue what the authenticator itself may do (PostgreSQL 16+: 'SET').
      const { rows } = await client.query<{ can: boolean }>(`SELECT pg_has_role($1, $2, 'SET') AS can`, [
        authenticator,
        target,
      ]);
      if (rows[0]?.can !== true) add(`${authenticator} cannot switch to ${target} (SET ROLE is not granted)`);
    }
    if (anon !== undefined && (await role(anon)) !== undefined) {
      const { rows } = await client.query<{ relation: string }>(
        `SELECT format('%I.%I', n.nspname, c.relname) AS relation
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = ANY($1) AND c.relkind IN ('r', 'v', 'm', 'p', 'f')
            AND has_table_privilege($2, c.oid, 'SELECT, INSERT, UPDATE, DELETE')`,
        [schemas, anon],
      );
      for (const r of rows)
        add(`anonymous role ${anon} has privileges on ${r.relation} (it must be denied everything)`);
    }

    const fnCheck = async (setting: string, callers: string[]): Promise<void> => {
      const name = settings[setting];
      if (name === undefined) {
        add(`${setting} is not set`);
        return;
      }
      const q = qualified(name);
      if (q === undefined) {
        add(`${setting} ${name} must be schema-qualified`);
        return;
      }
      const { rows } = await client.query<{ oid: number }>(
        `SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname = $1 AND p.proname = $2 AND p.pronargs = 0`,
        [q.schema, q.fn],
      );
      const oid = rows[0]?.oid;
      if (oid === undefined) {
        add(`${setting}: function ${name}() does not exist`);
        return;
      }
      for (const caller of callers) {
        if ((await role(caller)) === undefined) continue;
        const ok = await client.query<{ ok: boolean }>(
          `SELECT has_function_privilege($1, $2::oid, 'EXECUTE') AND has_schema_privilege($1, $3, 'USAGE') AS ok`,
          [caller, oid, q.schema],
        );
        if (ok.rows[0]?.ok !== true) add(`${caller} cannot execute ${name}() (${setting})`);
      }
    };
    await fnCheck('db-pre-request', expect.roleClaims);
    await fnCheck('db-pre-config', [authenticator]);
  } finally {
    await client.end();
  }
  return problems;
}
