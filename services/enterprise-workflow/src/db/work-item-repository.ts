// Work items, their decision audit and the decision idempotency store (under the caller's RLS).
import type { Decision, WorkItemStatus } from '@platform/contracts';
import { sql } from 'kysely';
import type { Executor } from './database.js';

export interface LockedWorkItem {
  id: string;
  siteId: string;
  state: WorkItemStatus;
  deferUntil: Date | null;
  decidedAt: Date | null;
  decidedBy: string | null;
  decisionNote: string | null;
}

const columns = [
  'id',
  'site_id',
  'state',
  'defer_until',
  'decided_at',
  'decided_by',
  'decision_note',
] as const;

/** The columns of a work item that decisions read and write. */
interface WorkItemRow {
  id: string;
  site_id: string;
  state: WorkItemStatus;
  defer_until: Date | null;
  decided_at: Date | null;
  decided_by: string | null;
  decision_note: string | null;
}

function toLocked(row: WorkItemRow): LockedWorkItem {
  return {
    id: row.id,
    siteId: row.site_id,
    state: row.state,
    deferUntil: row.defer_until,
    decidedAt: row.decided_at,
    decidedBy: row.decided_by,
    decisionNote: row.decision_note,
  };
}

/**
 * Reads the item and locks its row until the transaction ends, so concurrent decisions on one item
 * run one after the other, each seeing the state the previous one committed (READ COMMITTED
 * re-reads the locked row). Undefined when it does not exist at `siteId` or the caller cannot see it.
 */
export async function lockWorkItem(
  db: Executor,
  siteId: string,
  itemId: string,
): Promise<LockedWorkItem | undefined> {
  const row = await db
    .selectFrom('enterprise.work_items')
    .select(columns)
    .where('id', '=', itemId)
    .where('site_id', '=', siteId)
    .forUpdate()
    .executeTakeFirst();
  return row === undefined ? undefined : toLocked(row);
}

export interface DecisionRecord {
  itemId: string;
  siteId: string;
  decision: Decision;
  newState: WorkItemStatus;
  note: string | null;
  deferUntil: Date | null;
  decidedBy: string;
  decidedAt: Date;
  requestId: string;
}

export interface StoredResponse {
  fingerprint: string;
  status: number;
  body: unknown;
  createdAt: Date;
}

/** The stored answer for the caller's key (RLS scopes keys to the caller's `sub`). */
export async function findIdempotentResponse(
  db: Executor,
  callerSub: string,
  key: string,
): Promise<StoredResponse | undefined> {
  const row = await db
    .selectFrom('enterprise.decision_idempotency_keys')
    .select(['request_fingerprint', 'response_status', 'response_body', 'created_at'])
    .where('caller_sub', '=', callerSub)
    .where('idempotency_key', '=', key)
    .executeTakeFirst();
  if (row === undefined) return undefined;
  return {
    fingerprint: row.request_fingerprint,
    status: row.response_status,
    body: row.response_body,
    createdAt: row.created_at,
  };
}

export async function deleteIdempotentResponse(db: Executor, callerSub: string, key: string): Promise<void> {
  await db
    .deleteFrom('enterprise.decision_idempotency_keys')
    .where('caller_sub', '=', callerSub)
    .where('idempotency_key', '=', key)
    .execute();
}

export async function storeIdempotentResponse(
  db: Executor,
  entry: {
    callerSub: string;
    key: string;
    itemId: string;
    siteId: string;
    fingerprint: string;
    status: number;
    body: unknown;
    createdAt: Date;
  },
): Promise<void> {
  await db
    .insertInto('enterprise.decision_idempotency_keys')
    .values({
      caller_sub: entry.callerSub,
      idempotency_key: entry.key,
      work_item_id: entry.itemId,
      site_id: entry.siteId,
      request_fingerprint: entry.fingerprint,
      response_status: entry.status,
      response_body: JSON.stringify(entry.body),
      created_at: entry.createdAt,
    })
    .execute();
}

/**
 * The common case in one statement: moves an item that is still in one of `openStates` (the domain's rule,
 * domain/decision-rules.ts OPEN_STATES) to `newState` and appends the audit row, returning the item as updated;
 * undefined when the item is not visible at `siteId` or not open (the caller then takes the locking path to
 * tell which).
 * Concurrent decisions serialise on the row: under READ COMMITTED a waiting UPDATE re-checks
 * `state` on the row the winner committed (and matches nothing once it is final). `RETURNING old.*`
 * needs PostgreSQL 18.
 */
export async function decideIfOpen(
  db: Executor,
  record: DecisionRecord,
  openStates: readonly WorkItemStatus[],
): Promise<LockedWorkItem | undefined> {
  const result = await sql<WorkItemRow>`
    WITH decided AS (
      UPDATE enterprise.work_items
      SET state = ${record.newState}, defer_until = ${record.deferUntil}::timestamptz,
          decided_at = ${record.decidedAt}::timestamptz, decided_by = ${record.decidedBy},
          decision_note = ${record.note}, updated_at = ${record.decidedAt}::timestamptz
      WHERE id = ${record.itemId}::uuid AND site_id = ${record.siteId}::uuid AND state = ANY(${openStates}::text[])
      RETURNING new.id, new.site_id, new.state, new.defer_until, new.decided_at, new.decided_by,
        new.decision_note, old.state AS previous_state
    ), audited AS (
      INSERT INTO enterprise.work_item_decisions (work_item_id, site_id, decision, previous_state, new_state,
        note, defer_until, decided_by, decided_at, request_id)
      SELECT id, site_id, ${record.decision}, previous_state, state, decision_note, defer_until, decided_by,
        decided_at, ${record.requestId}
      FROM decided
    )
    SELECT id, site_id, state, defer_until, decided_at, decided_by, decision_note FROM decided`.execute(db);
  const row = result.rows[0];
  return row === undefined ? undefined : toLocked(row);
}
