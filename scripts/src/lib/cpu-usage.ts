// CPU time of process trees, read from /proc (Linux): the benchmarks use it to say which process a
// request's CPU is spent in (service, database, load generator), not only how many requests fit.
import { readdirSync, readFileSync } from 'node:fs';

/** Linux reports utime/stime in clock ticks; USER_HZ is 100 on every mainstream architecture. */
const TICKS_PER_S = 100;

interface ProcStat {
  ppid: number;
  cpuS: number;
}

function readStat(pid: number): ProcStat | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined; // exited between the directory listing and the read
  }
  // Field 2 (comm) is parenthesised and may contain spaces; the fields after it are plain.
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // After comm: state(3) ppid(4) ... utime(14) stime(15), so offsets 1, 11 and 12 here.
  return {
    ppid: Number(fields[1]),
    cpuS: (Number(fields[11]) + Number(fields[12])) / TICKS_PER_S,
  };
}

/** User plus system CPU seconds of one process (0 once it has exited). */
export function processCpuSeconds(pid: number): number {
  return readStat(pid)?.cpuS ?? 0;
}

/** User plus system CPU seconds of `rootPid` and every live descendant. */
export function treeCpuSeconds(rootPid: number): number {
  const stats = new Map<number, ProcStat>();
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid)) continue;
    const stat = readStat(pid);
    if (stat !== undefined) stats.set(pid, stat);
  }
  const children = new Map<number, number[]>();
  for (const [pid, { ppid }] of stats) children.set(ppid, [...(children.get(ppid) ?? []), pid]);
  let total = 0;
  const pending = [rootPid];
  for (let pid = pending.pop(); pid !== undefined; pid = pending.pop()) {
    total += stats.get(pid)?.cpuS ?? 0;
    pending.push(...(children.get(pid) ?? []));
  }
  return total;
}

/**
 * Measures the CPU seconds each named reader (`processCpuSeconds` or `treeCpuSeconds` bound to a
 * pid) advances by while `run` executes. Descendants that exit during the run are not counted
 * (PostgreSQL backends of a pool live as long as the pool, so they are).
 */
export async function cpuDuring<T>(
  readers: Record<string, () => number>,
  run: () => Promise<T>,
): Promise<{ result: T; cpuS: Record<string, number> }> {
  const names = Object.keys(readers);
  const before = names.map((name) => readers[name]?.() ?? 0);
  const result = await run();
  const cpuS = Object.fromEntries(
    names.map((name, i) => [name, (readers[name]?.() ?? 0) - (before[i] ?? 0)]),
  );
  return { result, cpuS };
}
