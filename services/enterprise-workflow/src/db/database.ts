// The workflow's view of the enterprise database: its Kysely types and the way in for a user's
// request, a transaction that carries the user's claims so RLS decides what it may read and write.
import { randomBytes } from 'node:crypto';
import { API_ROLE } from '@platform/enterprise-db';
import type { EnterpriseDatabase } from '@platform/enterprise-db';
import { mapDbError } from '@platform/service-kit';
import { sql } from 'kysely';
import type { Kysely, Transaction } from 'kysely';
import type { PortalUser } from '../auth/token-verifier.js';

export type WorkflowDb = EnterpriseDatabase;
export type Executor = Kysely<WorkflowDb> | Transaction<WorkflowDb>;

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
 * The opening of a user's transaction in ONE round trip: BEGIN, the API role and the claims, sent as
 * a multi-statement simple query (no parameters, so node-postgres uses the simple protocol). The
 * settings are exactly those of enterprise-db's `withRequestClaims` (role `enterprise_api_role`,
 * `request.jwt.claims`, both transaction-local); test/db.test.ts checks that the database sees the
 * same identity. Kysely's own transaction API sends BEGIN alone and then the settings: one round trip
 * more per request, which the benchmark showed to matter (each costs a socket write and read).
 */
function openingStatements(claims: Record<string, unknown>): string {
  return (
    'BEGIN ISOLATION LEVEL READ COMMITTED; ' +
    `SELECT set_config('role', ${dollarQuote(API_ROLE)}, true), ` +
    `set_config('request.jwt.claims', ${dollarQuote(JSON.stringify(claims))}, true)`
  );
}

/**
 * Runs `fn` in one transaction as `enterprise_api_role` with the user's verified claims in
 * `request.jwt.claims`, so the RLS policies restrict every read and write to the user's sites.
 * Database failures become domain errors (unreachable → 503 with Retry-After); a failure rolls the
 * whole transaction back, so nothing is half-written.
 */
export async function inUserTransaction<T>(
  db: Kysely<WorkflowDb>,
  user: PortalUser,
  fn: (trx: Kysely<WorkflowDb>) => Promise<T>,
): Promise<T> {
  try {
    return await db.connection().execute(async (conn) => {
      let result: T;
      try {
        // Inside the try: if BEGIN succeeded and a setting failed, the aborted transaction must
        // still be rolled back before the connection returns to the pool.
        await sql.raw(openingStatements(user.claims)).execute(conn);
        result = await fn(conn);
      } catch (err) {
        // A broken connection fails here too; the pool discards such a client.
        await sql`ROLLBACK`.execute(conn).catch(() => undefined);
        throw err;
      }
      await sql`COMMIT`.execute(conn);
      return result;
    });
  } catch (err) {
    throw mapDbError(err);
  }
}
