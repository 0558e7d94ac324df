import { COMMON_ERRORS, DomainError } from '../errors.js';
import { QUERY_DEADLINE_MESSAGE } from './create-db.js';

/** Node socket errors that mean the server cannot be reached or the connection broke. */
const socketErrorCodes = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
]);

/**
 * SQLSTATEs outside class 08 (connection exception) that also mean "this connection or server is
 * gone": 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now (starting up or
 * shutting down), 57P05 idle_session_timeout, 53300 too_many_connections.
 */
const connectionSqlStates = new Set(['57P01', '57P02', '57P03', '57P05', '53300']);

/**
 * Messages of errors node-postgres and pg-pool raise without a code when a connection breaks or
 * cannot be made in time (pg-pool `connectionTimeoutMillis`), or the pool is already shut down.
 */
const connectionMessages = [
  'Connection terminated',
  'timeout exceeded when trying to connect',
  'Client has encountered a connection error and is not queryable',
  'Client was closed and is not queryable',
  'Cannot use a pool after calling end on the pool',
  // createDb's client-side statement deadline: the server stopped answering on this connection.
  QUERY_DEADLINE_MESSAGE,
];

/**
 * Client-side deadlines that passed: a statement's (createDb `queryTimeoutMs`), waiting for a free
 * connection, or opening one (pg-pool and node-postgres at `connectionTimeoutMillis`).
 */
const deadlineMessages = [
  QUERY_DEADLINE_MESSAGE,
  'timeout exceeded when trying to connect',
  'Connection terminated due to connection timeout',
];

interface ErrorLike {
  code?: unknown;
  message?: unknown;
  cause?: unknown;
  errors?: unknown;
}

/** The error and what it wraps: `cause` chains and the members of an AggregateError (Node's
 * happy-eyeballs connect reports one failure per address). Bounded against cycles. */
function unwrap(err: unknown): ErrorLike[] {
  const found: ErrorLike[] = [];
  const pending: unknown[] = [err];
  while (pending.length > 0 && found.length < 16) {
    const next = pending.shift();
    if (typeof next !== 'object' || next === null || found.includes(next)) continue;
    const e = next as ErrorLike;
    found.push(e);
    if (e.cause !== undefined) pending.push(e.cause);
    if (Array.isArray(e.errors)) pending.push(...(e.errors as unknown[]));
  }
  return found;
}

/** The PostgreSQL SQLSTATE of a server error (five characters), if there is one. */
export function sqlState(err: unknown): string | undefined {
  for (const e of unwrap(err)) {
    if (typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code)) return e.code;
  }
  return undefined;
}

/** True when the database could not be reached or the connection broke (not a query's fault). */
export function isConnectionError(err: unknown): boolean {
  return unwrap(err).some((e) => {
    if (typeof e.code === 'string') {
      if (socketErrorCodes.has(e.code)) return true;
      if (e.code.startsWith('08') && e.code.length === 5) return true;
      if (connectionSqlStates.has(e.code)) return true;
    }
    return (
      typeof e.message === 'string' &&
      connectionMessages.some((m) => e.message === m || (e.message as string).includes(m))
    );
  });
}

/** 40001 serialization_failure, 40P01 deadlock_detected: the transaction may simply be retried. */
export function isRetryableTransactionError(err: unknown): boolean {
  const state = sqlState(err);
  return state === '40001' || state === '40P01';
}

/**
 * Turns a database failure the client can act on into a DomainError; rethrows anything else
 * (a bug: the HTTP edge answers a generic 500 and logs it). Details never include SQL, constraint
 * names or server messages. Use as `catch (err) { throw mapDbError(err); }`.
 *
 * | condition | result |
 * |---|---|
 * | client-side deadline passed (statement, or waiting for a connection) | backend_unavailable 503, Retry-After 5 |
 * | connection refused/lost, 08xxx, 57P01-03/05, 53300 | backend_unavailable 503, Retry-After 5 |
 * | 57014 query_canceled (statement_timeout), class 53 resources, 25006 read-only (failover) | backend_unavailable 503 |
 * | 23505 unique, 23P01 exclusion | conflict 409 (retrying the same request fails the same way) |
 * | 40001 serialization, 40P01 deadlock | concurrent_change 409 (retry it; see isRetryableTransactionError) |
 * | 55P03 lock_not_available | concurrent_change 409 (retry it) |
 */
export function mapDbError(err: unknown): DomainError {
  if (err instanceof DomainError) return err;
  if (unwrap(err).some((e) => typeof e.message === 'string' && deadlineMessages.includes(e.message)))
    return COMMON_ERRORS.databaseTimedOut(err);
  if (isConnectionError(err)) return COMMON_ERRORS.databaseUnreachable(err);
  const state = sqlState(err);
  if (state === undefined) throw err;
  if (state === '57014') return COMMON_ERRORS.databaseTimedOut(err);
  if (state === '25006' || state.startsWith('53')) return COMMON_ERRORS.databaseBusy(err);
  switch (state) {
    case '23505':
    case '23P01':
      return COMMON_ERRORS.alreadyExists(err);
    case '40001':
    case '40P01':
      return COMMON_ERRORS.concurrentChange(err);
    case '55P03':
      return COMMON_ERRORS.locked(err);
    default:
      throw err;
  }
}
