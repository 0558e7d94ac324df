// The workflow's view of the enterprise database: its Kysely types and the way in for a user's
// request, a transaction that carries the user's claims so RLS decides what it may read and write.
import { withRequestClaims } from '@platform/enterprise-db';
import type { EnterpriseDatabase } from '@platform/enterprise-db';
import { mapDbError } from '@platform/service-kit';
import type { Kysely, Transaction } from 'kysely';
import type { PortalUser } from '../domain/ports.js';

export type WorkflowDb = EnterpriseDatabase;
export type Executor = Kysely<WorkflowDb> | Transaction<WorkflowDb>;

/**
 * Runs `fn` in one transaction as `enterprise_api_role` with the user's verified claims in
 * `request.jwt.claims` (enterprise-db's `withRequestClaims`, opened in one round trip), so the RLS
 * policies restrict every read and write to the user's sites. Database failures become domain errors
 * (unreachable → 503 with Retry-After); a failure rolls the whole transaction back, so nothing is
 * half-written.
 */
export async function inUserTransaction<T>(
  db: Kysely<WorkflowDb>,
  user: PortalUser,
  fn: (trx: Kysely<WorkflowDb>) => Promise<T>,
): Promise<T> {
  try {
    return await withRequestClaims(db, user.claims, fn);
  } catch (err) {
    throw mapDbError(err);
  }
}
