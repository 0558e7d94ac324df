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
  /** A different decision on a final item: `current` cannot become `wanted`. */
  | { kind: 'conflict'; current: WorkItemStatus; wanted: WorkItemStatus };

/**
 * The open states: an item in one may be decided (a deferred item again and again). The other states,
 * `accepted` and `declined`, are final. The one definition of the rule: decide() reads it, and the one-statement
 * transition (db/work-item-repository.ts decideIfOpen) is handed it for its WHERE clause.
 */
export const OPEN_STATES = ['proposed', 'deferred'] as const satisfies readonly WorkItemStatus[];

export function isOpen(state: WorkItemStatus): boolean {
  return (OPEN_STATES as readonly WorkItemStatus[]).includes(state);
}

/** An open item moves on; on a final item repeating the same decision is a harmless retry, another one is not. */
export function decide(current: WorkItemStatus, decision: Decision): DecisionOutcome {
  const wanted = stateAfter[decision];
  if (isOpen(current)) return { kind: 'transition', state: wanted };
  return wanted === current ? { kind: 'unchanged' } : { kind: 'conflict', current, wanted };
}

export interface DecisionProblem {
  path: string;
  message: string;
}

/** RFC 3339 §5.6 `date-time` whose seconds are 60, split at the seconds: `[before, fraction and offset]`. */
const LEAP_SECOND = /^(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:)60(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;

/**
 * The instant an RFC 3339 `date-time` names, or undefined when it names none. JavaScript (like POSIX time)
 * has no leap seconds, so `Date.parse` gives NaN for second 60, which RFC 3339 allows (§5.6; §5.7 leaves the
 * check of when one may occur to the application; the contracts' format check already allows it only at
 * 23:59 UTC). A leap second is read as PostgreSQL reads it, which stores these times: as the first instant
 * of the next minute (`'2030-06-30T23:59:60Z'::timestamptz` is 2030-07-01 00:00:00+00). One reading for
 * every use (the check, the stored value, an Idempotency-Key's fingerprint), so a request means the same
 * with a key and without one.
 */
export function parseDateTime(text: string): Date | undefined {
  const leap = LEAP_SECOND.exec(text);
  const ms = leap === null ? Date.parse(text) : Date.parse(`${leap[1]}59${leap[2] ?? ''}${leap[3]}`) + 1000;
  return Number.isNaN(ms) ? undefined : new Date(ms);
}

/**
 * The first instant RFC 3339 cannot write in UTC, 10000-01-01T00:00:00Z, in ms since the epoch: its years have
 * four digits (§5.6 `date-fullyear`), and every instant is answered and stored in UTC (`toISOString`, which
 * writes such an instant as the expanded year `+010000-…`, no RFC 3339 date-time at all).
 */
const FIRST_INSTANT_PAST_YEAR_9999_MS = Date.UTC(10000, 0, 1);

/**
 * The rules the schema cannot express: `defer_until` lies in the future, and in UTC it is still an RFC 3339
 * date-time. A valid one can name a later instant: `9999-12-31T23:59:60Z` (the leap second is the next
 * minute's first instant) or `9999-12-31T23:00:00-05:00` both fall in year 10000 in UTC, which no answer could
 * carry. (The contracts schema already requires `defer_until` for "defer", refuses it with the other
 * decisions, and checks its date-time format.)
 */
export function checkDecisionRequest(
  body: { defer_until?: string | undefined },
  now: Date,
): DecisionProblem[] {
  if (body.defer_until === undefined) return [];
  const until = parseDateTime(body.defer_until);
  if (until === undefined) return [{ path: '/defer_until', message: 'must be a date-time' }];
  if (until.getTime() <= now.getTime()) return [{ path: '/defer_until', message: 'must be in the future' }];
  if (until.getTime() >= FIRST_INSTANT_PAST_YEAR_9999_MS) {
    return [
      {
        path: '/defer_until',
        message:
          'must be before 10000-01-01T00:00:00Z: in UTC it falls in year 10000, which an RFC 3339 date-time cannot write',
      },
    ];
  }
  return [];
}
