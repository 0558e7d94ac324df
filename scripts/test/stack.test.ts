// `npm start` end to end: the stack comes up on free ports with a private data directory, serves both
// services, takes a photo from a presigned upload to a download (design §4.4; s3rver, the stack's own
// webhook bridge, the development issuer), stops cleanly on Ctrl-C (SIGINT) with no process left behind,
// and a second start reuses the data.
import { execFile, execFileSync, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { jest } from '@jest/globals';
import { demoSites } from '@platform/enterprise-db';
import { freePort } from '@platform/testkit';

const startScript = fileURLToPath(new URL('../dist/start.js', import.meta.url));
const tokenScript = fileURLToPath(new URL('../dist/token.js', import.meta.url));
jest.setTimeout(120_000);

interface Stack {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

// Every stack started, so that a failing assertion does not leave PostgreSQL, s3rver and the services running.
const started: Stack[] = [];

async function startStack(env: Record<string, string>): Promise<Stack> {
  let output = '';
  const child = spawn(process.execPath, [startScript], {
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const stack: Stack = { child, output: () => output, exited };
  started.push(stack);
  const deadline = Date.now() + 90_000;
  while (!output.includes('local stack is up')) {
    if (child.exitCode !== null || Date.now() > deadline) {
      throw new Error(`stack did not come up:\n${output.slice(-3000)}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return stack;
}

/** What `npm run token -- <user>` prints, from the same script, against this stack's data and issuer port. */
async function devToken(env: Record<string, string>, user: string): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [tokenScript, user], {
    env: {
      PATH: process.env.PATH ?? '',
      PLATFORM_DATA_DIR: env.PLATFORM_DATA_DIR ?? '',
      LOCAL_ISSUER_PORT: env.LOCAL_ISSUER_PORT ?? '',
    },
  });
  return stdout.trim();
}

async function workflowApi(env: Record<string, string>, path: string, token: string, body?: unknown) {
  const res = await fetch(`http://127.0.0.1:${env.PORT}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

interface Photo {
  downloadPath: string;
  bytes: Buffer;
}

interface Tokens {
  alice: string;
  carol: string;
}

/**
 * Alice uploads a photo the way the portal does and waits until it can be downloaded. Only the stack's
 * webhook bridge can make it downloadable: nothing else tells the workflow service that s3rver has it.
 */
async function uploadAndDownload(
  env: Record<string, string>,
  stack: Stack,
  { alice, carol }: Tokens,
): Promise<Photo> {
  const site = demoSites.acmeHq.id;
  const bytes = Buffer.from('\x89PNG\r\n\x1a\n a photo uploaded through npm start');
  const intent = await workflowApi(env, `/sites/${site}/media/upload-intents`, alice, {
    filename: 'boiler room.png',
    content_type: 'image/png',
    size_bytes: bytes.length,
  });
  expect(intent.status).toBe(201);
  const mediaId = intent.body.media_id as string;
  const upload = intent.body.upload as { method: string; url: string; headers: Record<string, string> };
  // The URL handed to the client points at the stack's s3rver, not at some default endpoint.
  expect(upload.url.startsWith(`http://127.0.0.1:${env.LOCAL_S3_PORT}/`)).toBe(true);
  const downloadPath = `/sites/${site}/media/${mediaId}/download`;
  expect((await workflowApi(env, downloadPath, alice)).status).toBe(409);

  const put = await fetch(upload.url, { method: upload.method, headers: upload.headers, body: bytes });
  expect(put.status).toBe(200);

  // The bridge posts at once and retries after 0.5 s, 1 s, 2 s …; 10 s covers a few retries and still
  // fails quickly when nothing is delivered at all.
  const deadline = Date.now() + 10_000;
  let download = await workflowApi(env, downloadPath, alice);
  while (download.status !== 200 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
    download = await workflowApi(env, downloadPath, alice);
  }
  if (download.status !== 200) {
    throw new Error(
      `media ${mediaId} still answers ${download.status} 10 s after the upload: no object-created event ` +
        `for it reached the webhook. Stack output:\n${stack.output().slice(-3000)}`,
    );
  }
  expect(download.body).toMatchObject({
    media_id: mediaId,
    content_type: 'image/png',
    size_bytes: bytes.length,
    filename: 'boiler room.png',
  });
  await expectServes(download.body.url as string, bytes);

  // Carol (Borealis) can name neither Acme's site nor the item through one of her own sites.
  expect((await workflowApi(env, downloadPath, carol)).status).toBe(404);
  const viaCarolsSite = `/sites/${demoSites.borealisTower.id}/media/${mediaId}/download`;
  expect((await workflowApi(env, viaCarolsSite, carol)).status).toBe(404);
  return { downloadPath, bytes };
}

async function expectServes(url: string, bytes: Buffer): Promise<void> {
  const got = await fetch(url);
  expect(got.status).toBe(200);
  expect(got.headers.get('content-type')).toBe('image/png');
  expect(Buffer.from(await got.arrayBuffer()).equals(bytes)).toBe(true);
}

function processesUsing(dir: string): string[] {
  const lines = execFileSync('ps', ['-eo', 'pid,args'], { encoding: 'utf8' }).split('\n');
  return lines.filter((line) => line.includes(dir) && !line.includes('ps -eo'));
}

describe('npm start (local stack)', () => {
  let dataDir: string;
  let env: Record<string, string>;

  beforeAll(async () => {
    for (const script of [startScript, tokenScript]) {
      if (!existsSync(script)) throw new Error(`${script} is missing: run npx tsc -b (npm test does)`);
    }
    dataDir = await mkdtemp(join(tmpdir(), 'platform-stack-'));
    // As root, embedded PostgreSQL runs as the OS user `postgres`, which must be able to enter the folder.
    await chmod(dataDir, 0o711);
    env = {
      PLATFORM_DATA_DIR: dataDir,
      LOCAL_POSTGRES_PORT: String(await freePort('tcp')),
      GATEWAY_HTTP_PORT: String(await freePort('tcp')),
      GATEWAY_COAP_PORT: String(await freePort('udp')),
      GATEWAY_COAPS_PORT: String(await freePort('udp')),
      PORT: String(await freePort('tcp')),
      LOCAL_S3_PORT: String(await freePort('tcp')),
      LOCAL_ISSUER_PORT: String(await freePort('tcp')),
      LOG_LEVEL: 'warn',
    };
  });

  afterAll(async () => {
    for (const stack of started) {
      if (stack.child.exitCode === null && stack.child.signalCode === null) {
        stack.child.kill('SIGTERM');
        await stack.exited;
      }
    }
    await rm(dataDir, { recursive: true, force: true });
  });

  it('starts, serves both services, uploads and downloads a photo, stops on SIGINT without orphans, and restarts on the same data', async () => {
    const first = await startStack(env);
    expect(first.output()).toContain(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api`);
    expect(first.output()).toContain('npm run token -- alice');
    const gateway = await fetch(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api/ready`);
    expect(gateway.status).toBe(200);
    const workflow = await fetch(`http://127.0.0.1:${env.PORT}/ready`);
    expect(workflow.status).toBe(200);
    // Both tokens at once: each is a Node process that loads the signing keys (about half a second).
    const [alice, carol] = await Promise.all([devToken(env, 'alice'), devToken(env, 'carol')]);
    const photo = await uploadAndDownload(env, first, { alice, carol });

    first.child.kill('SIGINT');
    await expect(first.exited).resolves.toBe(0);
    expect(processesUsing(dataDir)).toEqual([]);

    // The second start finds an initialised cluster, applied migrations and the seed: nothing to redo.
    const second = await startStack(env);
    expect(second.output()).not.toContain('initdb');
    const settings = await fetch(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api/health`);
    expect(settings.status).toBe(200);
    // The photo outlived the restart (its row in PostgreSQL, its object in s3rver), and so did the
    // issuer's signing keys: the token printed before the restart is still accepted.
    const again = await workflowApi(env, photo.downloadPath, alice);
    expect(again.status).toBe(200);
    await expectServes(again.body.url as string, photo.bytes);
    second.child.kill('SIGTERM');
    await expect(second.exited).resolves.toBe(0);
    expect(processesUsing(dataDir)).toEqual([]);
  });
});
