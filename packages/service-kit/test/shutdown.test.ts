import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { jest } from '@jest/globals';
import { installShutdown } from '../src/index.js';
import { captureLogs } from './log-capture.js';

const fixture = fileURLToPath(new URL('./fixtures/shutdown-child.mjs', import.meta.url));
const builtKit = fileURLToPath(new URL('../dist/index.js', import.meta.url));

interface Child {
  proc: ChildProcess;
  port: number;
  lines: () => Record<string, unknown>[];
  exited: Promise<{ code: number | null; at: number }>;
}

async function startChild(env: Record<string, string>): Promise<Child> {
  const proc = spawn(process.execPath, [fixture], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  const lines = () =>
    out
      .split('\n')
      .filter((line) => line.startsWith('{'))
      .map((line) => JSON.parse(line) as Record<string, unknown>);
  const exited = new Promise<{ code: number | null; at: number }>((resolve) =>
    proc.once('exit', (code) => resolve({ code, at: Date.now() })),
  );
  const port = await new Promise<number>((resolve, reject) => {
    proc.stdout?.on('data', (chunk: Buffer) => {
      out += chunk.toString('utf8');
      const listening = lines().find((line) => line.message === 'listening');
      if (listening !== undefined) resolve(Number(listening.port));
    });
    proc.once('exit', (code) => reject(new Error(`child exited early with ${code}: ${out}`)));
  });
  return { proc, port, lines, exited };
}

function get(port: number, path: string, agent: http.Agent): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
  });
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

describe('installShutdown in a real process', () => {
  const children: ChildProcess[] = [];
  const agent = new http.Agent({ keepAlive: true });

  beforeAll(() => {
    if (!existsSync(builtKit))
      throw new Error('run `npx tsc -b` first: the child process uses the built kit');
  });
  afterAll(() => {
    agent.destroy();
    for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
  });

  it('on SIGTERM finishes the in-flight request, refuses new connections and exits 0 in time', async () => {
    const child = await startChild({ SHUTDOWN_TIMEOUT_MS: '3000', GRACE_MS: '2500' });
    children.push(child.proc);

    // An idle keep-alive socket must not hold the shutdown open (Node keeps it for 5 s by default).
    expect((await get(child.port, '/fast', agent)).status).toBe(200);
    const slow = get(child.port, '/slow/800', agent);
    await delay(150);
    const signalledAt = Date.now();
    child.proc.kill('SIGTERM');

    await delay(100);
    await expect(get(child.port, '/fast', new http.Agent({ keepAlive: false }))).rejects.toMatchObject({
      code: 'ECONNREFUSED',
    });

    const response = await slow;
    expect(response).toEqual({ status: 200, body: JSON.stringify({ slept_ms: 800 }) });
    const { code, at } = await child.exited;
    expect(code).toBe(0);
    // The slow request had ≈650 ms left; allow scheduling slack but stay well under the 3 s bound.
    expect(at - signalledAt).toBeLessThan(2000);

    const messages = child
      .lines()
      .map((line) =>
        typeof line.step === 'string' ? `${String(line.message)}:${line.step}` : String(line.message),
      );
    const order = [
      'shutting down',
      'shutdown step done:http',
      'shutdown step done:pool',
      'shutdown complete',
    ];
    expect(messages.filter((m) => order.includes(m))).toEqual(order);
    const slowLine = child
      .lines()
      .find((line) => line.message === 'http request' && line.route === '/slow/:ms');
    expect(slowLine).toMatchObject({ status: 200 });
  });

  it('exits 1 when the sequence outlasts timeoutMs', async () => {
    const child = await startChild({ SHUTDOWN_TIMEOUT_MS: '400', GRACE_MS: '10000' });
    children.push(child.proc);
    const slow = get(child.port, '/slow/10000', new http.Agent()).catch((err: unknown) => err);
    await delay(100);
    const signalledAt = Date.now();
    child.proc.kill('SIGTERM');
    const { code, at } = await child.exited;
    expect(code).toBe(1);
    expect(at - signalledAt).toBeGreaterThanOrEqual(350);
    expect(at - signalledAt).toBeLessThan(1500);
    expect(child.lines().some((line) => line.message === 'shutdown timed out; forcing exit')).toBe(true);
    await slow;
  });

  it('a second signal forces an immediate exit 1', async () => {
    const child = await startChild({ SHUTDOWN_TIMEOUT_MS: '10000', GRACE_MS: '10000' });
    children.push(child.proc);
    const slow = get(child.port, '/slow/10000', new http.Agent()).catch((err: unknown) => err);
    await delay(100);
    child.proc.kill('SIGTERM');
    await delay(150);
    const secondAt = Date.now();
    child.proc.kill('SIGINT');
    const { code, at } = await child.exited;
    expect(code).toBe(1);
    expect(at - secondAt).toBeLessThan(1000);
    await slow;
  });
});

describe('installShutdown sequencing (in process)', () => {
  it('runs steps in order, continues past a failing step and reports exit 1', async () => {
    const { logger, entries } = captureLogs();
    const exit = jest.fn<(code: number) => void>();
    const calls: string[] = [];
    const handle = installShutdown({
      logger,
      timeoutMs: 1000,
      signals: [],
      exit,
      steps: [
        { name: 'a', close: () => Promise.resolve(void calls.push('a')) },
        { name: 'b', close: () => Promise.reject(new Error('b failed')) },
        { name: 'c', close: () => Promise.resolve(void calls.push('c')) },
      ],
    });
    await handle.shutdown('test');
    await handle.shutdown('again');
    handle.dispose();
    expect(calls).toEqual(['a', 'c']);
    expect(exit.mock.calls).toEqual([[1]]);
    expect(entries().some((e) => e.message === 'shutdown step failed' && e.step === 'b')).toBe(true);
  });
});
