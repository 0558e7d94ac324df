// POST /sites/{site_id}/work-items/{item_id}/decision (design §4.4).
import { createHash } from 'node:crypto';
import type { DecisionRequest, DecisionResponse } from '@platform/contracts';
import { DomainError } from '@platform/service-kit';
import type { ErrorCode } from '@platform/contracts';
import { inUserTransaction } from '../db/database.js';
import {
  deleteIdempotentResponse,
  decideIfOpen,
  findIdempotentResponse,
  lockWorkItem,
  storeIdempotentResponse,
} from '../db/work-item-repository.js';
import type { DecisionRecord, LockedWorkItem } from '../db/work-item-repository.js';
import type { Executor } from '../db/database.js';
import type { UserScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import { checkDecisionRequest, decide, OPEN_STATES, parseDateTime, stateAfter } from './decision-rules.js';
import type { DecisionProblem } from './decision-rules.js';

export interface DecisionResult {
  item: DecisionResponse;
  /** True when the answer is a stored one replayed for a repeated Idempotency-Key. */
  replayed: boolean;
}

function toResponse(item: LockedWorkItem): DecisionResponse {
  return {
    work_item_id: item.id,
    site_id: item.siteId,
    status: item.state,
    defer_until: item.deferUntil?.toISOString() ?? null,
    decided_at: item.decidedAt?.toISOString() ?? null,
    decided_by: item.decidedBy,
    note: item.decisionNote,
  };
}

/** Called once the request was checked (checkDecisionRequest): a defer's date is an instant by then. */
function deferUntilOf(body: DecisionRequest): Date | null {
  return body.decision === 'defer' && body.defer_until !== undefined
    ? (parseDateTime(body.defer_until) ?? null)
    : null;
}

/**
 * Identifies "the same request" for an Idempotency-Key: target and body, independent of key order and of how
 * the instant is written. Computed before the body is checked (a retry gets its stored answer even once its
 * defer_until passed), so a date that names no instant is compared as written, never thrown on.
 */
function fingerprintOf(siteId: string, itemId: string, body: DecisionRequest): string {
  const canonical = JSON.stringify([
    'POST decision',
    siteId,
    itemId,
    body.decision,
    body.note ?? null,
    body.defer_until === undefined
      ? null
      : (parseDateTime(body.defer_until)?.toISOString() ?? body.defer_until),
  ]);
  return createHash('sha256').update(canonical).digest('hex');
}

/** The answers counted as a decision's `conflict` outcome (workflow_decisions_total). */
const CONFLICTS = new Set<ErrorCode>([
  'work_item_final',
  'idempotency_key_reused',
  'conflict',
  'concurrent_change',
]);

type Outcome = 'transition' | 'unchanged' | 'replayed';

interface Answer {
  item: DecisionResponse;
  replayed: boolean;
  outcome: Outcome;
}

/** An Idempotency-Key and the fingerprint of the request it came with. */
interface KeyUse {
  value: string;
  fingerprint: string;
}

/**
 * Applies a decision (design §4.4): check what the schema cannot, then, in one transaction under the caller's
 * claims, the change and its audit row (applyDecision), then count and log. The item's row lock serialises
 * concurrent decisions (one wins, the others see its result). With an Idempotency-Key the first answer is
 * stored in the same transaction and replayed to retries (design §4.5); the lookup happens after the row
 * lock, so a retry racing its original waits for it and replays it.
 */
export async function decideWorkItem(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  itemId: string,
  body: DecisionRequest,
  idempotencyKey: string | undefined,
): Promise<DecisionResult> {
  const now = ctx.now();
  // With a key, checked only after the replay lookup: a retry must get its stored answer even once its
  // defer_until passed.
  const problems = checkDecisionRequest(body, now);
  if (problems.length > 0 && idempotencyKey === undefined) throw ERRORS.invalidDecision(problems);
  const record: DecisionRecord = {
    itemId,
    siteId,
    decision: body.decision,
    newState: stateAfter[body.decision],
    note: body.note ?? null,
    deferUntil: deferUntilOf(body),
    decidedBy: scope.user.sub,
    decidedAt: now,
    requestId: scope.requestId,
  };
  const key =
    idempotencyKey === undefined
      ? undefined
      : { value: idempotencyKey, fingerprint: fingerprintOf(siteId, itemId, body) };
  let answer: Answer;
  try {
    answer = await inUserTransaction(ctx.db, scope.user, (trx) =>
      applyDecision(trx, record, key, problems, ctx.idempotencyTtlS),
    );
  } catch (err) {
    if (err instanceof DomainError && CONFLICTS.has(err.code)) {
      ctx.counters.decisions.inc({ decision: body.decision, outcome: 'conflict' });
    }
    throw err;
  }
  ctx.counters.decisions.inc({ decision: body.decision, outcome: answer.outcome });
  if (answer.outcome === 'transition') {
    scope.log.info('work item decided', { work_item_id: itemId, site_id: siteId, state: answer.item.status });
  }
  return { item: answer.item, replayed: answer.replayed };
}

/**
 * Inside the transaction. Without a key the common case is one statement (decideIfOpen); when it matches
 * nothing, or with a key, the item is locked and read: unknown → 404, the key's stored answer → replayed,
 * then the transition rule (decisions.ts) decides between the change, the same final state again, and 409.
 */
async function applyDecision(
  trx: Executor,
  record: DecisionRecord,
  key: KeyUse | undefined,
  problems: DecisionProblem[],
  idempotencyTtlS: number,
): Promise<Answer> {
  if (key === undefined) {
    const decided = await decideIfOpen(trx, record, OPEN_STATES);
    if (decided !== undefined) return { item: toResponse(decided), replayed: false, outcome: 'transition' };
  }
  const item = await lockWorkItem(trx, record.siteId, record.itemId);
  if (item === undefined) throw ERRORS.workItemNotFound();
  if (key !== undefined) {
    const stored = await storedAnswer(trx, record, key, idempotencyTtlS);
    if (stored !== undefined) return { item: stored, replayed: true, outcome: 'replayed' };
  }
  if (problems.length > 0) throw ERRORS.invalidDecision(problems);
  const outcome = decide(item.state, record.decision);
  if (outcome.kind === 'conflict') throw ERRORS.workItemFinal(outcome.current, outcome.wanted);
  let after = item;
  if (outcome.kind === 'transition') {
    // The row is locked and open (decide() only transitions open items), so this matches it.
    const decided = await decideIfOpen(trx, record, OPEN_STATES);
    if (decided === undefined) throw new Error('a locked open work item did not accept its decision');
    after = decided;
  }
  const response = toResponse(after);
  if (key !== undefined) {
    await storeIdempotentResponse(trx, {
      callerSub: record.decidedBy,
      key: key.value,
      itemId: record.itemId,
      siteId: record.siteId,
      fingerprint: key.fingerprint,
      status: 200,
      body: response,
      createdAt: record.decidedAt,
    });
  }
  return { item: response, replayed: false, outcome: outcome.kind };
}

/** The caller's stored answer for `key`: undefined when unused or past its lifetime (then forgotten); 409 for another request. */
async function storedAnswer(
  trx: Executor,
  record: DecisionRecord,
  key: KeyUse,
  idempotencyTtlS: number,
): Promise<DecisionResponse | undefined> {
  const stored = await findIdempotentResponse(trx, record.decidedBy, key.value);
  if (stored === undefined) return undefined;
  if (record.decidedAt.getTime() - stored.createdAt.getTime() > idempotencyTtlS * 1000) {
    await deleteIdempotentResponse(trx, record.decidedBy, key.value);
    return undefined;
  }
  if (stored.fingerprint !== key.fingerprint) throw ERRORS.idempotencyKeyReused();
  return stored.body as DecisionResponse;
}
