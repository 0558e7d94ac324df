// `npm start` end to end: the stack comes up on free ports with a private data directory, serves both
// services, stops cleanly on Ctrl-C (SIGINT) with no process left behind, and a second start reuses the data.
import { spawn, execFileSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { jest } from '@jest/globals';
import { freePort } from '@platform/testkit';

const startScript = fileURLToPath(new URL('../dist/start.js', import.meta.url));
jest.setTimeout(120_000);

interface Stack {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

async function startStack(env: Record<string, string>): Promise<Stack> {
  let output = '';
  const child = spawn(process.execPath, [startScript], {
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const deadline = Date.now() + 90_000;
  while (!output.includes('local stack is up')) {
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error(`stack did not come up:\n${output.slice(-3000)}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return { child, output: () => output, exited };
}

function processesUsing(dir: string): string[] {
  const lines = execFileSync('ps', ['-eo', 'pid,args'], { encoding: 'utf8' }).split('\n');
  return lines.filter((line) => line.includes(dir) && !line.includes('ps -eo'));
}

describe('npm start (local stack)', () => {
  let dataDir: string;
  let env: Record<string, string>;

  beforeAll(async () => {
    if (!existsSync(startScript))
      throw new Error(`${startScript} is missing: run npx tsc -b (npm test does)`);
    dataDir = await mkdtemp(join(tmpdir(), 'platform-stack-'));
    // As root, embedded PostgreSQL runs as the OS user `postgres`, which must be able to enter the folder.
    await chmod(dataDir, 0o711);
    env = {
      PLATFORM_DATA_DIR: dataDir,
      LOCAL_POSTGRES_PORT: String(await freePort('tcp')),
      GATEWAY_HTTP_PORT: String(await freePort('tcp')),
      GATEWAY_COAP_PORT: String(await freePort('udp')),
      PORT: String(await freePort('tcp')),
      LOCAL_S3_PORT: String(await freePort('tcp')),
      LOCAL_ISSUER_PORT: String(await freePort('tcp')),
      LOG_LEVEL: 'warn',
    };
  });

  afterAll(async () => {
    await rm(dataDir, { recursive: true, force: true });
  });

  it('starts, serves both services, stops on SIGINT without orphans, and restarts on the same data', async () => {
    const first = await startStack(env);
    expect(first.output()).toContain(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api`);
    expect(first.output()).toContain('npm run token -- alice');
    const gateway = await fetch(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api/ready`);
    expect(gateway.status).toBe(200);
    const workflow = await fetch(`http://127.0.0.1:${env.PORT}/ready`);
    expect(workflow.status).toBe(200);

    first.child.kill('SIGINT');
    await expect(first.exited).resolves.toBe(0);
    expect(processesUsing(dataDir)).toEqual([]);

    // The second start finds an initialised cluster, applied migrations and the seed: nothing to redo.
    const second = await startStack(env);
    expect(second.output()).not.toContain('initdb');
    const settings = await fetch(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api/health`);
    expect(settings.status).toBe(200);
    second.child.kill('SIGTERM');
    await expect(second.exited).resolves.toBe(0);
    expect(processesUsing(dataDir)).toEqual([]);
  });
});
