// Review of issue 29 item 11: the local stack by default. Every socket any of its processes listens on (TCP)
// or is bound to for serving (UDP) is on loopback; nothing the environment supplied as a secret is printed;
// .data/postgrest.env (which holds the authenticator's password) is readable by its owner only, also when a
// file of that name was already there. Each test asserts the secure behaviour; a failing test is a finding.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { jest } from '@jest/globals';
import { freePort } from '@platform/testkit';

const startScript = fileURLToPath(new URL('../dist/start.js', import.meta.url));
jest.setTimeout(150_000);

let child: ChildProcess | undefined;
let dataDir: string;
afterAll(async () => {
  if (child !== undefined && child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((r) => child!.once('exit', r));
    process.kill(-child.pid!, 'SIGINT');
    await exited;
  }
  await rm(dataDir, { recursive: true, force: true });
});

/** The pids of `root` and all its descendants (from /proc/<pid>/stat's ppid). */
function tree(root: number): number[] {
  const parent = new Map<number, number>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      parent.set(Number(name), ppid);
    } catch {
      // gone meanwhile
    }
  }
  const out = [root];
  for (let grew = true; grew;) {
    grew = false;
    for (const [pid, ppid] of parent) {
      if (out.includes(ppid) && !out.includes(pid)) {
        out.push(pid);
        grew = true;
      }
    }
  }
  return out;
}

function socketInodes(pids: number[]): Map<string, string> {
  const inodes = new Map<string, string>();
  for (const pid of pids) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    let cmd = '';
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').slice(0, 80);
    } catch {
      // ignore
    }
    for (const fd of fds) {
      try {
        const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
        if (m) inodes.set(m[1]!, `${pid} ${cmd}`);
      } catch {
        // closed meanwhile
      }
    }
  }
  return inodes;
}

function decode(hex: string): string {
  if (hex.length === 8) return [3, 2, 1, 0].map((i) => parseInt(hex.slice(i * 2, i * 2 + 2), 16)).join('.');
  return `[${hex}]`;
}

/** Listening TCP sockets and unconnected bound UDP sockets of these processes that are not on loopback. */
let listenersSeen = 0;
function nonLoopback(pids: number[]): string[] {
  const inodes = socketInodes(pids);
  const out: string[] = [];
  listenersSeen = 0;
  for (const proto of ['tcp', 'tcp6', 'udp', 'udp6']) {
    const file = `/proc/net/${proto}`;
    if (!existsSync(file)) continue;
    for (const line of readFileSync(file, 'utf8').split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols.length < 10) continue;
      const [, local, remote, state] = cols;
      const inode = cols[9]!;
      if (!inodes.has(inode)) continue;
      if (proto.startsWith('tcp') && state !== '0A') continue;
      if (proto.startsWith('udp') && !/^0+:0000$/.test(remote!)) continue;
      listenersSeen++;
      const addr = decode(local!.slice(0, -5));
      const port = parseInt(local!.slice(-4), 16);
      const loopback =
        addr.startsWith('127.') ||
        addr === '[00000000000000000000000001000000]' || // ::1
        addr === '[0000000000000000FFFF00000100007F]'; // ::ffff:127.0.0.1
      if (!loopback) out.push(`${proto} ${addr}:${port} (${inodes.get(inode)!})`);
    }
  }
  return out;
}

it('by default nothing of the stack listens beyond loopback, no env secret is printed, postgrest.env is 0600', async () => {
  dataDir = await mkdtemp(join(tmpdir(), 'r29-stack-'));
  await chmod(dataDir, 0o711);
  // A file of that name already there (an older checkout, a copy, a user's touch), world-readable.
  writeFileSync(join(dataDir, 'postgrest.env'), 'OLD=1\n', { mode: 0o644 });
  const secrets = {
    AUTHENTICATOR_PASSWORD: `envAuthPw${Date.now()}`,
    ENTERPRISE_API_PASSWORD: `envApiPw${Date.now()}`,
    DEVICE_GATEWAY_DB_PASSWORD: `envGwPw${Date.now()}`,
    GATEWAY_API_KEYS: `envApiKey${Date.now()}`,
    WEBHOOK_TOKENS: `envWebhook${Date.now()}`,
  };
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    PLATFORM_DATA_DIR: dataDir,
    LOCAL_POSTGRES_PORT: String(await freePort('tcp')),
    GATEWAY_HTTP_PORT: String(await freePort('tcp')),
    GATEWAY_COAP_PORT: String(await freePort('udp')),
    GATEWAY_COAPS_PORT: String(await freePort('udp')),
    PORT: String(await freePort('tcp')),
    POSTGREST_PORT: String(await freePort('tcp')),
    LOCAL_S3_PORT: String(await freePort('tcp')),
    LOCAL_ISSUER_PORT: String(await freePort('tcp')),
    LOG_LEVEL: 'info',
    ...secrets,
  };
  let output = '';
  child = spawn(process.execPath, [startScript], { env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  child.stdout?.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (output += c.toString()));
  const deadline = Date.now() + 120_000;
  while (!output.includes('local stack is up') && child.exitCode === null && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 200));
  if (!output.includes('local stack is up'))
    throw new Error(`stack did not come up:\n${output.slice(-3000)}`);

  const exposed = nonLoopback(tree(child.pid!));
  // The enumeration sees the stack's listeners: both HTTP APIs, CoAP, CoAPS, PostgreSQL, s3rver, issuer.
  expect(listenersSeen).toBeGreaterThanOrEqual(7);
  const printed = Object.entries(secrets)
    .filter(([, v]) => output.includes(v))
    .map(([k]) => k);
  const envFile = join(dataDir, 'postgrest.env');
  const mode = (statSync(envFile).mode & 0o777).toString(8);
  const holdsPassword = readFileSync(envFile, 'utf8').includes(secrets.AUTHENTICATOR_PASSWORD);
  expect({ exposed, printed, mode, holdsPassword }).toEqual({
    exposed: [],
    printed: [],
    mode: '600',
    holdsPassword: true,
  });
});
