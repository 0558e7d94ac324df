// The work-item decision rules of design §4.4, free of transport and storage.
import type { Decision, WorkItemStatus } from '@platform/contracts';

export const stateAfter = {
  accept: 'accepted',
  defer: 'deferred',
  decline: 'declined',
} as const satisfies Record<Decision, WorkItemStatus>;

export type DecisionOutcome =
  /** The item moves to `state`; an audit row is written. */
  | { kind: 'transition'; state: WorkItemStatus }
  /** The same final decision again: answer with the item as it is, write nothing. */
  | { kind: 'unchanged' }
  /** A different decision on a final item. */
  | { kind: 'conflict'; detail: string };

/**
 * `proposed` and `deferred` items may be decided (a deferred item again and again); `accepted` and
 * `declined` are final for the client, where repeating the same decision is a harmless retry.
 */
export function decide(current: WorkItemStatus, decision: Decision): DecisionOutcome {
  switch (current) {
    case 'proposed':
    case 'deferred':
      return { kind: 'transition', state: stateAfter[decision] };
    case 'accepted':
    case 'declined':
      return stateAfter[decision] === current
        ? { kind: 'unchanged' }
        : {
            kind: 'conflict',
            detail: `The work item is already ${current}; it cannot be changed to ${stateAfter[decision]}.`,
          };
  }
}

export interface DecisionProblem {
  path: string;
  message: string;
}

/**
 * The rule the schema cannot express: `defer_until` lies in the future. (The contracts schema already
 * requires it for "defer", refuses it with the other decisions, and checks its date-time format.)
 */
export function checkDecisionRequest(
  body: { defer_until?: string | undefined },
  now: Date,
): DecisionProblem[] {
  if (body.defer_until === undefined) return [];
  const until = Date.parse(body.defer_until);
  // RFC 3339 allows a leap second (…:60Z), which the format check accepts and Date cannot represent.
  if (Number.isNaN(until)) return [{ path: '/defer_until', message: 'must be a date-time' }];
  if (until <= now.getTime()) return [{ path: '/defer_until', message: 'must be in the future' }];
  return [];
}
