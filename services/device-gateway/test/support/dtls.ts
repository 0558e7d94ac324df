// Shared pieces of the DTLS tests: a server with an echo callback, a recording UDP relay (the attacker on
// the path), external client runs, and a seeded PRNG.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import { dtls } from 'node-dtls-client';
import { ContentType, HandshakeType } from '../../src/dtls/constants.js';
import { encodeHandshake } from '../../src/dtls/handshake.js';
import { DtlsServer } from '../../src/dtls/index.js';
import { encodeRecord } from '../../src/dtls/record.js';
import type {
  DtlsServerInit,
  DtlsSession,
  DtlsSessionEndReason,
  PskCredential,
} from '../../src/dtls/index.js';

/** A printable key, as the gateway issues them (libcoap's -k takes text). */
export const KEY = Buffer.from('k3y-for-dev1-0123456789abcdefghi');
export const KEY_HEX = KEY.toString('hex');
export const IDENTITY = 'dev1-identity';

export const silentLogger = {
  info: (): void => undefined,
  warn: (): void => undefined,
  error: (): void => undefined,
  debug: (): void => undefined,
};

export interface TestServer {
  server: DtlsServer;
  port: number;
  started: DtlsSession[];
  ended: { session: DtlsSession; reason: DtlsSessionEndReason }[];
  received: { session: DtlsSession; data: Buffer }[];
  credentials: Map<string, PskCredential>;
}

/** A server on 127.0.0.1 with one credential whose application data is echoed back prefixed 'echo:'. */
export async function startEchoServer(options: Partial<DtlsServerInit> = {}): Promise<TestServer> {
  const credentials = new Map<string, PskCredential>([
    [IDENTITY, { credentialId: 'cred-1', identity: IDENTITY, key: KEY, deviceId: 'device-1' }],
  ]);
  const server = new DtlsServer({
    lookupPsk: (identity) => credentials.get(identity),
    logger: silentLogger,
    ...options,
  });
  const t: TestServer = { server, port: 0, started: [], ended: [], received: [], credentials };
  server.onApplicationData = (session, data) => {
    t.received.push({ session, data });
    server.send(session, Buffer.concat([Buffer.from('echo:'), data]));
  };
  server.onSessionStart = (session) => t.started.push(session);
  server.onSessionEnd = (session, reason) => t.ended.push({ session, reason });
  await server.listen(0, '127.0.0.1');
  t.port = server.address().port;
  return t;
}

export async function waitFor(cond: () => boolean, timeoutMs = 5000, what = 'condition'): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export interface ToolRun {
  output: string;
  code: number | null;
}

/**
 * Runs an external client. Writes `input`, and when `until` matches the output closes stdin (the tools
 * then send close_notify and exit); kills the process after `timeoutMs`.
 */
export function runTool(
  cmd: string,
  args: string[],
  input: string,
  until: RegExp | undefined,
  timeoutMs = 8000,
  env: Record<string, string> = {},
): Promise<ToolRun> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...env } });
    let output = '';
    let closedInput = false;
    const onData = (d: Buffer): void => {
      output += d.toString();
      if (until && !closedInput && until.test(output)) {
        closedInput = true;
        child.stdin.end();
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.stdin.on('error', () => undefined);
    child.stdin.write(input);
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ output, code });
    });
  });
}

export function opensslArgs(
  port: number,
  identity: string,
  keyHex: string,
  cipher = 'PSK-AES128-CCM8',
): string[] {
  return [
    's_client',
    '-dtls1_2',
    '-connect',
    `127.0.0.1:${port}`,
    '-psk_identity',
    identity,
    '-psk',
    keyHex,
    '-cipher',
    cipher,
    '-brief',
  ];
}

export const GNUTLS_CCM8_ONLY =
  'NONE:+VERS-DTLS1.2:+PSK:+AES-128-CCM-8:+AEAD:+COMP-NULL:+SIGN-ALL:+CTYPE-X509';

export function gnutlsArgs(
  port: number,
  identity: string,
  keyHex: string,
  priority = GNUTLS_CCM8_ONLY,
): string[] {
  return [
    '--udp',
    '-p',
    String(port),
    '--pskusername',
    identity,
    '--pskkey',
    keyHex,
    '--priority',
    priority,
    '127.0.0.1',
  ];
}

/** A node-dtls-client connection that resolves once the handshake completed (or rejects). */
export interface NodeClient {
  socket: dtls.Socket;
  messages: Buffer[];
  closed: boolean;
  errors: Error[];
  /** Sends and waits for the next message. */
  request(data: Buffer, timeoutMs?: number): Promise<Buffer>;
}

