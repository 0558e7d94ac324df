// Issue 39 §4, the workflow's probe: SIGHUP re-reads WEBHOOK_TOKENS_FILE (design §4.4, "The webhook"). A FIFO in
// its place blocked the whole process on the signal (the re-read is synchronous and waited for a writer): every
// request after it hung. And a SIGHUP in the first ~40-60 ms, while Node.js starts and before any of the
// service's JavaScript can handle it, still ended the process: service-kit's bin/hold-hangups.sh, between the
// init process and the service, holds it until the service handles SIGHUP. The built service as a process
// (`dist/main.js`, run `npx tsc -b` first).
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { API_LOGIN, devRolePasswords, urlForLogin } from '@platform/enterprise-db';
import { freePort } from '@platform/testkit';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';
import { waitFor } from './support/wait.js';

const main = fileURLToPath(new URL('../dist/main.js', import.meta.url));
const holdHangups = fileURLToPath(
  new URL('../../../packages/service-kit/bin/hold-hangups.sh', import.meta.url),
);
const TOKEN = 'hangup-test-token-0123456789';

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(async () => {
  await h.close();
});

function serviceEnv(port: number, extra: Record<string, string>): Record<string, string> {
  return {
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
    ...extra,
  };
}

/** Whether the service answers /health within a second. */
async function answers(port: number): Promise<boolean> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(1000) });
    return res.status === 200;
  } catch {
    return false;
  }
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGKILL');
  await exited;
}

it('a FIFO in place of the token file is refused on SIGHUP, logged, and the service keeps serving', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'wf-hangup-'));
  const file = join(dir, 'tokens');
  writeFileSync(file, `${TOKEN}\n`);
  const port = await freePort('tcp');
  const child = spawn(process.execPath, [main], {
    env: serviceEnv(port, { WEBHOOK_TOKENS_FILE: file }),
    stdio: 'pipe',
  });
  let output = '';
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  try {
    await waitFor(async () => ((await answers(port)) ? true : undefined), 15_000);
    // A rotation that went wrong: a FIFO where the mounted file was.
    const fifo = join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    renameSync(fifo, file);
    child.kill('SIGHUP');
    await waitFor(
      () => Promise.resolve(output.includes('webhook tokens reload failed') ? true : undefined),
      5000,
    );
    expect(await answers(port)).toBe(true);
    const line = output.split('\n').find((l) => l.includes('webhook tokens reload failed'));
    expect(JSON.parse(line ?? '{}')).toMatchObject({
      level: 'error',
      error: expect.stringContaining('WEBHOOK_TOKENS_FILE: is a FIFO, not a regular file'),
    });
    // The token read at start is still the one accepted.
    const res = await fetch(`http://127.0.0.1:${port}/internal/media/object-created`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${TOKEN}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ Records: [] }),
    });
    expect(res.status).not.toBe(401);
  } finally {
    await stop(child);
  }
}, 40_000);

/** Whether process `pid` catches SIGHUP (/proc/<pid>/status SigCgt, whose lowest bit is SIGHUP). */
function catchesHup(pid: number): boolean {
  try {
    const mask = /^SigCgt:\s*([0-9a-f]+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? '0';
    return (BigInt(`0x${mask}`) & 1n) === 1n;
  } catch {
    return false;
  }
}

it('a SIGHUP while Node.js is still starting ends the service run directly, and is held for it by hold-hangups.sh', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'wf-hangup-'));
  const file = join(dir, 'tokens');
  writeFileSync(file, `${TOKEN}\n`);
  // Directly: the signal comes before Node.js has run a line of main.js.
  const direct = spawn(process.execPath, [main], {
    env: serviceEnv(await freePort('tcp'), { WEBHOOK_TOKENS_FILE: file }),
    stdio: 'ignore',
  });
  const directExit = new Promise((resolve) =>
    direct.once('exit', (code, signal) => resolve({ code, signal })),
  );
  direct.kill('SIGHUP');
  expect(await directExit).toEqual({ code: null, signal: 'SIGHUP' });

  // Behind hold-hangups.sh, as an image would run it (tini -- sh hold-hangups.sh node main.js).
  const port = await freePort('tcp');
  const guarded = spawn('sh', [holdHangups, process.execPath, main], {
    env: serviceEnv(port, { WEBHOOK_TOKENS_FILE: file }),
    stdio: 'pipe',
  });
  let output = '';
  guarded.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  guarded.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  try {
    // As soon as the shell handles SIGHUP: Node.js is then still starting.
    while (!catchesHup(guarded.pid!)) await new Promise((r) => setImmediate(r));
    guarded.kill('SIGHUP');
    await waitFor(async () => ((await answers(port)) ? true : undefined), 15_000);
    // The held SIGHUP reached the service once it handled SIGHUP: one reload, and it serves.
    await waitFor(() => Promise.resolve(output.includes('webhook tokens reloaded') ? true : undefined), 5000);
    expect(guarded.exitCode).toBeNull();
    // SIGTERM goes through to the service, which stops cleanly.
    const exited = new Promise((resolve) => guarded.once('exit', (code) => resolve(code)));
    guarded.kill('SIGTERM');
    expect(await exited).toBe(0);
  } finally {
    await stop(guarded);
  }
}, 40_000);
