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
} from '../db/work-items.js';
import type { LockedWorkItem } from '../db/work-items.js';
import type { UserScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import { checkDecisionRequest, decide, parseDateTime, stateAfter } from './decisions.js';

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

/** decideIfOpen on an item this transaction holds locked in an open state: it must match. */
async function decideOrFail(...args: Parameters<typeof decideIfOpen>): Promise<LockedWorkItem> {
  const decided = await decideIfOpen(...args);
  if (decided === undefined) throw new Error('a locked open work item did not accept its decision');
  return decided;
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

/**
 * Applies a decision. The item's row lock serialises concurrent decisions (one wins, the others see
 * its result); the state change and its audit row commit together or not at all. With an
 * Idempotency-Key the first answer is stored in the same transaction and replayed to retries; the
 * lookup happens after the row lock, so a retry racing its original waits for it and replays it.
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
  // Checked after a replay lookup: a retry must get its stored answer even once defer_until passed.
  const problems = checkDecisionRequest(body, now);
  if (problems.length > 0 && idempotencyKey === undefined) throw ERRORS.invalidDecision(problems);
  const sub = scope.user.sub;
  const fingerprint = idempotencyKey === undefined ? undefined : fingerprintOf(siteId, itemId, body);

  try {
    const result = await inUserTransaction(ctx.db, scope.user, async (trx) => {
      if (idempotencyKey === undefined) {
        // No replay to look up first: try the one-statement transition.
        const decided = await decideIfOpen(trx, {
          itemId,
          siteId,
          decision: body.decision,
          newState: stateAfter[body.decision],
          note: body.note ?? null,
          deferUntil: deferUntilOf(body),
          decidedBy: sub,
          decidedAt: now,
          requestId: scope.requestId,
        });
        if (decided !== undefined)
          return { item: toResponse(decided), replayed: false, outcome: 'transition' as const };
      }
      const item = await lockWorkItem(trx, siteId, itemId);
      if (item === undefined) throw ERRORS.workItemNotFound();

      if (idempotencyKey !== undefined) {
        const stored = await findIdempotentResponse(trx, sub, idempotencyKey);
        if (stored !== undefined && now.getTime() - stored.createdAt.getTime() > ctx.idempotencyTtlS * 1000) {
          await deleteIdempotentResponse(trx, sub, idempotencyKey);
        } else if (stored !== undefined) {
          if (stored.fingerprint !== fingerprint) throw ERRORS.idempotencyKeyReused();
          return { item: stored.body as DecisionResponse, replayed: true, outcome: 'replayed' as const };
        }
      }

      if (problems.length > 0) throw ERRORS.invalidDecision(problems);
      const outcome = decide(item.state, body.decision);
      let after = item;
      switch (outcome.kind) {
        case 'conflict':
          throw ERRORS.workItemFinal(outcome.current, outcome.wanted);
        case 'unchanged':
          break;
        case 'transition':
          // The row is locked and open (decide() only transitions open items), so this matches it.
          after = await decideOrFail(trx, {
            itemId,
            siteId,
            decision: body.decision,
            newState: outcome.state,
            note: body.note ?? null,
            deferUntil: deferUntilOf(body),
            decidedBy: sub,
            decidedAt: now,
            requestId: scope.requestId,
          });
          break;
      }
      const response = toResponse(after);
      if (idempotencyKey !== undefined && fingerprint !== undefined) {
        await storeIdempotentResponse(trx, {
          callerSub: sub,
          key: idempotencyKey,
          itemId,
          siteId,
          fingerprint,
          status: 200,
          body: response,
          createdAt: now,
        });
      }
      return { item: response, replayed: false, outcome: outcome.kind };
    });
    ctx.counters.decisions.inc({ decision: body.decision, outcome: result.outcome });
    if (result.outcome === 'transition') {
      scope.log.info('work item decided', {
        work_item_id: itemId,
        site_id: siteId,
        state: result.item.status,
      });
    }
    return { item: result.item, replayed: result.replayed };
  } catch (err) {
    if (err instanceof DomainError && CONFLICTS.has(err.code)) {
      ctx.counters.decisions.inc({ decision: body.decision, outcome: 'conflict' });
    }
    throw err;
  }
}
