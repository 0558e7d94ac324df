// The built service as a process (`dist/main.js`, run `npx tsc -b` first): refuses bad configuration
// with exit code 2, serves when configured, and shuts down cleanly on SIGTERM.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { API_LOGIN, devRolePasswords, urlForLogin } from '@platform/enterprise-db';
import { freePort, headersDeadlineFaults } from '@platform/testkit';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

const main = fileURLToPath(new URL('../dist/main.js', import.meta.url));

function run(env: Record<string, string>): {
  child: ChildProcess;
  output: () => string;
  exit: Promise<number | null>;
} {
  const child = spawn(process.execPath, [main], {
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: 'pipe',
  });
  let output = '';
  child.stdout?.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr?.on('data', (d: Buffer) => (output += d.toString()));
  const exit = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  return { child, output: () => output, exit };
}

it('exits with 2 and a readable message when the configuration is incomplete', async () => {
  const p = run({ S3_SECRET_ACCESS_KEY: 'super-secret-value' });
  expect(await p.exit).toBe(2);
  expect(p.output()).toMatch(/Invalid configuration[\s\S]*DATABASE_URL[\s\S]*OIDC_ISSUER_URL/);
  expect(p.output()).not.toContain('super-secret-value');
});

describe('configured', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness();
  });
  afterAll(async () => {
    await h.close();
  });

  it('becomes ready, serves, and stops cleanly on SIGTERM', async () => {
    const port = await freePort('tcp');
    const p = run({
      PORT: String(port),
      HOST: '127.0.0.1',
      DATABASE_URL: urlForLogin(h.database.url, API_LOGIN, devRolePasswords.enterpriseApi),
      OIDC_ISSUER_URL: h.issuer.issuerUrl,
      S3_ENDPOINT: h.s3.endpoint,
      S3_BUCKET: h.s3.bucket,
      S3_ACCESS_KEY_ID: h.s3.accessKeyId,
      S3_SECRET_ACCESS_KEY: h.s3.secretAccessKey,
      S3_FORCE_PATH_STYLE: 'true',
      WEBHOOK_TOKENS: 'process-test-token',
    });
    const deadline = Date.now() + 15_000;
    let ready = 0;
    while (Date.now() < deadline) {
      ready = await fetch(`http://127.0.0.1:${port}/ready`).then(
        (r) => r.status,
        () => 0,
      );
      if (ready === 200) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect(ready).toBe(200);
    const token = await h.issuer.demoToken('alice');
    const res = await fetch(
      `http://127.0.0.1:${port}/sites/00000000-0000-4000-8000-000000000000/media/upload-intents`,
      {
        method: 'POST',
        headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 1 }),
      },
    );
    expect(res.status).toBe(404);
    // design §6 (service-kit listenHttp): headers must arrive within 10 s, checked every second, so a client that
    // never finishes its headers gets 408 and a closed connection within about 11 s (node's default: 60-90 s).
    expect(await headersDeadlineFaults(port, '/health')).toEqual([]);

    p.child.kill('SIGTERM');
    expect(await p.exit).toBe(0);
    const lines = p
      .output()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.some((l) => l.message === 'shutdown complete')).toBe(true);
    // The 408 above has its log line (service-kit's listen.test checks it names the answer's request id).
    expect(lines.filter((l) => l.message === 'http client error')).toMatchObject([
      {
        status: 408,
        code: 'request_timeout',
        reason: 'ERR_HTTP_REQUEST_TIMEOUT',
        request_id: expect.any(String),
      },
    ]);
    // Secrets never reach the log: not the webhook token, not the database password.
    expect(p.output()).not.toContain('process-test-token');
    expect(p.output()).not.toContain(devRolePasswords.enterpriseApi);
    expect(p.output()).not.toContain(token);
  }, 60_000);
  it('re-reads WEBHOOK_TOKENS_FILE on SIGHUP without stopping, keeps the old tokens when the file is unusable', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'wf-tokens-'));
    const file = join(dir, 'webhook-tokens');
    writeFileSync(file, 'old-webhook-token-aaaa\n');
    const port = await freePort('tcp');
    const p = run({
      PORT: String(port),
      HOST: '127.0.0.1',
      DATABASE_URL: urlForLogin(h.database.url, API_LOGIN, devRolePasswords.enterpriseApi),
      OIDC_ISSUER_URL: h.issuer.issuerUrl,
      S3_ENDPOINT: h.s3.endpoint,
      S3_BUCKET: h.s3.bucket,
      S3_ACCESS_KEY_ID: h.s3.accessKeyId,
      S3_SECRET_ACCESS_KEY: h.s3.secretAccessKey,
      S3_FORCE_PATH_STYLE: 'true',
      WEBHOOK_TOKENS_FILE: file,
    });
    const url = `http://127.0.0.1:${port}/internal/media/object-created`;
    // An event for another bucket: acknowledged (and ignored) with 200 when the token is accepted, 401 otherwise.
    const hook = async (token: string) =>
      (
        await fetch(url, {
          method: 'POST',
          headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
          body: JSON.stringify({
            Records: [
              {
                eventName: 'ObjectCreated:Put',
                s3: { bucket: { name: 'another-bucket' }, object: { key: 'x', size: 1 } },
              },
            ],
          }),
        })
      ).status;
    /** Sends SIGHUP and waits for the log line that says what came of it. */
    const reload = async (message: string) => {
      const seen = p.output().split(message).length;
      p.child.kill('SIGHUP');
      const deadline = Date.now() + 5000;
      while (p.output().split(message).length === seen && Date.now() < deadline)
        await new Promise((resolve) => setTimeout(resolve, 20));
    };
    try {
      const deadline = Date.now() + 15_000;
      while (Date.now() < deadline && (await hook('old-webhook-token-aaaa').catch(() => 0)) !== 200)
        await new Promise((resolve) => setTimeout(resolve, 100));
      expect(await hook('old-webhook-token-aaaa')).toBe(200);

      writeFileSync(file, 'new-webhook-token-bbbb\n# rotated\n');
      await reload('webhook tokens reloaded');
      expect(p.child.exitCode).toBeNull();
      expect(await hook('new-webhook-token-bbbb')).toBe(200);
      expect(await hook('old-webhook-token-aaaa')).toBe(401);

      // A file that cannot be used (no token; then gone) changes nothing, and the process keeps serving.
      writeFileSync(file, '# nothing here\n');
      await reload('webhook tokens reload failed; the previous webhook tokens stay valid');
      rmSync(file);
      await reload('webhook tokens reload failed; the previous webhook tokens stay valid');
      expect(p.child.exitCode).toBeNull();
      expect(await hook('new-webhook-token-bbbb')).toBe(200);

      p.child.kill('SIGTERM');
      expect(await p.exit).toBe(0);
      const lines = p
        .output()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      // The fingerprint is keyed with this process's own secret (issue 39): not the token's unkeyed SHA-256
      // prefix, which anyone reading the log could test guesses against.
      const unkeyed = createHash('sha256').update('new-webhook-token-bbbb').digest('hex').slice(0, 12);
      expect(lines.filter((l) => l.message === 'webhook tokens reloaded')).toEqual([
        expect.objectContaining({
          count: 1,
          fingerprints: [expect.stringMatching(/^hmac-sha256:[0-9a-f]{12}$/)],
        }),
      ]);
      expect(p.output()).not.toContain(unkeyed);
      expect(
        lines.filter(
          (l) => l.message === 'webhook tokens reload failed; the previous webhook tokens stay valid',
        ),
      ).toHaveLength(2);
      expect(p.output()).not.toContain('old-webhook-token-aaaa');
      expect(p.output()).not.toContain('new-webhook-token-bbbb');
    } finally {
      if (p.child.exitCode === null) p.child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
