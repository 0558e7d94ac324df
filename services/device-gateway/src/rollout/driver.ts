// The rollout driver (design §3.9): every replica runs this loop, and exactly one of them, the holder of the
// lease row in PostgreSQL, advances rollouts. Each tick renews (or tries to take) the lease, then, as holder,
// runs one step: one transaction of `rollout_step`, which checks the lease again under a row lock, so a replica
// whose lease ran out while it was paused (GC, a stalled network) cannot act. Progress lives in the database
// (targets' outcomes, read from the delivery record), so a new holder goes on where the last one stopped.
import { errorMessage, type Logger } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import { audit } from '../audit/writer.js';
import { DRIVER } from '../auth/principal.js';
import type { GatewayDatabase } from '../db/tables.js';
import {
  deliveryLagMs,
  driverDecisions,
  lastAuditedDriverEvent,
  pauseHandedOver,
  rolloutSites,
  releaseLease,
  rolloutCounts,
  step,
  takeLease,
  wakeRolloutReplicas,
  type RolloutState,
} from './sql.js';

export interface RolloutDriverOptions {
  db: Kysely<GatewayDatabase>;
  /** This replica's id (the bus origin): the lease's holder. */
  replica: string;
  logger: Logger;
  /** The lease lasts this long (ms) unless renewed: the longest a dead driver is waited for. */
  leaseMs: number;
  /** A tick this often (ms); well under leaseMs, so the holder renews in time. */
  stepMs: number;
  /** Devices one step assigns at most (a busy driver steps again at once). */
  maxAssign: number;
  /**
   * How far the delivery record may lag a device (ms; design §3.8: two flush intervals and a write): a device
   * is judged failed only once its deadline plus this has passed, or plus how far the record is behind on the
   * live replicas (`delivery_lag_ms`), whichever is more.
   */
  recordLagMs: number;
  /**
   * The longest wait for a record that is behind (ms; GATEWAY_ROLLOUT_RECORD_WAIT_MS, at least recordLagMs as
   * config.ts makes it): past it, devices are judged on the record as it stands, with a warning, so a replica
   * whose writes stall cannot hold every wave.
   */
  recordWaitMaxMs: number;
  /** After a step that assigned something (the replica without a bus reads its assignments here). */
  onAssigned?: () => void;
  /**
   * Closes, when the driver stops (the gateway's shutdown stops it), the connections the rollouts opened besides
   * the shared pool: the creation's (rollout/service.ts), and on a replica without the bus `db` itself, the
   * driver's own connection named `device-gateway-driver <replica>`, which is what makes this replica count as
   * up for the lease (migration 0019; with the bus, the bus's LISTEN session does, and `db` is the shared pool).
   */
  closeDb?: () => Promise<void>;
}

/** The driver's decisions audited at most in one tick (a backlog is caught up tick by tick). */
const DECISIONS_AUDITED = 100;

export interface DriverStats {
  steps: number;
  assigned: number;
  failures: number;
  terms: number;
}

export class RolloutDriver {
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;
  /** Not ticking: before start() and after stop(). */
  private stopped = true;
  private holder = false;
  private lastCounts = 0;
  /** The last step assigned a full batch: the next one follows at once. */
  private busy = false;
  /** The last driver event audited (undefined: not read yet this term; null: none ever). */
  private audited: string | null | undefined;
  /** What the last judging step found of the record's lag, when it was not usable (warned once a streak). */
  private lagTrouble: 'unreadable' | 'too-far' | undefined;
  /** The last handover check failed (logged once a streak). */
  private handoverTrouble = false;
  readonly stats: DriverStats = { steps: 0, assigned: 0, failures: 0, terms: 0 };
  /** Open rollouts by state (and aborted), as the driver last read them; empty on other replicas. */
  counts: { state: RolloutState; aborted: boolean; n: number }[] = [];

  constructor(private readonly options: RolloutDriverOptions) {}

  /** Whether this replica held the lease at its last tick. */
  get isDriver(): boolean {
    return this.holder;
  }

  start(): void {
    this.stopped = false;
    this.schedule(0);
  }

  /**
   * Stops ticking and gives the lease up, so another replica takes over at its next tick; then closes the
   * driver's own connection, if it has one.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    await this.ticking;
    if (this.holder) {
      this.holder = false;
      await releaseLease(this.options.db, this.options.replica).catch((err: unknown) => {
        this.options.logger.warn('rollout driver: releasing the lease failed', { error: errorMessage(err) });
      });
    }
    await this.options.closeDb?.();
  }

  /** A tick soon, when this replica drives (started): a creation or resume need not wait for the next one. */
  wake(): void {
    if (!this.stopped && this.ticking === undefined) this.schedule(0);
  }

