// The three images start: each Dockerfile's runtime stage is staged from the Dockerfile itself
// (image-staging.ts says how) and its CMD runs with the image's environment against real parts: the
// operations image migrates a fresh embedded PostgreSQL and exits 0, the gateway answers /api/ready 200,
// the workflow answers /ready 200 with s3rver and the development issuer. A runtime import of a package
// the image does not ship fails here with ERR_MODULE_NOT_FOUND, as it would in the cluster.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { jest } from '@jest/globals';
import { gatewayMigrationsWith, GATEWAY_LOGIN_ROLE } from '@platform/device-gateway';
import { API_LOGIN, enterpriseMigrationsWith, urlForLogin } from '@platform/enterprise-db';
import { createDb, errorMessage, migrateToLatest } from '@platform/service-kit';
import { databaseUrl } from '@platform/service-kit';
import { freePort, startIssuer, startPostgres, startS3 } from '@platform/testkit';
import type { Issuer, PostgresServer, S3Server } from '@platform/testkit';
import pg from 'pg';
import { HOLD_HANGUPS_CMD } from '../src/validate/index.js';
import { stageImage } from './image-staging.js';
import type { StagedImage } from './image-staging.js';

// Staging runs one `npm ci --omit=dev` per image (20–40 s each on this 2-core VM, in parallel).
jest.setTimeout(300_000);

const dockerfiles = {
  ops: 'deploy/Dockerfile',
  gateway: 'services/device-gateway/Dockerfile',
  workflow: 'services/enterprise-workflow/Dockerfile',
} as const;

// What the cluster's secrets would hold (NODE_ENV=production refuses the development defaults).
const secrets = {
  AUTHENTICATOR_PASSWORD: 'image-test-authenticator',
  ENTERPRISE_API_PASSWORD: 'image-test-enterprise-api',
  DEVICE_GATEWAY_DB_PASSWORD: 'image-test-gateway',
};

