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
 *   next version is above it (the HLC receive rule); no shared counter and no database write is needed,
 *   which matters because the gateway's database login is read-only.
 * Values stay below Number.MAX_SAFE_INTEGER (2^53 µs ≈ year 2255), so JSON carries them exactly.
 */
export class VersionClock {
  private last = 0;

  constructor(private readonly nowMicros: () => number = wallClockMicros) {}

  next(): number {
    const now = this.nowMicros();
    this.last = now > this.last ? now : this.last + 1;
    return this.last;
  }

  /** HLC receive rule: never issue a version at or below one seen elsewhere. */
  observe(version: number): void {
    if (Number.isSafeInteger(version) && version > this.last) this.last = version;
  }

  get current(): number {
    return this.last;
  }
}

export function wallClockMicros(): number {
  // The wall clock, not the monotonic one: versions must stay comparable with those issued by a previous
  // process or another replica. Within one millisecond the `last + 1` rule supplies up to 1,000 values.
  return Date.now() * 1000;
}