export function connectNodeClient(
  port: number,
  opts: { identity?: string; key?: Buffer; listenPort?: number; timeout?: number } = {},
): Promise<NodeClient> {
  return new Promise((resolve, reject) => {
    const socket = dtls.createSocket({
      type: 'udp4',
      address: '127.0.0.1',
      port,
      psk: { [opts.identity ?? IDENTITY]: opts.key ?? KEY },
      timeout: opts.timeout ?? 3000,
      ciphers: ['TLS_PSK_WITH_AES_128_CCM_8'],
      ...(opts.listenPort !== undefined ? { listenPort: opts.listenPort } : {}),
    });
    const c: NodeClient = {
      socket,
      messages: [],
      closed: false,
      errors: [],
      request(data, timeoutMs = 3000) {
        const before = c.messages.length;
        socket.send(data);
        return waitFor(() => c.messages.length > before, timeoutMs, 'a reply').then(
          () => c.messages[before]!,
        );
      },
    };
    socket.on('connected', () => resolve(c));
    socket.on('message', (m: Buffer) => c.messages.push(m));
    socket.on('close', () => {
      c.closed = true;
    });
    socket.on('error', (e: Error) => {
      c.errors.push(e);
      reject(e);
    });
  });
}

/** Closes the client's UDP socket without a close_notify (a device that lost its state). */
export function dropNodeClient(c: NodeClient): void {
  (c.socket as unknown as { udp: dgram.Socket }).udp.close();
}

export type RelayHook = (datagram: Buffer) => Buffer | null;

/**
 * A UDP relay between one client and the server that records every datagram and lets a test rewrite or
 * drop them, or inject its own from the relay's address (which the server sees as the client's).
 */
export class Relay {
  readonly clientToServer: Buffer[] = [];
  readonly serverToClient: Buffer[] = [];
  onClientDatagram: RelayHook = (d) => d;
  onServerDatagram: RelayHook = (d) => d;
  private readonly front = dgram.createSocket('udp4');
  private readonly back = dgram.createSocket('udp4');
  private client?: { address: string; port: number };

  constructor(private readonly serverPort: number) {}

  async start(): Promise<number> {
    this.front.on('message', (m, r) => {
      this.client = { address: r.address, port: r.port };
      this.clientToServer.push(m);
      const out = this.onClientDatagram(m);
      if (out) this.back.send(out, this.serverPort, '127.0.0.1');
    });
    this.back.on('message', (m) => {
      this.serverToClient.push(m);
      const out = this.onServerDatagram(m);
      if (out && this.client) this.front.send(out, this.client.port, this.client.address);
    });
    await new Promise<void>((r) => this.front.bind(0, '127.0.0.1', r));
    await new Promise<void>((r) => this.back.bind(0, '127.0.0.1', r));
    return this.front.address().port;
  }

  /** Sends to the server from the relay's back socket: the server takes it for the client. */
  inject(datagram: Buffer): void {
    this.back.send(datagram, this.serverPort, '127.0.0.1');
  }

  close(): void {
    this.front.close();
    this.back.close();
  }
}

/** mulberry32: a small seeded PRNG so that fuzz failures reproduce. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A ClientHello record as a minimal PSK client would send it (RFC 6347 §4.2.1; TLS_PSK_WITH_AES_128_CCM_8). */
export function clientHello(opts: {
  cookie?: Buffer;
  random?: Buffer;
  recordSeq?: number;
  messageSeq?: number;
  suites?: number[];
}): Buffer {
  const suites = opts.suites ?? [0xc0a8];
  const cookie = opts.cookie ?? Buffer.alloc(0);
  const suiteBytes = Buffer.alloc(2 + 2 * suites.length);
  suiteBytes.writeUInt16BE(2 * suites.length, 0);
  suites.forEach((s, i) => suiteBytes.writeUInt16BE(s, 2 + 2 * i));
  const body = Buffer.concat([
    Buffer.from([0xfe, 0xfd]),
    opts.random ?? randomBytes(32),
    Buffer.from([0, cookie.length]),
    cookie,
    suiteBytes,
    Buffer.from([1, 0]),
  ]);
  return encodeRecord(
    ContentType.handshake,
    0xfefd,
    0,
    opts.recordSeq ?? 0,
    encodeHandshake(HandshakeType.clientHello, opts.messageSeq ?? 0, body),
  );
}
