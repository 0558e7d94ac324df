// The audit rows of changes made at a high rate (a notify, an override's clear; design §3.1): queued when the answer
// has gone out and written one INSERT at a time, each taking every row queued while the one before it ran (a group
// commit), so a burst costs the pool one connection rather than one per row (one INSERT per notify timed out
// waiting for a connection at 1,000/s in the notify benchmark, and took connections the bus and the delivery record
// need). An idle queue writes a row at once, in the turn after it was queued; under a steady flow each INSERT
// waits BATCH_MS after the one before it, so a thousand notifies a second make about 50 INSERTs, not a thousand.
import { errorMessage, type Logger } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';
import { insertAuditRows, type AuditRow } from './writer.js';

/** Rows kept waiting at most; past it a row is dropped and counted (logged with the next write). */
const MAX_PENDING = 20_000;
/** Rows in one INSERT at most (a row is at most 4 KiB of detail: a statement stays under ~4 MB). */
const MAX_BATCH = 1000;
/** Between two INSERTs of a steady flow (ms): rows gather into one statement. */
const BATCH_MS = 20;

export class AuditQueue {
  private pending: AuditRow[] = [];
  private flushing: Promise<void> | undefined;
  private dropped = 0;

  constructor(
    private readonly db: Kysely<GatewayDatabase>,
    private readonly logger: Pick<Logger, 'error'>,
  ) {}

  /** Queues a row; it is written by the next INSERT (at once when none runs). */
  add(row: AuditRow): void {
    if (this.pending.length >= MAX_PENDING) {
      this.dropped++;
      return;
    }
    this.pending.push(row);
    if (this.flushing === undefined) setImmediate(() => void this.flush());
  }

  /** Writes what is queued (and what comes while it writes); resolves when it is written or logged. */
  flush(): Promise<void> {
    this.flushing ??= this.drain().finally(() => (this.flushing = undefined));
    return this.flushing;
  }

  private async drain(): Promise<void> {
    let first = true;
    while (this.pending.length > 0) {
      if (!first && this.pending.length < MAX_BATCH)
        await new Promise<void>((resolve) => setTimeout(resolve, BATCH_MS));
      first = false;
      const batch = this.pending.splice(0, MAX_BATCH);
      await insertAuditRows(this.db, batch).catch(async (err: unknown) => {
        // One row the table refuses must not take the batch with it: the rows again, one at a time.
        if (batch.length > 1)
          for (const row of batch)
            await insertAuditRows(this.db, [row]).catch((one: unknown) => {
              this.logger.error('audit rows not written', {
                rows: 1,
                actions: [row.action],
                error: errorMessage(one),
              });
            });
        else
          this.logger.error('audit rows not written', {
            rows: batch.length,
            actions: [...new Set(batch.map((r) => r.action))],
            error: errorMessage(err),
          });
      });
    }
    if (this.dropped > 0) {
      this.logger.error('audit rows dropped: more than MAX_PENDING were waiting', { rows: this.dropped });
      this.dropped = 0;
    }
  }
}
