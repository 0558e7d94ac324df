// The local stack's lock on its data folder (lib/stack-lock.ts): one live stack per folder; a file left by
// a stack that is gone, or naming a pid that another process has since taken, is replaced. stack.test.ts
// runs a second `npm start` beside a running one.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { acquireStackLock, STACK_LOCK_FILE, StackRunningError } from '../src/lib/stack-lock.js';

const lockModule = fileURLToPath(new URL('../dist/lib/stack-lock.js', import.meta.url));

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'stack-lock-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

const lockFile = (): string => join(dir, STACK_LOCK_FILE);
const holder = (): { pid: number; start?: string } =>
  JSON.parse(readFileSync(lockFile(), 'utf8')) as { pid: number; start?: string };

/** A pid no process has any more: a child that has exited. */
function deadPid(): number {
  const child = spawnSync(process.execPath, ['-e', '']);
  return child.pid;
}

describe('the stack lock', () => {
  it('is taken with this process id, refused to a second taker while held, and free again once released', () => {
    const lock = acquireStackLock(dir);
    expect(holder().pid).toBe(process.pid);
    // The same process stands for another live stack here: the file names a live process with its start time.
    expect(() => acquireStackLock(dir)).toThrow(new StackRunningError(process.pid));
    expect(() => acquireStackLock(dir)).toThrow(`a stack is already running (pid ${process.pid})`);
    lock.release();
    expect(existsSync(lockFile())).toBe(false);
    acquireStackLock(dir).release();
    // No file of its own left beside it.
    expect(spawnSync('ls', ['-A', dir], { encoding: 'utf8' }).stdout).toBe('');
  });

  it('refuses while another live process holds it', async () => {
    // A real second process holding the lock, as a running stack does.
    const script = `import(${JSON.stringify(lockModule)}).then((m) => { m.acquireStackLock(${JSON.stringify(dir)}); console.log('held'); setInterval(() => {}, 1000); });`;
    const other = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      await new Promise<void>((resolve, reject) => {
        other.stdout.on('data', (chunk: Buffer) => {
          if (chunk.toString().includes('held')) resolve();
        });
        other.once('exit', (code) => reject(new Error(`lock holder exited with ${String(code)}`)));
      });
      expect(() => acquireStackLock(dir)).toThrow(`a stack is already running (pid ${other.pid!})`);
    } finally {
      const gone = new Promise((resolve) => other.once('exit', resolve));
      other.kill('SIGKILL');
      await gone;
    }
    // Killed outright, it could not release the file: the next taker finds it stale and takes it.
    expect(holder().pid).toBe(other.pid);
    acquireStackLock(dir).release();
  });

  it('replaces a file left by a process that is gone', () => {
    writeFileSync(lockFile(), `${JSON.stringify({ pid: deadPid(), start: '1' })}\n`);
    const lock = acquireStackLock(dir);
    expect(holder().pid).toBe(process.pid);
    lock.release();
  });

  it('replaces a file whose pid another process has taken since (its start time differs)', () => {
    const mine = holderOf(acquireStackLock, dir);
    writeFileSync(lockFile(), `${JSON.stringify({ pid: process.pid, start: `${mine.start ?? ''}0` })}\n`);
    const lock = acquireStackLock(dir);
    expect(holder()).toEqual(mine);
    lock.release();
  });

  it('replaces a file that holds no pid', () => {
    writeFileSync(lockFile(), 'not a lock\n');
    acquireStackLock(dir).release();
    expect(existsSync(lockFile())).toBe(false);
  });

  it('release() leaves a file that is not its own', () => {
    const lock = acquireStackLock(dir);
    const other = { pid: deadPid(), start: '1' };
    writeFileSync(lockFile(), `${JSON.stringify(other)}\n`);
    lock.release();
    expect(holder()).toEqual(other);
  });
});

/** What this process writes as holder (taken and released at once). */
function holderOf(acquire: typeof acquireStackLock, at: string): { pid: number; start?: string } {
  const lock = acquire(at);
  const written = holder();
  lock.release();
  return written;
}
