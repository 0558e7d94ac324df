// The audit rows of changes made at a high rate (a notify, an override's clear; design §3.1): queued when the answer
// has gone out and written one INSERT at a time, each taking every row queued while the one before it ran (a group
// commit), so a burst costs the pool one connection rather than one per row (one INSERT per notify timed out
// waiting for a connection at 1,000/s in the notify benchmark, and took connections the bus and the delivery record
// need). An idle queue writes a row at once, in the turn after it was queued; under a steady flow each INSERT
// waits BATCH_MS after the one before it, so a thousand notifies a second make about 50 INSERTs, not a thousand.
// A write that fails for a reason not the rows' own (the table locked past the statement timeout by a migration or
// a VACUUM FULL, a failover, a lost connection) keeps its rows at the head of the queue and is tried again with a
// backoff: a change answered 200 is recorded once the database takes rows again (second cold review of issue 42).
// While MAX_PENDING rows wait, `requireRoom` refuses further changes with 503 instead of dropping their rows.
import { COMMON_ERRORS, errorMessage, sqlState, type Logger } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';
import type { SiteCatalogue } from '../sites/catalogue.js';
import { insertAuditRows, type AuditRow } from './writer.js';

/** Rows waiting at which changes are refused (requireRoom). */
const MAX_PENDING = 20_000;
/**
 * Rows kept at most: above MAX_PENDING, room for the rows of changes that passed requireRoom before it filled (a
 * check and its row are apart by the change; a third cold review admitted two at 19,999). Past it a row is dropped,
 * counted and logged.
 */
const MAX_KEPT = 2 * MAX_PENDING;
/** Rows in one INSERT at most (a row is at most 4 KiB of detail: a statement stays under ~4 MB). */
const MAX_BATCH = 1000;
/** Between two INSERTs of a steady flow (ms): rows gather into one statement. */
const BATCH_MS = 20;
/** Backoff of a write the database did not take (ms): first, doubling up to the last. */
const RETRY_FIRST_MS = 250;
const RETRY_MAX_MS = 10_000;

/**
 * Whether the refusal is the row's own (the table will refuse it again): a data exception (22), an integrity
 * violation (23) or a trigger's (P0). Anything else is the database's state, and the rows are written later.
 */
function rowsFault(err: unknown): boolean {
  const state = sqlState(err);
  return state !== undefined && (state.startsWith('22') || state.startsWith('23') || state.startsWith('P0'));
}

/**
 * `row` with the company each of its sites belongs to now (`<site>/<company>`), where the catalogue knows it; a row
 * that brings its own (read from the database at the change, sites/confirm.ts) keeps them.
 */
function stamped(row: AuditRow, sites: SiteCatalogue): AuditRow {
  const ids = row.site_ids ?? [];
  if (ids.length === 0 || !sites.platform || (row.site_companies?.length ?? 0) > 0) return row;
  return { ...row, site_companies: sites.companyPairs(ids).sort() };
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref());

export class AuditQueue {
  private pending: AuditRow[] = [];
  private flushing: Promise<void> | undefined;
  private dropped = 0;
  private retryMs = RETRY_FIRST_MS;
  /**
   * Rows in the next INSERT at most: halved by each write the database did not take, doubled back by each it took.
   * A batch that times out on a slow database is not tried whole forever (a loaded test machine's 1000-row INSERT
   * outlasted a 300 ms statement timeout, again and again).
   */
  private batchSize = MAX_BATCH;
  /** Set by `flush({ final: true })` (shutdown): a failed write is logged whole instead of tried again. */
  private final = false;

  /**
   * `sites`: the platform's sites now. A row is stamped with each site's company when it is queued, at the change,
   * not when it is written (a row written after its site changed company was stamped with the new one; migration
   * 0038). Without it the database stamps rows at the insert.
   */
  constructor(
    private readonly db: Kysely<GatewayDatabase>,
    private readonly logger: Pick<Logger, 'error' | 'warn'>,
    private readonly sites?: () => SiteCatalogue,
  ) {}

  /** Rows waiting to be written. */
  get waiting(): number {
    return this.pending.length;
  }

  /**
   * Throws 503 backend_unavailable while the queue is full: a change whose row could not be kept is not made. Called
   * by the routes before a change that is audited through the queue.
   */
  requireRoom(): void {
    if (this.pending.length >= MAX_PENDING)
      throw COMMON_ERRORS.databaseUnreachable(new Error('the audit rows cannot be written at the moment'));
  }

  /** Queues a row; it is written by the next INSERT (at once when none runs). */
  add(row: AuditRow): void {
    if (this.pending.length >= MAX_KEPT) {
      this.dropped++;
      return;
    }
    this.pending.push(this.sites === undefined ? row : stamped(row, this.sites()));
    if (this.flushing === undefined) setImmediate(() => void this.flush());
  }

  /**
   * Writes what is queued (and what comes while it writes); resolves when it is written, or refused and logged.
   * While the database does not take rows it keeps trying; `final` (shutdown) tries once and logs what is left.
   */
  flush(options: { final?: boolean } = {}): Promise<void> {
    if (options.final === true) this.final = true;
    this.flushing ??= this.drain().finally(() => (this.flushing = undefined));
    return this.flushing;
  }

  private async drain(): Promise<void> {
    let first = true;
    while (this.pending.length > 0) {
      if (!first && this.pending.length < this.batchSize) await sleep(BATCH_MS);
      first = false;
      const batch = this.pending.slice(0, this.batchSize);
      const written = await this.write(batch);
      this.pending.splice(0, written);
      if (written === batch.length) {
        this.retryMs = RETRY_FIRST_MS;
        this.batchSize = Math.min(this.batchSize * 2, MAX_BATCH);
        continue;
      }
      this.batchSize = Math.max(1, Math.floor(this.batchSize / 2));
      // The database did not take them: the rest stays at the head of the queue.
      if (this.final) {
        this.logLost(this.pending.splice(0));
        break;
      }
      this.logger.warn('audit rows not written yet; trying again', {
        rows: this.pending.length,
        retry_in_ms: this.retryMs,
      });
      await sleep(this.retryMs);
      this.retryMs = Math.min(this.retryMs * 2, RETRY_MAX_MS);
    }
    if (this.dropped > 0) {
      this.logger.error('audit rows dropped: more than MAX_KEPT were waiting', { rows: this.dropped });
      this.dropped = 0;
    }
  }

  /**
   * Writes `batch` in one INSERT; when the table refuses one of its rows, row by row, dropping (and logging) each
   * refused one. Returns how many rows of the batch are done (written or refused): fewer than all when the database
   * itself failed, and the rest must be tried again.
   */
  private async write(batch: AuditRow[]): Promise<number> {
    try {
      await insertAuditRows(this.db, batch);
      return batch.length;
    } catch (err) {
      if (!rowsFault(err)) return 0;
    }
    let done = 0;
    for (const row of batch) {
      try {
        await insertAuditRows(this.db, [row]);
      } catch (err) {
        if (!rowsFault(err)) return done;
        this.logger.error('audit row refused by the table', {
          rows: 1,
          actions: [row.action],
          request_id: row.request_id,
          error: errorMessage(err),
        });
      }
      done++;
    }
    return done;
  }

  /** Rows a stopping process could not write: logged whole (audit rows hold no secrets), for the record. */
  private logLost(rows: AuditRow[]): void {
    for (let i = 0; i < rows.length; i += 100)
      this.logger.error('audit rows not written before the process stopped', {
        rows: rows.length,
        lost: rows.slice(i, i + 100),
      });
  }
}
