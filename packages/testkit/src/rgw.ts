// A real S3 for tests: Ceph's RADOS Gateway (Debian's `radosgw`, Ceph 16.2) on a throwaway one-node
// cluster. One monitor, one OSD on `memstore` (objects in the OSD's memory, nothing written to disk but the
// monitor's small store) and radosgw's beast frontend, all on 127.0.0.1, without cephx, in a temporary
// directory. It verifies SigV4 (header and presigned), implements the multipart API, CORS and conditional
// requests as Ceph does, and reports created objects through a bucket notification (an SNS-style topic with
// an HTTP push endpoint) in AWS's record shape. Started in about 2 s on an idle machine, 126 MiB resident
// for the three daemons. Shaped like startS3 (s3.ts): same endpoint, bucket, credentials, event records and
// request log.
import { execFile, spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { constants as fsConstants } from 'node:fs';
import { access, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, request as httpRequest } from 'node:http';
import type { IncomingMessage, Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { commandSearchPath } from './config.js';
import { freePort } from './ports.js';
import { corsConfiguration, waitForRecord } from './s3.js';
import type { S3EventRecord, S3Request, TestObjectStore } from './s3.js';
import { signedHeaders } from './sigv4.js';

export interface StartRgwOptions {
  /** Bucket created at start. Default `media`. */
  bucket?: string;
  /** Browser origins allowed by the bucket's CORS rule (as startS3's). Default: none, no CORS rule. */
  corsOrigins?: readonly string[];
  /**
   * Called once per ObjectCreated record the gateway pushes, in order, one at a time (the push itself is
   * acknowledged at once, as a queue would). A rejection is passed to `onError`.
   */
  onObjectCreated?: (record: S3EventRecord) => void | Promise<void>;
  /** The notification's key filter (an S3Key `prefix` rule, applied by the gateway). Default: every key. */
  eventPrefix?: string;
  /** Default: `console.error`. */
  onError?: (err: unknown) => void;
  /** The longest the whole start may take, in ms (default 60,000: CI machines are shared). */
  startTimeoutMs?: number;
}

export interface RgwServer extends TestObjectStore {
  readonly kind: 'rgw';
  /** How long the start took, in ms. */
  readonly startupMs: number;
  /** Process ids of the monitor, the OSD and the gateway (e.g. to read their memory). */
  readonly pids: readonly number[];
}

/** The commands the start runs, each with the Debian package that ships it (bookworm: Ceph 16.2.15). */
const COMMANDS: ReadonlyArray<readonly [command: string, debianPackage: string]> = [
  ['radosgw', 'radosgw'],
  ['ceph-mon', 'ceph-mon'],
  ['monmaptool', 'ceph-base'],
  ['ceph-osd', 'ceph-osd'],
  ['radosgw-admin', 'ceph-common'],
  ['ceph', 'ceph-common'],
];

/** Thrown when a Ceph command is missing: the tests that need the gateway fail, never skip. */
export class RgwMissingError extends Error {
  constructor(missing: readonly string[]) {
    const packages = [...new Set(COMMANDS.filter(([c]) => missing.includes(c)).map(([, p]) => p))];
    super(
      `Ceph RADOS Gateway is not installed or not on PATH (missing: ${missing.join(', ')}): the workflow's ` +
        'store-facing tests run against it as well as against s3rver. Install the Debian packages ' +
        '`radosgw ceph-mon ceph-osd ceph-common` (apt-get install radosgw ceph-mon ceph-osd ceph-common; ' +
        `missing here: ${packages.join(', ')}), as .ci/run does, and run again.`,
    );
    this.name = 'RgwMissingError';
  }
}

async function onPath(command: string): Promise<boolean> {
  for (const dir of commandSearchPath()) {
    try {
      await access(join(dir, command), fsConstants.X_OK);
      return true;
    } catch {
      // not in this directory
    }
  }
  return false;
}

/** Throws RgwMissingError naming every missing command and its package. */
export async function requireRgwCommands(): Promise<void> {
  const found = await Promise.all(COMMANDS.map(([command]) => onPath(command)));
  const missing = COMMANDS.filter((_, i) => !found[i]).map(([command]) => command);
  if (missing.length > 0) throw new RgwMissingError(missing);
}

/**
 * The cluster's configuration. Without cephx (`auth_* = none`) the monitor client must be allowed crc mode
 * (its default, `secure crc`, needs cephx's session keys). Single replica pools of one PG each on the one
 * OSD; `paxos_propose_interval` at 10 ms instead of 1 s, so every map change (the OSD's boot, each pool the
 * gateway creates) commits at once. Every path is in the temporary directory, every socket on 127.0.0.1.
 */
function cephConf(dir: string, fsid: string, monPort: number): string {
  return `[global]
fsid = ${fsid}
mon_host = v2:127.0.0.1:${monPort}
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc secure
ms_bind_msgr1 = false
ms_bind_ipv6 = false
run_dir = ${dir}/run
admin_socket = ${dir}/run/$name.asok
log_file = ${dir}/$name.log
mon_cluster_log_file = ${dir}/cluster.log
crash_dir = ${dir}/crash
pid_file =
keyring = /dev/null
client_mount_timeout = 30
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
osd_pool_default_pg_num = 1
osd_pool_default_pgp_num = 1
osd_crush_chooseleaf_type = 0
paxos_propose_interval = 0.01
mon_data_avail_crit = 0
mon_data = ${dir}/mon
osd_data = ${dir}/osd
osd_objectstore = memstore
# The capacity memstore reports (bytes): above what a test run stores, since the OSD refuses writes past 95 %.
memstore_device_bytes = 8589934592
rgw_data = ${dir}/rgw
# Request threads (default 512): a test sends a handful of requests at once.
rgw_thread_pool_size = 64
[mon.a]
public_addr = v2:127.0.0.1:${monPort}
[osd]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
`;
}

/** Running daemons of this process, killed if it exits without stop(). */
const runningDaemons = new Set<ChildProcess>();
function killDaemonsOnExit(): void {
  for (const child of runningDaemons) child.kill('SIGKILL');
}

/**
 * A detached shell that outlives this process: when it dies without stop() (SIGKILL, a crash, jest killing a
 * worker), the daemons named in `<dir>/pids` are killed and the directory removed. Polls once per second.
 */
const watchdogScript = `
parent=$1; dir=$2
alive() {
  if [ -r "/proc/$1/stat" ]; then [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
  else kill -0 "$1" 2>/dev/null; fi
}
while alive "$parent"; do sleep 1; done
[ -r "$dir/pids" ] && kill -KILL $(cat "$dir/pids") 2>/dev/null
rm -rf "$dir"
`;

interface Daemon {
  name: string;
  child: ChildProcess;
  exited: Promise<void>;
  /** The end of what it wrote to stderr. */
  stderr(): string;
}

/** Keeps the last `limit` characters of a stream. */
function tail(limit: number): { add(chunk: Buffer): void; text(): string } {
  let text = '';
  return {
    add(chunk) {
      text = (text + chunk.toString('utf8')).slice(-limit);
    },
    text: () => text,
  };
}

class StartError extends Error {
  override readonly name = 'RgwStartError';
}

/** Polls `probe` every 50 ms until it answers true, failing at `deadline` (epoch ms) with `what`. */
async function until(probe: () => Promise<boolean>, deadline: number, what: string): Promise<void> {
  for (;;) {
    if (await probe()) return;
    if (Date.now() > deadline) throw new StartError(`timed out ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Decoded object key, part number and upload id of an S3 request path (`/<bucket>/<key>?…`). */
function describeRequest(method: string, url: string, status: number): S3Request {
  const parsed = new URL(url, 'http://gateway');
  const [, , ...rest] = parsed.pathname.split('/');
  const partNumber = parsed.searchParams.get('partNumber');
  return {
    method,
    key: rest.map((segment) => decodeURIComponent(segment)).join('/'),
    partNumber: partNumber === null ? undefined : Number(partNumber),
    uploadId: parsed.searchParams.get('uploadId') ?? undefined,
    status,
  };
}

/**
 * A pass-through in front of the gateway that records each request once the gateway answered it (the
 * request log startS3 keeps) and counts those under way. It changes nothing: the Host header goes through as
 * the client signed it. `Expect: 100-continue` is answered here and not forwarded (SigV4 never signs it). A
 * client that goes away (a reloaded page) takes its request to the gateway with it, as it would going straight.
 */
async function startRequestLog(
  target: number,
  log: S3Request[],
  counter: { inFlight: number },
): Promise<Server> {
  const server = createServer((req, res) => {
    counter.inFlight++;
    const { expect: _expect, ...headers } = req.headers;
    const upstream = httpRequest(
      { host: '127.0.0.1', port: target, method: req.method, path: req.url, headers },
      (answer) => {
        log.push(describeRequest(req.method ?? 'GET', req.url ?? '/', answer.statusCode ?? 0));
        if (res.destroyed) return void answer.resume();
        res.writeHead(answer.statusCode ?? 502, answer.statusMessage, answer.rawHeaders);
        answer.pipe(res);
      },
    );
    // Counted until the gateway is done with it, not until the client is: a reloaded page whose part was wholly
    // sent leaves the gateway storing it (seen: part 2 listed by the resumed page after the test's quiet wait).
    upstream.once('close', () => counter.inFlight--);
    upstream.on('error', () => {
      if (res.destroyed) return;
      if (!res.headersSent) res.writeHead(502).end();
      else res.destroy();
    });
    res.on('close', () => {
      // A body cut short is cut short at the gateway too; a whole one is left to be answered.
      if (!res.writableFinished && !req.complete) upstream.destroy();
    });
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return server;
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function xmlEscape(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/** Starts a one-node Ceph cluster with a RADOS Gateway on 127.0.0.1, one bucket and its notification. */
export async function startRgw(options: StartRgwOptions = {}): Promise<RgwServer> {
  await requireRgwCommands();
  const started = Date.now();
  const deadline = started + (options.startTimeoutMs ?? 60_000);
  const bucket = options.bucket ?? 'media';
  const onError =
    options.onError ??
    ((err: unknown) => {
      console.error('testkit RGW: onObjectCreated failed', err);
    });
  const dir = await mkdtemp(join(tmpdir(), 'testkit-rgw-'));
  const conf = join(dir, 'ceph.conf');
  const daemons: Daemon[] = [];
  const servers: Server[] = [];
  const watchdog = spawn(
    '/bin/sh',
    ['-c', watchdogScript, 'testkit-rgw-watchdog', String(process.pid), dir],
    {
      detached: true,
      stdio: 'ignore',
    },
  );
  watchdog.unref();

  const remainingMs = (): number => Math.max(1, deadline - Date.now());

  /** Runs a command to its end within the start's deadline; its stdout, or an error with its output. */
  const run = (command: string, args: readonly string[]): Promise<string> =>
    new Promise((resolve, reject) => {
      execFile(
        command,
        args,
        { timeout: remainingMs(), killSignal: 'SIGKILL', maxBuffer: 4 * 1024 * 1024 },
        (err, stdout, stderr) => {
          if (err === null) resolve(stdout);
          else reject(new StartError(`${command} ${args[0] ?? ''} failed: ${err.message} ${stderr}`.trim()));
        },
      );
    });

  const daemon = async (name: string, command: string, args: readonly string[]): Promise<Daemon> => {
    // -f: in the foreground (no fork), logging to its file in the directory.
    const child = spawn(command, ['-f', '-c', conf, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    const stderr = tail(4096);
    child.stderr?.on('data', (chunk: Buffer) => stderr.add(chunk));
    const exited = new Promise<void>((resolve) => {
      child.once('exit', () => resolve());
      child.once('error', () => resolve());
    });
    if (runningDaemons.size === 0) process.on('exit', killDaemonsOnExit);
    runningDaemons.add(child);
    const entry = { name, child, exited, stderr: () => stderr.text() };
    daemons.push(entry);
    await writeFile(join(dir, 'pids'), daemons.map((d) => d.child.pid ?? '').join(' '));
    return entry;
  };

  const alive = (): void => {
    for (const d of daemons) {
      if (d.child.exitCode !== null || d.child.signalCode !== null) {
        throw new StartError(`${d.name} exited (${d.child.exitCode ?? d.child.signalCode}): ${d.stderr()}`);
      }
    }
  };

  const killAll = async (): Promise<void> => {
    // Nothing to keep: SIGKILL also spares memstore's dump of every object to disk on a clean stop.
    for (const d of daemons) d.child.kill('SIGKILL');
    await Promise.all(daemons.map((d) => d.exited));
    for (const d of daemons) runningDaemons.delete(d.child);
    if (runningDaemons.size === 0) process.removeListener('exit', killDaemonsOnExit);
  };

  const closeServers = async (): Promise<void> => {
    await Promise.all(
      servers.map(
        (server) =>
          new Promise<void>((resolve) => {
            server.closeAllConnections();
            server.close(() => resolve());
          }),
      ),
    );
  };

  const records: S3EventRecord[] = [];
  const requests: S3Request[] = [];
  const counter = { inFlight: 0 };
  const waiters = new Set<(record: S3EventRecord) => void>();
  let delivery = Promise.resolve();
  const accessKeyId = `TESTKIT${randomBytes(6).toString('hex').toUpperCase()}`;
  const secretAccessKey = randomBytes(20).toString('base64url');
  const credentials = { accessKeyId, secretAccessKey };
  const region = 'us-east-1';

  try {
    const [monPort, gatewayPort] = await Promise.all([freePort('tcp'), freePort('tcp')]);
    const fsid = randomUUID();
    await Promise.all(['run', 'mon', 'osd', 'rgw', 'crash'].map((sub) => mkdir(join(dir, sub))));
    await writeFile(conf, cephConf(dir, fsid, monPort));

    // The monitor: its map, its store, then the daemon. The OSD's store is made meanwhile (it needs no
    // monitor), and its id allocated once the monitor answers.
    const monmap = join(dir, 'monmap');
    await run('monmaptool', ['--create', '--add', 'a', `v2:127.0.0.1:${monPort}`, '--fsid', fsid, monmap]);
    await run('ceph-mon', ['--mkfs', '-i', 'a', '-c', conf, '--monmap', monmap]);
    await daemon('ceph-mon', 'ceph-mon', ['-i', 'a']);
    await Promise.all([
      run('ceph-osd', ['--mkfs', '-i', '0', '-c', conf]),
      run('ceph', [
        '-c',
        conf,
        '--connect-timeout',
        String(Math.ceil(remainingMs() / 1000)),
        'osd',
        'create',
      ]),
    ]);
    alive();
    await daemon('ceph-osd', 'ceph-osd', ['-i', '0']);
    // radosgw-admin creates the gateway's pools and waits until the OSD serves them.
    await run('radosgw-admin', [
      '-c',
      conf,
      'user',
      'create',
      '--uid=testkit',
      '--display-name=testkit',
      `--access-key=${accessKeyId}`,
      `--secret=${secretAccessKey}`,
    ]);
    alive();
    await daemon('radosgw', 'radosgw', [
      '-n',
      'client.rgw',
      `--rgw-frontends=beast endpoint=127.0.0.1:${gatewayPort}`,
    ]);
    const gateway = `http://127.0.0.1:${gatewayPort}`;
    await until(
      async () => {
        alive();
        try {
          await fetch(`${gateway}/`, { signal: AbortSignal.timeout(1000) });
          return true;
        } catch {
          return false;
        }
      },
      deadline,
      'waiting for radosgw to listen',
    );

    const s3 = async (method: string, path: string, body = '', extra: Record<string, string> = {}) => {
      const url = `${gateway}${path}`;
      const headers = signedHeaders({
        method,
        url,
        headers: extra,
        body,
        region,
        service: 's3',
        credentials,
      });
      const res = await fetch(url, { method, headers, ...(body === '' ? {} : { body }) });
      const text = await res.text();
      if (!res.ok) throw new StartError(`${method} ${path} answered ${res.status}: ${text}`);
      return text;
    };

    await s3('PUT', `/${bucket}`);
    if (options.corsOrigins !== undefined && options.corsOrigins.length > 0) {
      const cors = corsConfiguration(options.corsOrigins);
      // S3 requires Content-MD5 on PutBucketCors.
      await s3('PUT', `/${bucket}?cors`, cors, {
        'content-md5': createHash('md5').update(cors).digest('base64'),
        'content-type': 'application/xml',
      });
    }

    // The notification's push endpoint: acknowledges each push at once and hands its records on in order.
    const receiver = createServer((req, res) => {
      void readBody(req).then((text) => {
        let pushed: S3EventRecord[];
        try {
          pushed = (JSON.parse(text) as { Records: S3EventRecord[] }).Records;
        } catch (err) {
          onError(err);
          res.writeHead(400).end();
          return;
        }
        res.writeHead(200).end();
        for (const record of pushed) {
          if (!record.eventName.startsWith('ObjectCreated:')) continue;
          delivery = delivery.then(async () => {
            records.push(record);
            for (const waiter of waiters) waiter(record);
            try {
              await options.onObjectCreated?.(record);
            } catch (err) {
              onError(err);
            }
          });
        }
      }, onError);
    });
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
    servers.push(receiver);
    const pushEndpoint = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/`;

    // The topic (the gateway's SNS-compatible API, a form POST to /) and the bucket's notification.
    const form = new URLSearchParams({
      Action: 'CreateTopic',
      Name: 'testkit-object-created',
      'Attributes.entry.1.key': 'push-endpoint',
      'Attributes.entry.1.value': pushEndpoint,
    }).toString();
    const topicHeaders = signedHeaders({
      method: 'POST',
      url: `${gateway}/`,
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: form,
      region,
      service: 'sns',
      credentials,
    });
    const topic = await fetch(`${gateway}/`, { method: 'POST', headers: topicHeaders, body: form });
    const topicText = await topic.text();
    const arn = /<TopicArn>([^<]+)<\/TopicArn>/.exec(topicText)?.[1];
    if (!topic.ok || arn === undefined)
      throw new StartError(`CreateTopic answered ${topic.status}: ${topicText}`);
    const filter =
      options.eventPrefix === undefined
        ? ''
        : `<Filter><S3Key><FilterRule><Name>prefix</Name><Value>${xmlEscape(options.eventPrefix)}</Value></FilterRule></S3Key></Filter>`;
    await s3(
      'PUT',
      `/${bucket}?notification`,
      '<NotificationConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><TopicConfiguration>' +
        `<Id>testkit</Id><Topic>${xmlEscape(arn)}</Topic><Event>s3:ObjectCreated:*</Event>${filter}` +
        '</TopicConfiguration></NotificationConfiguration>',
      { 'content-type': 'application/xml' },
    );

    const proxy = await startRequestLog(gatewayPort, requests, counter);
    servers.push(proxy);
    const endpoint = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
    const startupMs = Date.now() - started;

    return {
      kind: 'rgw',
      endpoint,
      region,
      bucket,
      accessKeyId,
      secretAccessKey,
      startupMs,
      pids: daemons.map((d) => d.child.pid ?? 0),
      objectCreated: records,
      requests,
      get inFlight() {
        return counter.inFlight;
      },
      waitForObjectCreated(key, timeoutMs = 5000) {
        // The gateway sends keys as stored, not URL-encoded.
        return waitForRecord(records, waiters, key, key, timeoutMs);
      },
      async stop() {
        await closeServers();
        await killAll();
        await delivery;
        watchdog.kill('SIGKILL');
        await rm(dir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    const logs = await Promise.all(
      ['mon.a', 'osd.0', 'client.rgw'].map(async (name) => {
        const text = await readFile(join(dir, `${name}.log`), 'utf8').catch(() => '');
        return text === '' ? '' : `\n--- ${name}.log (end) ---\n${text.slice(-2000)}`;
      }),
    );
    await closeServers();
    await killAll();
    watchdog.kill('SIGKILL');
    await rm(dir, { recursive: true, force: true });
    const reason = err instanceof Error ? err.message : String(err);
    throw new Error(`the RADOS Gateway did not start: ${reason}${logs.join('')}`, { cause: err });
  }
}
