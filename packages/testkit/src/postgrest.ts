// PostgREST's per-request protocol (design §4.3), reproduced at the database level: PostgREST cannot be
// installed on the development machines, so the read-surface tests and the RLS benchmark enter the database
// exactly as it would.
import { PORTAL_ANON } from '@platform/enterprise-db';
import type { RequestClaims } from '@platform/enterprise-db';
import pg from 'pg';

export interface PostgrestRequestOptions {
  /**
   * The role PostgREST switches to. Default: the token's `role` claim, or the anonymous role when
   * there are no claims (db-anon-role).
   */
  role?: string;
  /** Verified JWT claims; `null`/absent means an anonymous request. */
  claims?: RequestClaims | null;
  /** GET and HEAD run READ ONLY, the other methods READ WRITE (as PostgREST does). Default GET. */
  method?: 'GET' | 'HEAD' | 'POST' | 'PATCH' | 'PUT' | 'DELETE';
  /** `request.path`, e.g. `/work_items`. Default `/`. */
  path?: string;
  /** The db-pre-request function; default `postgrest.pre_request`. `null` skips it. */
  preRequest?: string | null;
}

/** What the request callback may use: the connection inside the request's transaction. */
export type PostgrestRequestClient = Pick<pg.PoolClient, 'query'>;

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

function quoteQualified(name: string): string {
  return name.split('.').map(quoteIdent).join('.');
}

/**
 * Runs `fn` inside one simulated PostgREST request (design §4.3), on a connection of `authenticator`
 * (`target` is a pool of that login or its URL): BEGIN (READ ONLY for GET/HEAD), SET LOCAL ROLE,
 * the request GUCs (`request.jwt.claims` ...), the db-pre-request function, `fn`'s queries, COMMIT.
 * Any error rolls back and is rethrown with its SQLSTATE in `code` (42501: PostgREST answers 401
 * for the anonymous role, 403 otherwise; `PGRST`: the status in the error's detail).
 */
export async function withPostgrestRequest<T>(
  target: pg.Pool | string,
  options: PostgrestRequestOptions,
  fn: (client: PostgrestRequestClient) => Promise<T>,
): Promise<T> {
  const ownPool = typeof target === 'string' ? new pg.Pool({ connectionString: target, max: 1 }) : undefined;
  const pool = ownPool ?? (target as pg.Pool);
  const claims = options.claims ?? null;
  const claimedRole = claims !== null && typeof claims.role === 'string' ? claims.role : undefined;
  const role = options.role ?? claimedRole ?? PORTAL_ANON;
  const method = options.method ?? 'GET';
  const readOnly = method === 'GET' || method === 'HEAD';
  const preRequest = options.preRequest === undefined ? 'postgrest.pre_request' : options.preRequest;
  const client = await pool.connect();
  let failed = false;
  try {
    await client.query(`BEGIN ISOLATION LEVEL READ COMMITTED ${readOnly ? 'READ ONLY' : 'READ WRITE'}`);
    await client.query(`SET LOCAL ROLE ${quoteIdent(role)}`);
    // PostgREST gives the anonymous role the claim set {"role": <anon role>}.
    const claimsJson = JSON.stringify(claims ?? { role });
    await client.query(
      `SELECT set_config('request.jwt.claims', $1, true), set_config('request.method', $2, true),
              set_config('request.path', $3, true), set_config('request.headers', '{}', true),
              set_config('request.cookies', '{}', true)`,
      [claimsJson, method, options.path ?? '/'],
    );
    if (preRequest !== null) await client.query(`SELECT ${quoteQualified(preRequest)}()`);
    const result = await fn(client);
    await client.query('COMMIT');
    return result;
  } catch (err) {
    failed = true;
    await client.query('ROLLBACK').catch(() => undefined);
    throw err;
  } finally {
    // A connection whose transaction state is unknown is not reused.
    client.release(failed ? true : undefined);
    if (ownPool !== undefined) await ownPool.end();
  }
}