  /** One tick now, or the one under way. */
  tick(): Promise<void> {
    this.ticking ??= this.run().finally(() => (this.ticking = undefined));
    return this.ticking;
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.tick(), ms);
    this.timer.unref();
  }

  /**
   * How long past a device's deadline its acknowledgement may still be on its way to the record (ms): the
   * configured allowance, or how far behind the live replicas' records are, whichever is more (design §3.9),
   * at most recordWaitMaxMs.
   */
  private async recordAllowance(): Promise<number> {
    const { recordLagMs, recordWaitMaxMs: max } = this.options;
    let behind: number;
    try {
      behind = await deliveryLagMs(this.options.db);
    } catch (err) {
      // Unknown (no delivery_lag_ms because the code rolled before migration 0014, operations §6; a timeout; a
      // grant gone): wait the longest, and step anyway, so assignments go on and no device is judged early.
      this.trouble(
        'unreadable',
        'reading how far the delivery record is behind failed; waiting the longest',
        {
          error: errorMessage(err),
          wait_max_ms: max,
        },
      );
      return max;
    }
    if (behind <= max) {
      this.lagTrouble = undefined;
      return Math.max(recordLagMs, behind);
    }
    this.trouble(
      'too-far',
      'the delivery record is further behind than the wait allows; judging as it stands',
      {
        behind_ms: behind,
        wait_max_ms: max,
      },
    );
    return max;
  }

  /**
   * Audits the driver's own halts (paused by the success criterion or for a site handed to another company,
   * aborted by the abort criterion) and completions since the last audited one (issue 42 §4), as `driver`, each
   * row with its rollout event's id; at most DECISIONS_AUDITED a tick. A failure is logged and tried again at the
   * next tick; the step stands.
   */
  private async auditDecisions(): Promise<void> {
    const { db, logger } = this.options;
    try {
      if (this.audited === undefined) this.audited = await lastAuditedDriverEvent(db);
      const decisions = await driverDecisions(db, this.audited, DECISIONS_AUDITED);
      for (const d of decisions) {
        const reason = d.kind === 'completed' ? undefined : (d.reason ?? d.detail ?? undefined);
        await audit.rolloutChanged(
          db,
          { principal: DRIVER },
          {
            rolloutId: d.rollout_id,
            siteIds: await rolloutSites(db, d.rollout_id),
            change: d.kind,
            eventId: d.event_id,
            ...(reason === undefined ? {} : { reason }),
          },
        );
        this.audited = d.event_id;
      }
    } catch (err) {
      logger.error('rollout driver: audit of its decisions not written; trying again at the next tick', {
        error: errorMessage(err),
      });
    }
  }

  /**
   * Pauses the active rollouts that reach a site the portal handed to another company since their creation
   * (design §3.9, migration 0043): neither company's scoped operators can see such a rollout (0041), so it must not
   * go on by itself; an unscoped operator resumes or cancels it. Before the step, so it assigns no further device;
   * the pauses are the driver's halts, audited with the others. A failure (a timeout, the code rolled before 0043)
   * is logged once a streak and the step goes on: the check is tried again at the next tick.
   */
  private async pauseHandedOver(): Promise<void> {
    const { db, replica, logger } = this.options;
    try {
      const paused = await pauseHandedOver(db, replica);
      this.handoverTrouble = false;
      if (paused.length > 0)
        logger.warn('rollout driver: paused rollouts that reach a site handed to another company', {
          rollout_ids: paused,
        });
    } catch (err) {
      if (!this.handoverTrouble)
        logger.error(
          'rollout driver: the check for sites handed to another company failed; stepping anyway',
          { error: errorMessage(err) },
        );
      this.handoverTrouble = true;
    }
  }

  /** Logs `message` when the lag's trouble changes to `kind` (once a streak). */
  private trouble(kind: 'unreadable' | 'too-far', message: string, fields: Record<string, unknown>): void {
    if (this.lagTrouble !== kind) this.options.logger.warn(`rollout driver: ${message}`, fields);
    this.lagTrouble = kind;
  }

  private async run(): Promise<void> {
    const { db, replica, logger } = this.options;
    try {
      const held = await takeLease(db, replica, this.options.leaseMs);
      if (held !== this.holder) {
        this.holder = held;
        if (held) this.stats.terms++;
        // A new term reads where the audit of the driver's decisions stopped (another replica may have driven).
        this.audited = undefined;
        logger.info(held ? 'rollout driver: this replica drives rollouts' : 'rollout driver: lease lost', {
          replica,
        });
      }
      if (!held) {
        this.counts = [];
        return;
      }
      // The steps of a busy streak (a full batch assigned, the next step at once) only assign; the step after
      // it, a tick later, reads the outcomes.
      const judge = !this.busy;
      await this.pauseHandedOver();
      const lagMs = judge ? await this.recordAllowance() : this.options.recordLagMs;
      const result = await step(db, replica, this.options.maxAssign, judge, lagMs);
      this.stats.steps++;
      const assigned = result.assigned ?? 0;
      this.stats.assigned += assigned;
      this.busy = assigned >= this.options.maxAssign;
      await this.auditDecisions();
      if (assigned > 0) {
        // After the step's commit, in a statement of its own (migration 0021); a lost one delays the replicas by
        // their timer's second, never the step.
        await wakeRolloutReplicas(db, 'a', logger);
        this.options.onAssigned?.();
      }
      if (Date.now() - this.lastCounts >= 5000 || assigned > 0) {
        this.lastCounts = Date.now();
        this.counts = await rolloutCounts(db);
      }
    } catch (err) {
      this.stats.failures++;
      this.busy = false;
      logger.warn('rollout driver: step failed; retrying at the next tick', { error: errorMessage(err) });
    } finally {
      this.schedule(this.busy ? 0 : this.options.stepMs);
    }
  }
}
