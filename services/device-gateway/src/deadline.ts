// Deadlines for the device view (design §3.8): a wait that gives up, and turns at a shared resource.

/**
 * How long past the device view's deadline (GATEWAY_DEVICE_VIEW_DEADLINE_MS) a read it started may still come
 * back (ms): the other replicas' stored answers, the delivery record.
 */
export const READ_GRACE_MS = 250;

/** `promise`, or the error `timedOut()` makes once `ms` have passed (the promise itself is not cancelled). */
export function withDeadline<T>(
  promise: Promise<T>,
  ms: number,
  timedOut: () => Error = () => new Error(`no answer within ${ms} ms`),
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(timedOut()), Math.max(0, ms));
    }),
  ]).finally(() => clearTimeout(timer));
}

/** At most `n` holders at once; a taker waits its turn for up to `ms`. */
export class Turns {
  private readonly waiting: (() => void)[] = [];
  constructor(private free: number) {}

  /** Whether the turn came within `ms`; if so, `give()` once done. */
  take(ms: number): Promise<boolean> {
    if (this.free > 0) {
      this.free--;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const turn = (): void => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.waiting.splice(this.waiting.indexOf(turn), 1);
        resolve(false);
      }, ms);
      this.waiting.push(turn);
    });
  }

  give(): void {
    const next = this.waiting.shift();
    if (next === undefined) this.free++;
    else next();
  }
}
