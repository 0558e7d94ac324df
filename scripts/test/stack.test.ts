// `npm start` end to end: the stack comes up on free ports with a private data directory, serves both
// services, takes a photo from a presigned upload to a download (design §4.4; s3rver, the stack's own
// webhook bridge, the development issuer), runs the demo calls its banner prints, stops cleanly on SIGINT
// with no process left behind, and a second start reuses the data. A Ctrl-C in a terminal (SIGINT to the
// whole process group) stops every service once and gracefully; the stack listens on 127.0.0.1 only and
// prints no key that came from the environment; without a postgrest binary it writes PostgREST's settings.
// A second start beside a running one refuses and leaves the first one running.
import { execFile, execFileSync, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { jest } from '@jest/globals';
import { AUTHENTICATOR, demoSites } from '@platform/enterprise-db';
import { freePort } from '@platform/testkit';
import pg from 'pg';
import { demoExamples } from '../src/lib/demo-examples.js';
import { localPorts } from '../src/lib/local.js';

const repoRoot = fileURLToPath(new URL('../../', import.meta.url));
const startScript = fileURLToPath(new URL('../dist/start.js', import.meta.url));
const tokenScript = fileURLToPath(new URL('../dist/token.js', import.meta.url));
const deviceKeyScript = fileURLToPath(
  new URL('../../services/device-gateway/dist/cli/device-key.js', import.meta.url),
);
jest.setTimeout(120_000);

interface Stack {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

// Every stack started, so that a failing assertion does not leave PostgreSQL, s3rver and the services running.
const started: Stack[] = [];

/**
 * Starts `npm start`'s script. With `ownGroup`, in a process group of its own, as a terminal runs its
 * foreground job: a SIGINT to the group (`process.kill(-pid)`) is what Ctrl-C sends.
 *
 * A port found free when the test began can be taken before the stack binds it: the other test files
 * open UDP sockets on ephemeral ports all the time (this machine's benchmarks too). When a start fails
 * with EADDRINUSE, the port it names gets a new free port in `env` (the caller's object, so that later
 * starts use it too) and the stack is started again, up to three times.
 */
async function startStack(env: Record<string, string>, { ownGroup = false } = {}): Promise<Stack> {
  for (let attempt = 1; ; attempt++) {
    const stack = spawnStack(env, ownGroup);
    const deadline = Date.now() + 90_000;
    while (!stack.output().includes('local stack is up')) {
      if (stack.child.exitCode !== null || Date.now() > deadline) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    if (stack.output().includes('local stack is up')) return stack;
    const taken = /EADDRINUSE[^\n]*?:(\d+)\b/.exec(stack.output())?.[1];
    const name = Object.keys(env).find((key) => key.endsWith('PORT') && env[key] === taken);
    if (attempt >= 3 || name === undefined) {
      throw new Error(`stack did not come up:\n${stack.output().slice(-3000)}`);
    }
    await stack.exited;
    env[name] = String(await freePort(/COAPS?_PORT$/.test(name) ? 'udp' : 'tcp'));
  }
}

function spawnStack(env: Record<string, string>, ownGroup: boolean): Stack {
  let output = '';
  const child = spawn(process.execPath, [startScript], {
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: ownGroup,
  });
  child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const stack: Stack = { child, output: () => output, exited };
  started.push(stack);
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

/**
 * The local addresses of the sockets listening on `port` (TCP, state LISTEN) or bound to it (UDP), from
 * /proc/net: IPv4 as dotted quads, IPv6 as `[hex]` (`[00000000000000000000000000000000]` is `::`).
 */
function boundAddresses(protocol: 'tcp' | 'udp', port: number): string[] {
  const portHex = port.toString(16).toUpperCase().padStart(4, '0');
  const found: string[] = [];
  for (const file of [`/proc/net/${protocol}`, `/proc/net/${protocol}6`]) {
    if (!existsSync(file)) continue;
    for (const line of readFileSync(file, 'utf8').split('\n').slice(1)) {
      const [, local, , state] = line.trim().split(/\s+/);
      if (local === undefined || !local.endsWith(`:${portHex}`)) continue;
      if (protocol === 'tcp' && state !== '0A') continue;
      const hex = local.slice(0, -5);
      found.push(
        hex.length === 8
          ? [3, 2, 1, 0].map((i) => parseInt(hex.slice(i * 2, i * 2 + 2), 16)).join('.')
          : `[${hex}]`,
      );
    }
  }
  return found;
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
    // A lock left by a stack that is gone, whose pid another process (this one) has taken since: not a
    // running stack, so it does not stop this start.
    writeFileSync(join(dataDir, 'stack.pid'), `${JSON.stringify({ pid: process.pid, start: '1' })}\n`);
    const first = await startStack(env);
    // It says what it is doing while it starts, and the readiness polls it makes meanwhile are no warnings.
    for (const step of [
      '[stack] starting embedded PostgreSQL on 127.0.0.1:',
      '; first start: creating the cluster)',
      '[stack] applying migrations and demo seed',
      '[stack] starting the local object store (s3rver)',
      '[stack] starting the development token issuer',
      '[stack] starting device-gateway and enterprise-workflow; their own log lines follow',
      '[stack] waiting until both answer ready',
      '[stack] device-gateway is ready',
      '[stack] enterprise-workflow is ready',
    ])
      expect({ step, said: first.output().includes(step) }).toEqual({ step, said: true });
    expect(first.output()).not.toMatch(/"level":"warn"[^\n]*ready/i);

    // `npm run device-key` without DATABASE_URL names the URL the banner prints (on the default port), and
    // with the banner's own command it lists the demo device's key.
    const bannerCommand = /DATABASE_URL=(postgres:\/\/\S+) npm run device-key -- list/.exec(first.output());
    expect(bannerCommand).not.toBeNull();
    const stackUrl = bannerCommand![1]!;
    expect(first.output()).toContain(`PostgreSQL           ${stackUrl}  (embedded`);
    const run = promisify(execFile);
    const missing = await run(process.execPath, [deviceKeyScript, 'list'], {
      env: { PATH: process.env.PATH ?? '' },
    }).catch((err: { code: number; stderr: string }) => err);
    expect(missing).toMatchObject({ code: 2 });
    const onDefaultPort = stackUrl.replace(`:${env.LOCAL_POSTGRES_PORT}/`, `:${localPorts.postgres}/`);
    expect((missing as { stderr: string }).stderr).toContain(
      `DATABASE_URL=${onDefaultPort} npm run device-key -- list`,
    );
    const listed = await run(process.execPath, [deviceKeyScript, 'list', 'acme-hq-hvac-01'], {
      env: { PATH: process.env.PATH ?? '', DATABASE_URL: stackUrl },
    });
    expect(listed.stdout).toContain('acme-hq-hvac-01');
    // The development key the banner prints was issued with its audit row, like the command's keys.
    const owner = new pg.Client({ connectionString: stackUrl });
    await owner.connect();
    try {
      const { rows } = await owner.query<{ principal: string }>(
        `SELECT principal FROM device_gateway.audit_events
         WHERE action = 'device_key.issued' AND device_id = 'acme-hq-hvac-01'`,
      );
      expect(rows).toEqual([{ principal: 'command:npm-start' }]);
    } finally {
      await owner.end();
    }

    // A second start on the same data refuses at once, naming the running stack, and leaves it running: it
    // used to stop the first stack's PostgreSQL (taking it for a leftover) and then fail on ports in use.
    const refused = spawnStack(env, false);
    await expect(refused.exited).resolves.toBe(1);
    const running = /\[stack\] a stack is already running \(pid (\d+)\) on /.exec(refused.output());
    expect({ output: refused.output(), refused: running !== null }).toEqual({
      output: refused.output(),
      refused: true,
    });
    // The pid named is the first stack's (start.ts's child).
    const named = Number(running![1]);
    const stat = readFileSync(`/proc/${named}/stat`, 'utf8');
    expect(Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])).toBe(first.child.pid);
    expect(refused.output()).not.toContain('PostgreSQL');
    expect((await fetch(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api/ready`)).status).toBe(200);
    expect(first.output()).toContain(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api`);
    expect(first.output()).toContain('npm run -s token -- alice');
    const gateway = await fetch(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}/api/ready`);
    expect(gateway.status).toBe(200);
    const workflow = await fetch(`http://127.0.0.1:${env.PORT}/ready`);
    expect(workflow.status).toBe(200);
    // Both tokens at once: each is a Node process that loads the signing keys (about half a second).
    const [alice, carol] = await Promise.all([devToken(env, 'alice'), devToken(env, 'carol')]);
    const photo = await uploadAndDownload(env, first, { alice, carol });

    // The banner's demo calls, as printed (with this stack's port): the ready media item downloads, the
    // proposed work item can be accepted.
    const workflowUrl = `http://127.0.0.1:${env.PORT}`;
    const site = `${workflowUrl}/sites/${demoExamples.site.id}`;
    const download = `${site}/media/${demoExamples.readyMediaId}/download`;
    const decision = `${site}/work-items/${demoExamples.proposedWorkItemId}/decision`;
    expect(first.output()).toContain(`site ${demoExamples.site.id}`);
    expect(first.output()).toContain(`curl -H "Authorization: Bearer $TOKEN" ${download}`);
    expect(first.output()).toContain(`-d '{"decision":"accept"}' ${decision}`);
    expect(first.output()).toContain('npm run -s token -- alice');
    const ready = await workflowApi(env, download.slice(workflowUrl.length), alice);
    expect(ready.status).toBe(200);
    // As the README says: the seed writes rows, not files, so the store has nothing under that URL.
    expect((await fetch(ready.body.url as string)).status).toBe(404);
    const accepted = await workflowApi(env, decision.slice(workflowUrl.length), alice, {
      decision: 'accept',
    });
    expect(accepted).toMatchObject({ status: 200, body: { status: 'accepted' } });

    // `npm run -s token -- alice` prints the bare token and nothing else (the README's TOKEN=$(…)).
    const { stdout: printed } = await promisify(execFile)('npm', ['run', '-s', 'token', '--', 'alice'], {
      cwd: repoRoot,
      env: { ...process.env, PLATFORM_DATA_DIR: dataDir, LOCAL_ISSUER_PORT: env.LOCAL_ISSUER_PORT ?? '' },
    });
    expect(printed).toMatch(/^[\w-]+\.[\w-]+\.[\w-]+\n$/);
    expect((await workflowApi(env, download.slice(workflowUrl.length), printed.trim())).status).toBe(200);

    // The gateway takes the same issuer's operations tokens (design §3.1): olga lists the fleet; vera, a
    // viewer, may not reload (403); a portal token is not for the operations client (401).
    const fleet = (token: string, method = 'GET', path = '/api/devices') =>
      fetch(`http://127.0.0.1:${env.GATEWAY_HTTP_PORT}${path}`, {
        method,
        headers: { authorization: `Bearer ${token}` },
      });
    expect(first.output()).toContain('npm run -s token -- olga');
    const [olga, vera] = await Promise.all([devToken(env, 'olga'), devToken(env, 'vera')]);
    expect((await fleet(olga)).status).toBe(200);
    expect((await fleet(vera, 'POST', '/api/reload-registry')).status).toBe(403);
    expect((await fleet(alice)).status).toBe(401);

    first.child.kill('SIGINT');
    await expect(first.exited).resolves.toBe(0);
    expect(processesUsing(dataDir)).toEqual([]);
    expect(existsSync(join(dataDir, 'stack.pid'))).toBe(false);

    // The second start finds an initialised cluster, applied migrations and the seed: nothing to redo.
    const second = await startStack(env);
    expect(second.output()).not.toContain('initdb');
    expect(second.output()).not.toContain('first start: creating the cluster');
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

  it('binds to 127.0.0.1, prints no key from the environment, writes PostgREST settings, and stops every process once on one Ctrl-C', async () => {
    const secret = { apiKey: `env-api-key-${Date.now()}`, webhookToken: `env-webhook-token-${Date.now()}` };
    // Ports of its own: a port found free in beforeAll may have been taken since (an ephemeral UDP port).
    const stackEnv = {
      ...env,
      GATEWAY_HTTP_PORT: String(await freePort('tcp')),
      GATEWAY_COAP_PORT: String(await freePort('udp')),
      GATEWAY_COAPS_PORT: String(await freePort('udp')),
      PORT: String(await freePort('tcp')),
      LOCAL_S3_PORT: String(await freePort('tcp')),
      LOCAL_ISSUER_PORT: String(await freePort('tcp')),
      POSTGREST_PORT: String(await freePort('tcp')),
      GATEWAY_API_KEYS: `${secret.apiKey},second-${secret.apiKey}`,
      WEBHOOK_TOKENS: secret.webhookToken,
      // The services' drain and every warning are visible: "second signal during shutdown" is a warning.
      LOG_LEVEL: 'info',
      // The services' lines as text (README, LOG_FORMAT).
      LOG_FORMAT: 'pretty',
    };
    const stack = await startStack(stackEnv, { ownGroup: true });
    const banner = stack.output();

    // LOG_FORMAT=pretty: every line of the services is text (time, level, service, message, fields), none JSON.
    expect(banner).toMatch(/^\d\d:\d\d:\d\d\.\d{3} info {2}device-gateway {2}\S/m);
    expect(banner).toMatch(/^\d\d:\d\d:\d\d\.\d{3} info {2}enterprise-workflow {2}\S/m);
    expect(banner.split('\n').filter((line) => line.startsWith('{'))).toEqual([]);

    // Keys from the environment are named, never printed.
    expect(banner).not.toContain(secret.apiKey);
    expect(banner).not.toContain(secret.webhookToken);
    expect(banner).toContain('<a key of GATEWAY_API_KEYS>');

    // Everything a client calls listens on loopback only (TCP: both HTTP APIs; UDP: CoAP and CoAPS).
    expect({
      gatewayHttp: boundAddresses('tcp', Number(stackEnv.GATEWAY_HTTP_PORT)),
      workflow: boundAddresses('tcp', Number(stackEnv.PORT)),
      coap: boundAddresses('udp', Number(stackEnv.GATEWAY_COAP_PORT)),
      coaps: boundAddresses('udp', Number(stackEnv.GATEWAY_COAPS_PORT)),
    }).toEqual({
      gatewayHttp: ['127.0.0.1'],
      workflow: ['127.0.0.1'],
      coap: ['127.0.0.1'],
      coaps: ['127.0.0.1'],
    });

    // Without a postgrest binary: the version compose pins and an env file with every PGRST_* setting.
    const hasPostgrest =
      execFileSync('sh', ['-c', 'command -v postgrest || true'], { encoding: 'utf8' }) !== '';
    const envFile = join(dataDir, 'postgrest.env');
    const settings = Object.fromEntries(
      (await readFile(envFile, 'utf8'))
        .trimEnd()
        .split('\n')
        .map((line) => [line.slice(0, line.indexOf('=')), line.slice(line.indexOf('=') + 1)]),
    );
    const pinned = /image:\s*(postgrest\/postgrest:\S+)/.exec(
      readFileSync(join(repoRoot, 'docker-compose.yml'), 'utf8'),
    )?.[1];
    expect(pinned).toBeDefined();
    // Without a binary: how to run the pinned version with these settings, and how npm test does without.
    const postgrestLines = hasPostgrest
      ? [`PostgREST            http://127.0.0.1:${stackEnv.POSTGREST_PORT}`]
      : [`docker run --rm --network host --env-file ${envFile} ${pinned!}`, 'design §4.3'];
    for (const line of postgrestLines) expect(banner).toContain(line);
    expect(Object.keys(settings).sort()).toEqual([
      'PGRST_DB_ANON_ROLE',
      'PGRST_DB_CONFIG',
      'PGRST_DB_MAX_ROWS',
      'PGRST_DB_PRE_CONFIG',
      'PGRST_DB_PRE_REQUEST',
      'PGRST_DB_SCHEMAS',
      'PGRST_DB_URI',
      'PGRST_JWT_AUD',
      'PGRST_JWT_ROLE_CLAIM_KEY',
      'PGRST_SERVER_HOST',
      'PGRST_SERVER_PORT',
    ]);
    expect(settings).toMatchObject({
      PGRST_SERVER_HOST: '127.0.0.1',
      PGRST_SERVER_PORT: stackEnv.POSTGREST_PORT,
    });
    // A shell reads the file as docker does (values taken literally).
    const sourced = execFileSync('sh', ['-c', `set -a; . "${envFile}"; env`], { encoding: 'utf8', env: {} });
    for (const [name, value] of Object.entries(settings)) expect(sourced).toContain(`${name}=${value}\n`);
    // The URI logs in as PostgREST's authenticator, and the pre-config function it names has the JWKS.
    const client = new pg.Client({ connectionString: settings.PGRST_DB_URI });
    await client.connect();
    try {
      const who = await client.query<{ user: string }>('SELECT current_user AS user');
      expect(who.rows[0]?.user).toBe(AUTHENTICATOR);
      // PostgREST calls it in a transaction; the settings it makes are local to that transaction.
      await client.query('BEGIN');
      await client.query(`SELECT ${settings.PGRST_DB_PRE_CONFIG}()`);
      const jwt = await client.query<{ secret: string | null }>(
        "SELECT current_setting('pgrst.jwt_secret', true) AS secret",
      );
      await client.query('COMMIT');
      expect(JSON.parse(jwt.rows[0]?.secret ?? '{}')).toHaveProperty('keys');
    } finally {
      await client.end();
    }

    // Ctrl-C: SIGINT to the whole process group, as a terminal sends it.
    process.kill(-stack.child.pid!, 'SIGINT');
    await expect(stack.exited).resolves.toBe(0);
    const output = stack.output();
    expect(output).not.toContain('forcing exit');
    for (const service of ['device-gateway', 'enterprise-workflow']) {
      const exits = output.split('\n').filter((line) => line.includes(`[stack] ${service} exited`));
      expect({ service, exits }).toEqual({
        service,
        exits: [`[stack] ${service} exited (code 0, signal null)`],
      });
    }
    expect(output.match(/\[stack\] stopping/g)).toHaveLength(1);
    expect(processesUsing(dataDir)).toEqual([]);
  });
});
