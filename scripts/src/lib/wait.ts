// Waiting for a service the scripts started.

export interface WaitReadyOptions {
  timeoutMs: number;
  /** Pause between two probes, in ms. Default 100. */
  intervalMs?: number;
  /** Stop waiting (and resolve) when this turns true, e.g. while the caller shuts down. */
  cancelled?: () => boolean;
}

/** Resolves once `url` answers 2xx; throws after `timeoutMs`. Refused connections count as not yet. */
export async function waitReady(url: string, options: WaitReadyOptions): Promise<void> {
  const deadline = Date.now() + options.timeoutMs;
  while (Date.now() < deadline) {
    if (options.cancelled?.() === true) return;
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
      if (res.ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, options.intervalMs ?? 100));
  }
  throw new Error(`${url} did not become ready within ${options.timeoutMs / 1000} s`);
}

/** The `p`th percentile (0–100) of ascending `sorted` samples, nearest rank; NaN when empty. */
export function percentile(sorted: readonly number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
}
