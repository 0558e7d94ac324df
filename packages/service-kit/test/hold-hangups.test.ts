// bin/hold-hangups.sh: a SIGHUP sent while Node.js is still starting (before any JavaScript runs, where no
// handler can be installed: issue 39 §4) is held and delivered once the service handles SIGHUP; other signals
// are forwarded at once, and the shell exits as the service does. Real processes and signals (Linux /proc).
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const guard = fileURLToPath(new URL('../bin/hold-hangups.sh', import.meta.url));

/**
 * A service that handles SIGHUP only after `argv[1]` ms (standing for the time Node.js takes before any of a
 * service's JavaScript runs, made long enough to signal into reliably), exits 3 after `argv[2]` ms, and 7 on
 * SIGTERM.
 */
const SERVICE = `
process.on('SIGTERM', () => { console.log('term'); process.exit(7); });
console.log('started');
setTimeout(() => { process.on('SIGHUP', () => console.log('hup')); console.log('handles SIGHUP'); }, Number(process.argv[1]));
setTimeout(() => process.exit(3), Number(process.argv[2]));
`;

interface Run {
  process: ChildProcess;
  output: () => string;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

function run(command: string[]): Run {
  const child = spawn(command[0]!, command.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  );
  return { process: child, output: () => output, exit };
}

function catchesHup(pid: number): boolean {
  try {
    const mask = /^SigCgt:\s*([0-9a-f]+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? '0';
    return (BigInt(`0x${mask}`) & 1n) === 1n;
  } catch {
    return false;
  }
}

function childOf(pid: number): number | undefined {
  try {
    const first = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/)[0];
    return first === undefined || first === '' ? undefined : Number(first);
  } catch {
    return undefined;
  }
}

/** Waits (polling, no timers of the test's own to race) until `probe` holds. */
async function until(probe: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!probe()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await new Promise((r) => setImmediate(r));
  }
}

it('without it, a SIGHUP while Node.js starts ends the service (the window it closes)', async () => {
  const direct = run([process.execPath, '-e', SERVICE, '0', '1500']);
  // As early as a signal can come: Node.js has not run a line of the service yet.
  direct.process.kill('SIGHUP');
  expect(await direct.exit).toEqual({ code: null, signal: 'SIGHUP' });
});

it('holds a SIGHUP sent before the service handles it, and delivers it once it does', async () => {
  const guarded = run(['sh', guard, process.execPath, '-e', SERVICE, '1500', '2500']);
  const shell = guarded.process.pid!;
  // The shell traps SIGHUP from its first command on; the service runs but does not handle SIGHUP yet.
  await until(() => catchesHup(shell) && guarded.output().includes('started'));
  expect(catchesHup(childOf(shell)!)).toBe(false);
  guarded.process.kill('SIGHUP');
  guarded.process.kill('SIGHUP');
  const exit = await guarded.exit;
  // One reload for the SIGHUPs that came while it started; the service ran to its own end.
  expect({ exit, output: guarded.output() }).toEqual({
    exit: { code: 3, signal: null },
    output: 'started\nhandles SIGHUP\nhup\n',
  });
});

it('passes a SIGHUP on at once to a service that handles it, and forwards SIGTERM', async () => {
  const guarded = run(['sh', guard, process.execPath, '-e', SERVICE, '0', '5000']);
  await until(() => guarded.output().includes('handles SIGHUP'));
  guarded.process.kill('SIGHUP');
  await until(() => guarded.output().includes('hup\n'));
  guarded.process.kill('SIGTERM');
  expect(await guarded.exit).toEqual({ code: 7, signal: null });
  expect(guarded.output()).toBe('started\nhandles SIGHUP\nhup\nterm\n');
});

it('exits as the service does, also when a signal ends it', async () => {
  const killed = run(['sh', guard, process.execPath, '-e', 'setTimeout(() => {}, 5000)']);
  const shell = killed.process.pid!;
  await until(() => childOf(shell) !== undefined);
  process.kill(childOf(shell)!, 'SIGKILL');
  expect(await killed.exit).toEqual({ code: 128 + 9, signal: null });
  const usage = run(['sh', guard]);
  expect(await usage.exit).toEqual({ code: 2, signal: null });
  expect(usage.output()).toContain('usage: hold-hangups.sh COMMAND');
});
