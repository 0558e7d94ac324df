// Review of issue 29 item 8: main.ts says a token rotation that signals a replica still starting must not kill
// it. A SIGHUP at any moment of the start (module loading included) leaves the process running.
// The test asserts the secure behaviour; a failing test is a finding.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { API_LOGIN, devRolePasswords, urlForLogin } from '@platform/enterprise-db';
import { freePort } from '@platform/testkit';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

const main = fileURLToPath(new URL('../dist/main.js', import.meta.url));

/** How long a bare `node` takes now, from its spawn to its first statement (its SIGHUP handler), in ms. */
async function nodeStartMs(): Promise<number> {
  const started = Date.now();
  const bare = spawn(process.execPath, ['-e', "process.on('SIGHUP', () => {}); setTimeout(() => {}, 10000)"]);
  while (!catchesHup(bare.pid!)) await new Promise((r) => setImmediate(r));
  const elapsed = Date.now() - started;
  const exited = new Promise((r) => bare.once('exit', r));
  bare.kill('SIGKILL');
  await exited;
  return elapsed;
}

/** Whether process `pid` catches SIGHUP (/proc/<pid>/status SigCgt, whose lowest bit is SIGHUP). */
function catchesHup(pid: number): boolean {
  try {
    const mask = /^SigCgt:\s*([0-9a-f]+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? '0';
    return (BigInt(`0x${mask}`) & 1n) === 1n;
  } catch {
    return false;
  }
}
let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(async () => {
  await h.close();
});

it('a SIGHUP early in the start does not end the process', async () => {
  const results: string[] = [];
  // Past Node's own start, which no module can cover (about 40-60 ms on a quiet machine, several hundred on a
  // loaded one, where fixed delays from the spawn made this test fail): each delay is added to how long a bare
  // `node` takes to catch SIGHUP just before. Before the entry point held SIGHUPs, signals 250 and 400 ms after
  // the spawn ended the process (it survived from about 600 ms, once run.ts had loaded). No parent closes
  // Node's own start by starting the process with SIGHUP ignored or blocked (Node resets both);
  // service-kit's bin/hold-hangups.sh holds the signal then (review-39-hangup.test.ts).
  for (const delayMs of [100, 250, 450, 750]) {
    const startMs = await nodeStartMs();
    const port = await freePort('tcp');
    const child = spawn(process.execPath, [main], {
      env: {
        PATH: process.env.PATH ?? '',
        PORT: String(port),
        HOST: '127.0.0.1',
        DATABASE_URL: urlForLogin(h.database.url, API_LOGIN, devRolePasswords.enterpriseApi),
        OIDC_ISSUER_URL: h.issuer.issuerUrl,
        S3_ENDPOINT: h.s3.endpoint,
        S3_BUCKET: h.s3.bucket,
        S3_ACCESS_KEY_ID: h.s3.accessKeyId,
        S3_SECRET_ACCESS_KEY: h.s3.secretAccessKey,
        S3_FORCE_PATH_STYLE: 'true',
        WEBHOOK_TOKENS: 'startup-sighup-token',
      },
      stdio: 'pipe',
    });
    child.stdout?.resume();
    child.stderr?.resume();
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    await new Promise((r) => setTimeout(r, startMs + delayMs));
    child.kill('SIGHUP');
    await new Promise((r) => setTimeout(r, 1500));
    results.push(`${delayMs} ms: ${child.signalCode ?? child.exitCode ?? 'running'}`);
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  }
  expect(results).toEqual(['100 ms: running', '250 ms: running', '450 ms: running', '750 ms: running']);
});
