/**
 * Document versions: a hybrid logical clock in microseconds.
 *
 * `next()` returns max(last + 1, wall-clock µs). Why this scheme:
 * - strictly increasing within a process, whatever the wall clock does (the `last + 1` term);
 * - across restarts without writing anything: a restarted process starts from the wall clock, which has
 *   moved past every version the previous process issued as long as that process did not run ahead of
 *   the clock (it only runs ahead by issuing more than one version per microsecond, which a gateway
 *   cannot sustain: a 100,000-device reload issues 100,000 versions in far more than 0.1 s) and the
 *   clock was not stepped back by more than the downtime (NTP slews, it does not step, in normal operation);
 * - across replicas (design §3.6): a replica that learns a version from another one calls `observe(v)`, so its
 *   next version is above it (the HLC receive rule); no shared counter and no database write is needed.
 *
 * A version from elsewhere is believed only within MAX_AHEAD_MICROS (70 s) of this replica's wall clock: one far ahead
 * (a poisoned row, a replica whose clock jumped) would otherwise drag every later version with it, up to
 * 2^53 - 1, after which versions could not rise at all. The bus's publishing functions (migration 0017) refuse the
 * same versions against the database's clock, so a refusal here means a clock out of step, which the caller logs.
 * Values stay at most Number.MAX_SAFE_INTEGER (2^53 - 1 µs ≈ year 2255), so JSON carries them exactly; `next()`
 * throws rather than pass it.
 */
export class VersionClock {
  private last = 0;

  constructor(private readonly nowMicros: () => number = wallClockMicros) {}

  next(): number {
    const now = this.nowMicros();
    const next = now > this.last ? now : this.last + 1;
    if (!Number.isSafeInteger(next)) throw new RangeError('the version clock would pass 2^53 - 1');
    this.last = next;
    return next;
  }

  /**
   * HLC receive rule: never issue a version at or below one seen elsewhere. Returns false, and changes nothing,
   * for a version that is not a positive safe integer or is more than MAX_AHEAD_MICROS ahead of this clock.
   */
  observe(version: number): boolean {
    if (!isPlausibleVersion(version, this.nowMicros())) return false;
    if (version > this.last) this.last = version;
    return true;
  }

  get current(): number {
    return this.last;
  }
}

/**
 * How far ahead of the local wall clock (µs) a version from elsewhere may be: 70 s. The publishing functions
 * (migration 0017) refuse more than 60 s ahead of the database's clock, so a replica within 10 s of the database
 * never refuses what the database accepted (a cold review: with equal bounds, a replica a second behind refused a
 * stamp 59.5 s ahead that every other replica served). A replica further out of step than that is not ready
 * anyway: GATEWAY_CLOCK_MAX_SKEW_MS is at most 10 s (config.ts).
 */
export const MAX_AHEAD_MICROS = 70_000_000;

/** A positive safe integer at most MAX_AHEAD_MICROS ahead of `nowMicros`. */
export function isPlausibleVersion(version: number, nowMicros: number = wallClockMicros()): boolean {
  return Number.isSafeInteger(version) && version > 0 && version <= nowMicros + MAX_AHEAD_MICROS;
}

export function wallClockMicros(): number {
  // The wall clock, not the monotonic one: versions must stay comparable with those issued by a previous
  // process or another replica. Within one millisecond the `last + 1` rule supplies up to 1,000 values.
  return Date.now() * 1000;
}