interface Running {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

const children: Running[] = [];

/**
 * What runs `command` here: `node …` as the Node.js of this test run (process.execPath, the version the images
 * are built FROM), and `sh packages/service-kit/bin/hold-hangups.sh node …` (the services' CMD: the image's
 * shell holds SIGHUPs until node handles them) as this machine's `sh` running the image's copy of the script
 * with that Node.js. Anything else is refused rather than run with whatever this machine has.
 */
function programOf(image: StagedImage, command: string[]): { file: string; args: string[] } {
  const [program, ...args] = command;
  if (program === 'node') return { file: process.execPath, args };
  const wrapped = command.slice(HOLD_HANGUPS_CMD.length);
  if (HOLD_HANGUPS_CMD.every((word, i) => command[i] === word) && wrapped.length > 0)
    return { file: 'sh', args: [HOLD_HANGUPS_CMD[1], process.execPath, ...wrapped] };
  throw new Error(
    `${image.dockerfile}: CMD ${JSON.stringify(command)} starts neither with node nor with ${JSON.stringify(HOLD_HANGUPS_CMD)}`,
  );
}

/**
 * Runs the image's CMD (or `command`, as `docker run IMAGE command…` would) the way its ENTRYPOINT (tini)
 * would: only the image's ENV plus `env`.
 */
function runImage(image: StagedImage, env: Record<string, string>, command = image.command): Running {
  const { file, args } = programOf(image, command);
  const asImageUser = process.getuid?.() === 0 && image.user !== undefined ? image.user : {};
  const child = spawn(file, args, {
    cwd: image.dir,
    env: { PATH: '/usr/local/bin:/usr/bin:/bin', ...image.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    ...asImageUser,
  });
  let output = '';
  child.stdout?.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (output += c.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const running = { child, output: () => output, exited };
  children.push(running);
  return running;
}

/** Polls `url` until it answers 200; fails with the process's output when it exits or time runs out. */
async function expectReady(url: string, running: Running, image: StagedImage): Promise<void> {
  const deadline = Date.now() + 60_000;
  let last = 'no answer';
  while (Date.now() < deadline) {
    if (running.child.exitCode !== null) break;
    try {
      const res = await fetch(url);
      if (res.status === 200) return;
      last = `HTTP ${res.status}`;
    } catch (err) {
      last = errorMessage(err);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(
    `${image.dockerfile}: ${url} not ready (${last}, exit code ${String(running.child.exitCode)}):\n` +
      running.output().slice(-3000),
  );
}

async function createDatabase(server: PostgresServer, name: string): Promise<string> {
  const client = new pg.Client({ connectionString: server.url });
  await client.connect();
  try {
    await client.query(`CREATE DATABASE ${name}`);
  } finally {
    await client.end();
  }
  return databaseUrl(server.url, name);
}

describe('production images, staged from their Dockerfiles', () => {
  const images: Partial<Record<keyof typeof dockerfiles, StagedImage>> = {};
  let postgres: PostgresServer;
  let s3: S3Server;
  let issuer: Issuer;
  let servicesDbUrl: string;

  beforeAll(async () => {
    // A private cluster: the migrations create cluster-wide roles with this test's passwords, which must
    // not change the logins the other test files use on the shared one.
    postgres = await startPostgres();
    [s3, issuer] = await Promise.all([startS3(), startIssuer()]);
    // The services' database is migrated here (their images do not migrate); the operations image gets
    // a database of its own, empty, below.
    servicesDbUrl = await createDatabase(postgres, 'services');
    const db = createDb(servicesDbUrl, { max: 1 });
    try {
      await migrateToLatest(db, [
        enterpriseMigrationsWith({
          authenticator: secrets.AUTHENTICATOR_PASSWORD,
          enterpriseApi: secrets.ENTERPRISE_API_PASSWORD,
          explicit: true,
        }),
        gatewayMigrationsWith(secrets.DEVICE_GATEWAY_DB_PASSWORD),
      ]);
    } finally {
      await db.destroy();
    }
    const staged = await Promise.allSettled(
      Object.entries(dockerfiles).map(async ([key, path]) => {
        images[key as keyof typeof dockerfiles] = await stageImage(path);
      }),
    );
    const failed = staged.filter((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failed.length > 0) throw new Error(failed.map((f) => String(f.reason)).join('\n'));
  });

  afterAll(async () => {
    for (const running of children) {
      if (running.child.exitCode === null && running.child.signalCode === null) {
        running.child.kill('SIGKILL');
        await running.exited;
      }
    }
    for (const image of Object.values(images)) image.remove();
    await Promise.all([s3?.stop(), issuer?.stop()]);
    await postgres?.destroy();
  });

  it('stage every file the runtime stages copy, and only from stages they can be built from', () => {
    expect(images.ops?.copied).toEqual(expect.arrayContaining(['node_modules', 'deploy/dist']));
    expect(images.gateway?.copied).toEqual(expect.arrayContaining(['services/device-gateway/dist']));
    expect(images.workflow?.copied).toEqual(expect.arrayContaining(['services/enterprise-workflow/dist']));
    // The services run behind the SIGHUP-holding shell, whose script the image copies.
    for (const image of [images.gateway!, images.workflow!]) {
      expect(image.command.slice(0, HOLD_HANGUPS_CMD.length)).toEqual([...HOLD_HANGUPS_CMD]);
      expect(image.copied).toEqual(
        expect.arrayContaining([expect.stringMatching(/packages\/service-kit\/bin$/)]),
      );
    }
    for (const image of Object.values(images)) {
      // No dev-only workspace reaches a runtime image.
      expect(image.copied.filter((p) => p.includes('testkit'))).toEqual([]);
    }
  });

  it('are built FROM the Node.js release the tests run on (the root devDependency `node`)', () => {
    // The images and `npm test` must not drift apart: bump the root package.json's `node` and the three
    // ARG NODE_IMAGE lines together (the tag must exist on Docker Hub: node:<version>-bookworm-slim).
    for (const image of Object.values(images)) {
      expect(`${image.dockerfile}: ${image.baseImage}`).toBe(
        `${image.dockerfile}: node:${process.versions.node}-bookworm-slim`,
      );
    }
  });

  it('the operations image migrates a fresh database and exits 0', async () => {
    const image = images.ops!;
    const url = await createDatabase(postgres, 'ops');
    const running = runImage(image, { DATABASE_URL: url, LOG_LEVEL: 'warn', ...secrets });
    const code = await running.exited;
    if (code !== 0) throw new Error(`${image.dockerfile} CMD exited ${String(code)}:\n${running.output()}`);
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      const sets = await client.query<{ enterprise: string | null; gateway: string | null }>(
        `SELECT to_regclass('enterprise_migrations') AS enterprise,
                to_regclass('device_gateway_migrations') AS gateway`,
      );
      expect(sets.rows[0]).toEqual({
        enterprise: 'enterprise_migrations',
        gateway: 'device_gateway_migrations',
      });
    } finally {
      await client.end();
    }
    // The operator's key command (docs/operations.md, device keys) runs from the same image.
    const keys = runImage(image, { DATABASE_URL: url, ...secrets }, [
      'node',
      'services/device-gateway/dist/cli/device-key.js',
      'list',
    ]);
    const keysCode = await keys.exited;
    if (keysCode !== 0) throw new Error(`device-key list exited ${String(keysCode)}:\n${keys.output()}`);
  });

  it('the gateway image answers /api/ready 200, and stops on SIGTERM with exit code 0', async () => {
    const image = images.gateway!;
    const port = await freePort('tcp');
    const running = runImage(image, {
      DATABASE_URL: urlForLogin(servicesDbUrl, GATEWAY_LOGIN_ROLE, secrets.DEVICE_GATEWAY_DB_PASSWORD),
      GATEWAY_API_KEYS: 'image-test-api-key',
      // The image's 8080/5683 are a pod's own; here the test's free ports stand in for them.
      GATEWAY_HTTP_PORT: String(port),
      GATEWAY_COAP_PORT: String(await freePort('udp')),
      GATEWAY_COAPS_PORT: String(await freePort('udp')),
      GATEWAY_COAP_HOST: '127.0.0.1',
      LOG_LEVEL: 'warn',
    });
    await expectReady(`http://127.0.0.1:${port}/api/ready`, running, image);
    running.child.kill('SIGTERM');
    expect(await running.exited).toBe(0);
  });

  it('the workflow image answers /ready 200 with s3rver and the development issuer, and stops on SIGTERM', async () => {
    const image = images.workflow!;
    const port = await freePort('tcp');
    const running = runImage(image, {
      DATABASE_URL: urlForLogin(servicesDbUrl, API_LOGIN, secrets.ENTERPRISE_API_PASSWORD),
      PORT: String(port),
      HOST: '127.0.0.1',
      OIDC_ISSUER_URL: issuer.issuerUrl,
      S3_ENDPOINT: s3.endpoint,
      S3_REGION: s3.region,
      S3_BUCKET: s3.bucket,
      S3_ACCESS_KEY_ID: s3.accessKeyId,
      S3_SECRET_ACCESS_KEY: s3.secretAccessKey,
      S3_FORCE_PATH_STYLE: 'true',
      WEBHOOK_TOKENS: 'image-test-webhook-token',
      LOG_LEVEL: 'warn',
    });
    await expectReady(`http://127.0.0.1:${port}/ready`, running, image);
    // A token rotation's SIGHUP passes through the image's shell to the service, which reloads and serves on.
    running.child.kill('SIGHUP');
    await new Promise((r) => setTimeout(r, 500));
    await expectReady(`http://127.0.0.1:${port}/ready`, running, image);
    running.child.kill('SIGTERM');
    expect(await running.exited).toBe(0);
  });
});
