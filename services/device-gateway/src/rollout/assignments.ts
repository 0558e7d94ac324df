// Every replica serves what rollouts assigned, from the database (design §3.9): at every bus resync it reads the
// assignments changed since the last it saw (all of them after a start), and a NOTIFY on the rollout channel
// (sent by the gateway after the commit of a driver's step, a creation or a rollback, migration 0021) makes it
// read again; once it has synced, it also reads every second (POLL_MS), so a lost wake-up (the cluster's NOTIFY
// queue full, a registry delete, which sends none) delays it by a second at most. The notification carries
// nothing but "read": any session may NOTIFY, so a stranger can at most make a replica run one indexed read,
// coalesced with any read already under way. A read that fails after a notification is retried (0.5 s doubling
// to 10 s) until one succeeds.
import { errorMessage, type Logger } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';
import type { PreparedSettings, Settings } from '../domain/documents.js';
import {
  DocumentTooLargeError,
  type Assignment,
  type GatewayState,
  type SettingsValidator,
} from '../domain/gateway-state.js';
import { readAssignments } from './sql.js';

/** Rows per read: a 100,000-device wave is read in a few round trips, each a bounded statement. */
const PAGE = 20_000;
/** A failed read after a notification is tried again after this long, doubling up to RETRY_MAX_MS. */
const RETRY_MIN_MS = 500;
const RETRY_MAX_MS = 10_000;
/**
 * After a read that found nothing, the next notification waits this long (ms): anyone may NOTIFY the channel, and
 * a flood then costs a replica at most 50 empty reads a second (the bus channel's bound, cluster/bus.ts).
 */
const EMPTY_READ_GAP_MS = 20;
/**
 * Once synced, a replica also reads the assignments this often (ms), woken or not: a wake-up can be lost (the
 * cluster's NOTIFY queue full, see sql.ts wakeRolloutReplicas), and then an assignment is served this much later.
 */
const POLL_MS = 1000;

export interface AssignmentSyncOptions {
  db: Kysely<GatewayDatabase>;
  state: Pick<GatewayState, 'prepareAssignment' | 'applyAssignments'>;
  validateSettings: SettingsValidator;
  logger: Logger;
}

export class AssignmentSync {
  /** The highest assignment seq applied here (bigint as text). */
  private lastSeq = '0';
  private running: Promise<void> | undefined;
  private again = false;
  private retry: NodeJS.Timeout | undefined;
  private retryMs = RETRY_MIN_MS;
  private stopped = false;
  /** No read for a notification before this time (ms since the epoch): the last read found nothing. */
  private quietUntil = 0;
  private quietTimer: NodeJS.Timeout | undefined;
  private noticedDuringRead = false;
  private pollTimer: NodeJS.Timeout | undefined;
  readonly stats = { reads: 0, applied: 0, refused: 0, failures: 0 };

  constructor(private readonly options: AssignmentSyncOptions) {}

  /**
   * A notification on the rollout channel: read what changed (its payload is not trusted, nor needed); when the
   * read fails, again later until one succeeds (the failure is counted and logged by the read).
   */
  receive(): void {
    // During a read, one more notification is remembered and passes the gap below once the read is done.
    if (this.running !== undefined) {
      this.noticedDuringRead = true;
      return;
    }
    const waitMs = this.quietUntil - Date.now();
    if (waitMs > 0) {
      if (!this.stopped) {
        this.quietTimer ??= setTimeout(() => {
          this.quietTimer = undefined;
          this.receive();
        }, waitMs);
        this.quietTimer.unref();
      }
      return;
    }
    this.sync().then(
      () => {
        this.retryMs = RETRY_MIN_MS;
      },
      () => this.retryLater(),
    );
  }

  /** No more retries nor timed reads (shutdown). */
  stop(): void {
    this.stopped = true;
    if (this.pollTimer !== undefined) clearInterval(this.pollTimer);
    this.pollTimer = undefined;
    if (this.retry !== undefined) clearTimeout(this.retry);
    this.retry = undefined;
    if (this.quietTimer !== undefined) clearTimeout(this.quietTimer);
    this.quietTimer = undefined;
  }

  private retryLater(): void {
    if (this.stopped || this.retry !== undefined) return;
    const delayMs = this.retryMs;
    this.retryMs = Math.min(this.retryMs * 2, RETRY_MAX_MS);
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.receive();
    }, delayMs);
    this.retry.unref();
  }

  /**
   * Reads and applies every assignment changed since the last read; concurrent calls share one read and at
   * most one more after it. Rejects when the database fails (the next call starts where this one stopped).
   */
  sync(): Promise<void> {
    if (this.running !== undefined) {
      this.again = true;
      return this.running;
    }
    this.running = (async () => {
      try {
        do {
          this.again = false;
          await this.readAll();
        } while (this.again);
        // Synced once: from here on a read every POLL_MS too (one under way is not doubled: receive() below).
        if (!this.stopped && this.pollTimer === undefined) {
          this.pollTimer = setInterval(() => {
            if (this.running === undefined) this.receive();
          }, POLL_MS);
          this.pollTimer.unref();
        }
      } finally {
        this.running = undefined;
        if (this.noticedDuringRead) {
          this.noticedDuringRead = false;
          this.receive();
        }
      }
    })();
    return this.running;
  }

  private async readAll(): Promise<void> {
    for (;;) {
      let rows;
      try {
        rows = await readAssignments(this.options.db, this.lastSeq, PAGE);
      } catch (err) {
        this.stats.failures++;
        this.options.logger.warn('rollout assignments: read failed', { error: errorMessage(err) });
        throw err;
      }
      this.stats.reads++;
      // An empty read holds the next notification back (receive()); one that found rows does not.
      this.quietUntil = rows.length === 0 ? Date.now() + EMPTY_READ_GAP_MS : 0;
      if (rows.length === 0) return;
      // Validated once per distinct settings text (a rollout assigns one document to all its devices).
      const checked = new Map<string, Settings | undefined>();
      const prepared = new Map<string, PreparedSettings>();
      const updates: (Assignment | string)[] = [];
      for (const row of rows) {
        if (row.settings === null) {
          // Applied on every read, the first included: a read is several pages, each its own statement, so a
          // rollback that commits between two pages of a start removes, on a later page, an assignment an
          // earlier page gave (issue 39: such a replica served the rolled-back settings until it restarted).
          // A removal of a device that holds no assignment changes nothing.
          updates.push(row.device_id);
          continue;
        }
        let settings = checked.get(row.settings);
        if (!checked.has(row.settings)) {
          const parsed = JSON.parse(row.settings) as unknown;
          const result = this.options.validateSettings(parsed);
          settings = result.ok ? (parsed as Settings) : undefined;
          checked.set(row.settings, settings);
        }
        try {
          if (settings === undefined) throw new Error('settings are not valid Device Settings');
          const assignment = this.options.state.prepareAssignment(
            row.device_id,
            row.rollout_id,
            settings,
            prepared.get(row.settings),
          );
          prepared.set(row.settings, assignment.settings);
          updates.push(assignment);
        } catch (err) {
          // Written by the creation function from validated settings; refused here only if that was bypassed.
          this.stats.refused++;
          this.options.logger.warn('rollout assignment refused', {
            device_id: row.device_id,
            rollout_id: row.rollout_id,
            error: err instanceof DocumentTooLargeError ? err.message : errorMessage(err),
          });
          updates.push(row.device_id);
        }
      }
      this.stats.applied += this.options.state.applyAssignments(updates);
      this.lastSeq = rows.at(-1)!.seq;
      if (rows.length < PAGE) return;
    }
  }
}
