// CPU affinity for the benchmarks (Linux, util-linux `taskset`): emulates "the database on another host" on a
// small machine by giving PostgreSQL its own CPUs and the process under test and the load generator the others.
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';

/** A CPU list as taskset reads it (`0`, `1`, `0-1`, `0,2`), or undefined when `value` is unset or empty. */
export function cpuList(name: string, value: string | undefined): string | undefined {
  if (value === undefined || value === '') return undefined;
  if (!/^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$/.test(value))
    throw new Error(`${name}: not a CPU list: ${value}`);
  return value;
}

/** Live descendants of `root` (children, grandchildren, ...), from /proc. */
function descendants(root: number): number[] {
  const parent = new Map<number, number>();
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid)) continue;
    try {
      const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
      parent.set(pid, Number(text.slice(text.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      // exited meanwhile
    }
  }
  const out: number[] = [];
  const walk = (p: number): void => {
    for (const [pid, ppid] of parent)
      if (ppid === p) {
        out.push(pid);
        walk(pid);
      }
  };
  walk(root);
  return out;
}

/**
 * Pins `pid` (every thread: `taskset -a -p`) and, with `children`, every process it has already started to
 * `cpus`; what it starts later inherits the affinity. Returns how many processes were pinned.
 */
export function pinTree(pid: number, cpus: string, children = true): number {
  const pids = children ? [pid, ...descendants(pid)] : [pid];
  for (const p of pids) {
    try {
      execFileSync('taskset', ['-a', '-c', '-p', cpus, String(p)], { stdio: 'ignore' });
    } catch {
      // exited between the listing and taskset
    }
  }
  return pids.length;
}

/** The CPUs `pid` may run on, as /proc says (`Cpus_allowed_list`). */
export function allowedCpus(pid: number): string {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return /^Cpus_allowed_list:\s*(\S+)/m.exec(status)?.[1] ?? '?';
}
