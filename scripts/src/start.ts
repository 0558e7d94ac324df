// `npm start`: the whole platform on one machine, in the foreground (design §5); stack.ts says what runs.
// Ctrl-C stops all of it, gracefully and once.
//
// Why a launcher: a terminal sends Ctrl-C's SIGINT to every process of its foreground process group. With
// the services in that group, each got SIGINT from the terminal and then the SIGTERM of an orderly stop,
// and took the second signal for an operator insisting ("second signal during shutdown; forcing exit"),
// while PostgreSQL stopped under them. So the stack runs in a session of its own (detached), out of the
// terminal's reach, and this process alone turns the first SIGINT, SIGTERM or SIGHUP (a closed terminal)
// into one SIGTERM for it. npm may forward a signal this process also received from the terminal: every
// signal after the first is ignored; the stack bounds its own stop (12 s per service, then SIGKILL).
// The stack's stdin is a pipe from here: if this process dies without a word, the stack sees its end
// and stops too.
import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import { fileURLToPath } from 'node:url';

const stackScript = fileURLToPath(new URL('./stack.js', import.meta.url));
const stack = spawn(process.execPath, [stackScript], {
  detached: true,
  stdio: ['pipe', 'inherit', 'inherit'],
});

let forwarded = false;
const forward = (): void => {
  if (forwarded) return;
  forwarded = true;
  stack.kill('SIGTERM');
};
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(signal, forward);

stack.once('error', (err) => {
  console.error(`[stack] could not start ${stackScript}: ${err.message}`);
  process.exit(1);
});
stack.once('exit', (code, signal) => {
  // A stack killed by a signal exits as a shell reports it: 128 + the signal's number.
  process.exit(code ?? (signal === null ? 1 : 128 + constants.signals[signal]));
});
