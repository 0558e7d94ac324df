// An open-loop load driver: requests start on a fixed schedule whether or not earlier ones finished.

/**
 * Calls `fire(i)` for i = 0 … total-1 at `ratePerS`, and resolves with what the calls returned once
 * all have settled. Paced by a 2 ms timer rather than a busy loop: on a 2-core machine a spinning
 * client would take a core from the system measured. A late timer fires the overdue calls at once;
 * each caller takes its own send time, which is what latency is measured from. Not the scheduled time:
 * the 2 ms timer would add up to 2 ms of the generator's own lateness to every sample. The price is that
 * a stall of the generator itself (its GC, losing the CPU) is not counted: a small undercount of the
 * tail when the machine is saturated.
 */
export async function openLoop<T>(
  ratePerS: number,
  total: number,
  fire: (i: number) => Promise<T>,
): Promise<T[]> {
  const intervalMs = 1000 / ratePerS;
  const pending: Promise<T>[] = [];
  const t0 = performance.now();
  await new Promise<void>((done) => {
    const tick = (): void => {
      const due = Math.min(total, Math.floor((performance.now() - t0) / intervalMs) + 1);
      while (pending.length < due) pending.push(fire(pending.length));
      if (pending.length < total) setTimeout(tick, 2);
      else done();
    };
    tick();
  });
  return Promise.all(pending);
}
