// How callers carry an identity into the database (PostgREST's own protocol, reproduced for tests, is
// testkit's withPostgrestRequest).
// - withRequestClaims: a transaction with the caller's claims, as the workflow service runs its requests.
// - recordObjectCreated: the webhook's narrow service identity.
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import { API_ROLE } from './roles.js';
import type { EnterpriseDatabase, MediaStatus } from './types.js';

/** JWT claims as PostgREST exposes them in `request.jwt.claims`. */
export type RequestClaims = Record<string, unknown>;

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
