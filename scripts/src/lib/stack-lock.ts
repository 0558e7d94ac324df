// One local stack per data folder. A second `npm start` on the same `.data` used to find the first stack's
// PostgreSQL on the data directory, take it for one left behind by a crash and stop it (testkit's
// stopLeftoverPostmaster), and then fail on ports in use: two stacks down instead of one refused. So the stack
// takes `<data>/stack.pid` before it touches anything, and a start that finds it held by a live stack refuses
// at once.
//
// The file holds the holder's pid and, on Linux, its start time (/proc/<pid>/stat, field 22), so that a pid
// reused by another process after a crash or a reboot is not taken for the stack. It appears with its content
// in one step (written beside it, then hard-linked into place, which fails when the name exists), so nobody
// reads it half written. A stale file is first renamed to a name of this process's own; if what was moved turns
// out to be a live stack's (another start took over the stale file in between), it is linked back.
import { linkSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** The lock's file name inside the data folder. */
export const STACK_LOCK_FILE = 'stack.pid';

/** Thrown by `acquireStackLock` when a live stack holds the data folder. */
export class StackRunningError extends Error {
  constructor(readonly pid: number) {
    super(`a stack is already running (pid ${pid})`);
    this.name = 'StackRunningError';
  }
}

export interface StackLock {
  /** Removes the file if it is still this process's (idempotent). */
  release(): void;
}

interface Holder {
  pid: number;
  /** Start time in clock ticks since boot (Linux), absent where /proc is not available. */
  start?: string;
}

/** The process's state and start time from /proc/<pid>/stat, or undefined (no such process, or no /proc). */
function procStat(pid: number): { state: string; start: string } | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after its last ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const state = fields[0];
  const start = fields[19];
  return state === undefined || start === undefined ? undefined : { state, start };
}

const hasProc = procStat(process.pid) !== undefined;

function isAlive(holder: Holder): boolean {
  try {
    process.kill(holder.pid, 0);
  } catch (err) {
    // EPERM: it exists, under another user.
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  if (!hasProc) return true;
  const stat = procStat(holder.pid);
  if (stat === undefined || stat.state === 'Z') return false;
  return holder.start === undefined || holder.start === stat.start;
}

function readHolder(path: string): Holder | undefined {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
  try {
    const parsed = JSON.parse(text) as Partial<Holder>;
    if (typeof parsed.pid !== 'number' || !Number.isInteger(parsed.pid) || parsed.pid <= 0) return undefined;
    return typeof parsed.start === 'string' ? { pid: parsed.pid, start: parsed.start } : { pid: parsed.pid };
  } catch {
    return undefined;
  }
}

/** `from` appears as `to` unless `to` exists (EEXIST); false when it existed. */
function linkIfAbsent(from: string, to: string): boolean {
  try {
    linkSync(from, to);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  }
}

/**
 * Takes `<dataDir>/stack.pid` for this process, or throws `StackRunningError` naming the live stack that holds
 * it. A file left by a stack that is gone (killed, crashed, a reboot) is replaced.
 */
export function acquireStackLock(dataDir: string): StackLock {
  const path = join(dataDir, STACK_LOCK_FILE);
  const me: Holder = { pid: process.pid, ...(hasProc ? { start: procStat(process.pid)!.start } : {}) };
  const text = `${JSON.stringify(me)}\n`;
  const staging = `${path}.${process.pid}.new`;
  const aside = `${path}.${process.pid}.stale`;
  const release = (): void => {
    const holder = readHolder(path);
    if (holder?.pid === me.pid && holder.start === me.start) rmSync(path, { force: true });
  };
  // A few rounds: each one either takes the file, refuses, or clears a stale file that someone else may take
  // first; three stale files in a row would take three crashed stacks at once.
  for (let round = 0; round < 5; round++) {
    writeFileSync(staging, text, { mode: 0o644 });
    let taken: boolean;
    try {
      taken = linkIfAbsent(staging, path);
    } finally {
      rmSync(staging, { force: true });
    }
    if (taken) return { release };

    const holder = readHolder(path);
    if (holder !== undefined && isAlive(holder)) throw new StackRunningError(holder.pid);
    try {
      renameSync(path, aside);
    } catch (err) {
      // Gone meanwhile: another start cleared it; try again.
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
      throw err;
    }
    const moved = readHolder(aside);
    if (moved !== undefined && isAlive(moved)) {
      // Another start took the stale file's place between our read and our rename: give its file back.
      linkIfAbsent(aside, path);
      rmSync(aside, { force: true });
      throw new StackRunningError(moved.pid);
    }
    rmSync(aside, { force: true });
  }
  throw new Error(`could not take ${path}: it keeps being replaced (several starts at once?)`);
}
