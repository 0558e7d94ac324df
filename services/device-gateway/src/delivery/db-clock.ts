// The database's clock as this replica measures it (design §3.8, issue 39). What decides a rollout's verdict is
// dated on the database's clock: a target's notification (`now()` in the step) and the deadline it is judged
// against. The delivery record's times come from the replicas, so each replica dates its events on the database's
// clock too: it measures how far its own wall clock is from the database's, and corrects every time it sends by
// that. Before, a replica ten minutes ahead recorded every acknowledgement ten minutes late, and its devices were
// judged failed. A replica whose clock is further from the database's than GATEWAY_CLOCK_MAX_SKEW_MS is also taken
// out of readiness (with a log line saying why): its versions, which devices compare, run on its own clock.
import { errorMessage, type Logger } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';

/** A comparison this often (ms). */
const CHECK_MS = 10_000;
/** Round trips a comparison takes; the one with the shortest round trip is kept (the least uncertain). */
const SAMPLES = 3;

export interface DatabaseClockOptions {
  db: Kysely<GatewayDatabase>;
  logger: Logger;
  /** How far (ms) this replica's clock may be from the database's and the replica stay ready. */
  maxSkewMs: number;
  /** This replica's wall clock (ms since the epoch); tests inject one that is off. */
  wallNow?: () => number;
  checkMs?: number;
}

/** What the delivery recorder needs of a clock: the time to date events with, and its life. */
export interface EventClock {
  /** Now, in ms since the epoch, on the clock events are dated with. */
  now(): number;
  start(): void;
  stop(): void;
}

export class DatabaseClock implements EventClock {
  /** The database's clock minus this replica's (ms), as last measured; 0 before the first comparison. */
  private offset = 0;
  /** Half the round trip of the comparison kept: how far the offset may be off (ms). */
  private uncertainty = 0;
  private measured = false;
  private started = false;
  private outOfStep = false;
  private failing = false;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private readonly wallNow: () => number;

  constructor(private readonly options: DatabaseClockOptions) {
    this.wallNow = options.wallNow ?? Date.now;
  }

  /** Now on the database's clock, as measured (ms since the epoch). */
  now(): number {
    return this.wallNow() + this.offset;
  }

  /** The database's clock minus this replica's (ms), and how far that may be off; undefined before it is known. */
  get measurement(): { offsetMs: number; uncertaintyMs: number } | undefined {
    return this.measured ? { offsetMs: this.offset, uncertaintyMs: this.uncertainty } : undefined;
  }

  /** Compares at once, then every CHECK_MS. */
  start(): void {
    if (this.started) return;
    this.started = true;
    void this.check();
    this.timer = setInterval(() => void this.check(), this.options.checkMs ?? CHECK_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Not ready while the clock is out of step, or (once started) until it has been compared once. */
  readinessProblems(): string[] {
    if (!this.started) return [];
    if (!this.measured) return ["clock not yet compared with the database's"];
    if (!this.outOfStep) return [];
    const ms = Math.round(Math.abs(this.offset));
    const where = this.offset < 0 ? 'ahead of' : 'behind';
    return [
      `clock ${ms} ms ${where} the database's (GATEWAY_CLOCK_MAX_SKEW_MS allows ${this.options.maxSkewMs} ms)`,
    ];
  }

  /** One comparison (the one under way, if any). Resolves when it is done, failed or not. */
  check(): Promise<void> {
    this.running ??= this.compare().finally(() => (this.running = undefined));
    return this.running;
  }

  private async compare(): Promise<void> {
    let best: { offset: number; halfTrip: number } | undefined;
    let failed = false;
    try {
      for (let i = 0; i < SAMPLES; i++) {
        const sentMono = performance.now();
        const sentWall = this.wallNow();
        const { rows } = await sql<{ ms: number }>`
          SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS ms`.execute(this.options.db);
        const halfTrip = (performance.now() - sentMono) / 2;
        // The database read its clock somewhere within the round trip: taken as its middle.
        const offset = rows[0]!.ms - (sentWall + halfTrip);
        if (best === undefined || halfTrip < best.halfTrip) best = { offset, halfTrip };
      }
    } catch (err) {
      if (!this.failing)
        this.options.logger.warn("clock: comparing with the database's failed; the last offset stays", {
          error: errorMessage(err),
          ahead_ms: this.measured ? Math.round(-this.offset) : null,
        });
      this.failing = failed = true;
    }
    // A round trip that came back before a failure still counts.
    if (best === undefined) return;
    if (!failed) this.failing = false;
    this.offset = best.offset;
    this.uncertainty = best.halfTrip;
    this.measured = true;
    // Out of step only when it certainly is: further than the bound by more than the measurement's uncertainty.
    const outOfStep = Math.abs(this.offset) - this.uncertainty > this.options.maxSkewMs;
    const fields = {
      // This replica's clock minus the database's: positive when it is ahead.
      ahead_ms: Math.round(-this.offset),
      max_skew_ms: this.options.maxSkewMs,
      uncertainty_ms: Math.round(this.uncertainty),
    };
    if (outOfStep && !this.outOfStep)
      this.options.logger.error(
        "clock out of step with the database's: this replica is not ready until it is back in step; its delivery events are dated on the database's clock meanwhile",
        fields,
      );
    else if (!outOfStep && this.outOfStep)
      this.options.logger.info("clock back in step with the database's", fields);
    this.outOfStep = outOfStep;
  }
}
