// Review of issue 29 item 8: main.ts says a token rotation that signals a replica still starting must not kill
// it. A SIGHUP at any moment of the start (module loading included) leaves the process running.
// The test asserts the secure behaviour; a failing test is a finding.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { API_LOGIN, devRolePasswords, urlForLogin } from '@platform/enterprise-db';
import { freePort } from '@platform/testkit';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

const main = fileURLToPath(new URL('../dist/main.js', import.meta.url));
let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(async () => {
  await h.close();
});

it('a SIGHUP early in the start does not end the process', async () => {
  const results: string[] = [];
  // From 250 ms on (before the entry point held SIGHUPs, signals at 250 and 400 ms ended the process; it survived
  // from about 600 ms). What is left is Node's own start, before any module runs (about 40-60 ms): no parent
  // closes it by starting the process with SIGHUP ignored or blocked, since Node resets both when it starts;
  // service-kit's bin/hold-hangups.sh holds the signal instead (review-39-hangup.test.ts).
  for (const delayMs of [250, 400, 600, 900]) {
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
    await new Promise((r) => setTimeout(r, delayMs));
    child.kill('SIGHUP');
    await new Promise((r) => setTimeout(r, 1500));
    results.push(`${delayMs} ms: ${child.signalCode ?? child.exitCode ?? 'running'}`);
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  }
  expect(results).toEqual(['250 ms: running', '400 ms: running', '600 ms: running', '900 ms: running']);
});
