// Issue 39 §4, the workflow's probe: SIGHUP re-reads WEBHOOK_TOKENS_FILE (design §4.4, "The webhook"). A FIFO in
// its place blocked the whole process on the signal (the re-read is synchronous and waited for a writer): every
// request after it hung. The built service as a process (`dist/main.js`, run `npx tsc -b` first).
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { API_LOGIN, devRolePasswords, urlForLogin } from '@platform/enterprise-db';
import { freePort } from '@platform/testkit';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';
import { waitFor } from './support/wait.js';

const main = fileURLToPath(new URL('../dist/main.js', import.meta.url));
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
