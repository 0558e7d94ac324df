// Gateway replicas as real processes (built dist/main.js) on one database, for the replica tests (design §3.6).
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { freePort } from '@platform/testkit';
import { API_KEYS, loginUrl } from './gateway.js';

const mainJs = fileURLToPath(new URL('../../dist/main.js', import.meta.url));

export interface Replica {
  name: string;
  child: ChildProcess;
  url: string;
  coapPort: number;
  logs(): string;
  waitReady(timeoutMs?: number): Promise<void>;
  ready(): Promise<number>;
  /** The bus part of /api/config (origin, status, counters). */
  cluster(): Promise<Record<string, unknown>>;
  post(
    path: string,
    body?: unknown,
  ): Promise<{ status: number; body: Record<string, unknown>; headers: Headers }>;
  stop(): Promise<number | null>;
}

export async function startReplica(
  name: string,
  ownerUrl: string,
  env: Record<string, string> = {},
): Promise<Replica> {
  const httpPort = await freePort('tcp');
  const coapPort = await freePort('udp');
  const child = spawn(process.execPath, [mainJs], {
    env: {
      PATH: process.env.PATH,
      DATABASE_URL: loginUrl(ownerUrl),
      GATEWAY_API_KEYS: API_KEYS.join(','),
      GATEWAY_HTTP_PORT: String(httpPort),
      GATEWAY_COAP_PORT: String(coapPort),
      GATEWAY_COAP_HOST: '127.0.0.1',
      COAP_ACK_TIMEOUT_MS: '200',
      LOG_LEVEL: 'info',
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let logs = '';
  child.stdout.on('data', (d: Buffer) => (logs += d.toString()));
  child.stderr.on('data', (d: Buffer) => (logs += d.toString()));
  const url = `http://127.0.0.1:${httpPort}`;
  const auth = { Authorization: `Bearer ${API_KEYS[0]}` };
  const replica: Replica = {
    name,
    child,
    url,
    coapPort,
    logs: () => logs,
    async ready() {
      try {
        return (await fetch(`${url}/api/ready`)).status;
      } catch {
        return 0;
      }
    },
    async waitReady(timeoutMs = 30000) {
      const deadline = Date.now() + timeoutMs;
      while (Date.now() < deadline) {
        if ((await replica.ready()) === 200) return;
        if (child.exitCode !== null) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error(`replica ${name} did not become ready:\n${logs}`);
    },
    async cluster() {
      const res = await fetch(`${url}/api/config`, { headers: auth });
      return ((await res.json()) as { cluster: Record<string, unknown> }).cluster;
    },
    async post(path, body) {
      const res = await fetch(`${url}${path}`, {
        method: 'POST',
        headers: { ...auth, 'Content-Type': 'application/json' },
        body: JSON.stringify(body ?? {}),
      });
      return {
        status: res.status,
        body: (await res.json()) as Record<string, unknown>,
        headers: res.headers,
      };
    },
    async stop() {
      if (child.exitCode !== null) return child.exitCode;
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      child.kill('SIGTERM');
      return exited;
    },
  };
  return replica;
}
