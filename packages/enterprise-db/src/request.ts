// How callers carry an identity into the database.
// - withPostgrestRequest: PostgREST's per-request protocol, reproduced for tests and the benchmark.
// - withRequestClaims: a transaction with the caller's claims, as the workflow service runs its requests.
// - recordObjectCreated: the webhook's narrow service identity.
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import pg from 'pg';
import { API_ROLE, PORTAL_ANON } from './roles.js';
import type { EnterpriseDatabase, MediaStatus } from './types.js';

/** JWT claims as PostgREST exposes them in `request.jwt.claims`. */
export type RequestClaims = Record<string, unknown>;

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

export interface RequestClaimsOptions {
  /** Default READ COMMITTED; the decision flow's row locks make that sufficient. */
  isolationLevel?: 'read committed' | 'repeatable read' | 'serializable';
}

/** The SQL of each level: the opening is built as text, so only these words can reach it. */
const isolationLevels: Record<NonNullable<RequestClaimsOptions['isolationLevel']>, string> = {
  'read committed': 'READ COMMITTED',
  'repeatable read': 'REPEATABLE READ',
  serializable: 'SERIALIZABLE',
};

/**
 * `text` as a dollar-quoted SQL literal. Dollar quoting has no escape sequences at all, so the value
 * cannot end the literal early whatever it contains (the tag is random and checked to be absent) and
 * the result does not depend on `standard_conforming_strings`.
 */
export function dollarQuote(text: string): string {
  for (;;) {
    const tag = `$c${randomBytes(6).toString('hex')}$`;
    if (!text.includes(tag)) return `${tag}${text}${tag}`;
  }
}

/**
 * Runs `fn` in one transaction of the workflow's login (`enterprise_api_login`) as
 * `enterprise_api_role` with `request.jwt.claims` set to the caller's verified claims, so the same
 * `enterprise_api.authorized_site_ids()` restricts every read and write to the caller's sites.
 * Rows outside them are invisible (reads return nothing, updates affect zero rows) and inserts
 * there fail with SQLSTATE 42501.
 *
 * The transaction opens in ONE round trip: BEGIN, the role and the claims (both transaction-local)
 * and the caller's remembered company go as one multi-statement simple query (no parameters; the
 * values are dollar-quoted). Kysely's own transaction API sends BEGIN alone and the settings after
 * it: one round trip more per request, which bench:workflow showed to matter (each costs a socket
 * write and read on both sides). The stored company needs enterprise migration 0004. Any failure,
 * including a failed setting after a successful BEGIN, rolls back before the connection goes back to
 * the pool; a broken connection fails the ROLLBACK too and the pool discards it.
 */
export async function withRequestClaims<DB, T>(
  db: Kysely<DB>,
  claims: RequestClaims & { sub: string },
  fn: (trx: Kysely<DB>) => Promise<T>,
  options: RequestClaimsOptions = {},
): Promise<T> {
  const opening =
    `BEGIN ISOLATION LEVEL ${isolationLevels[options.isolationLevel ?? 'read committed']}; ` +
    `SELECT set_config('role', ${dollarQuote(API_ROLE)}, true), ` +
    `set_config('request.jwt.claims', ${dollarQuote(JSON.stringify(claims))}, true); ` +
    // The caller's company for the policies' company half (migration 0004): one lookup per
    // transaction instead of one per statement and table.
    'SELECT enterprise.remember_caller_company()';
  return db.connection().execute(async (conn) => {
    let result: T;
    try {
      await sql.raw(opening).execute(conn);
      result = await fn(conn);
    } catch (err) {
      await sql`ROLLBACK`.execute(conn).catch(() => undefined);
      throw err;
    }
    await sql`COMMIT`.execute(conn);
    return result;
  });
}

export interface ObjectCreatedFacts {
  /** The object key, URL-decoded. */
  objectKey: string;
  sizeBytes: number;
  etag: string | null;
  contentType: string | null;
}

export interface ObjectCreatedOutcome {
  /** recorded: this call changed the item; already_recorded: a redelivery; unknown_key: no such item. */
  outcome: 'recorded' | 'already_recorded' | 'unknown_key';
  mediaId: string | null;
  siteId: string | null;
  status: MediaStatus | null;
}

/**
 * The webhook's service identity: calls enterprise_api.record_object_created(), a SECURITY DEFINER
 * function owned by `enterprise_media_ingest`, the only way to move a media item out of
 * `pending_upload`. Needs no claims; `db` is the workflow's pool (enterprise_api_login).
 */
export async function recordObjectCreated<DB>(
  db: Kysely<DB>,
  facts: ObjectCreatedFacts,
): Promise<ObjectCreatedOutcome> {
  return db.transaction().execute(async (trx) => {
    await sql`SELECT set_config('role', ${API_ROLE}, true)`.execute(trx);
    const { rows } = await sql<{
      media_id: string | null;
      site_id: string | null;
      status: MediaStatus | null;
      outcome: ObjectCreatedOutcome['outcome'];
    }>`SELECT * FROM enterprise_api.record_object_created(${facts.objectKey}, ${facts.sizeBytes}, ${facts.etag}, ${facts.contentType})`.execute(
      trx,
    );
    const row = rows[0];
    if (row === undefined) throw new Error('record_object_created returned no row');
    return { outcome: row.outcome, mediaId: row.media_id, siteId: row.site_id, status: row.status };
  });
}

export type { EnterpriseDatabase };
