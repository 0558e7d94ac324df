// `npm run bench:workflow` (design §4.4): the built workflow service (its own process, as in
// production) on loopback against a private embedded PostgreSQL, s3rver and the development issuer.
// Measures upload intents/s and decisions/s at saturation, and p50/p99 latency at a fixed 500 req/s,
// with autocannon. Targets on a 2-core machine: >= 2,000 intents/s, >= 1,500 decisions/s,
// p99 <= 20 ms at 500 req/s. Then uploads in parts (design §4.4): requests for 100 part URLs at 50 req/s
// (target p99 <= 20 ms), and a 1 GiB file sent to s3rver on loopback in parallel parts through the
// service's plan, part URLs and completion, against one PUT of the same file in the same run (MB/s).
//
// Options: --duration <s> (default 10), --connections <n> (default 32), --pool <n> (DB_POOL_MAX,
// default 10), --log-level <level> (default info, the production default), --profile <dir> (V8 CPU
// profile of the service, written when it exits).
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import autocannon from 'autocannon';
import type { Result } from 'autocannon';
import { sql } from 'kysely';
import {
  API_LOGIN,
  demoSites,
  enterpriseMigrations,
  devRolePasswords,
  seedEnterprise,
  urlForLogin,
} from '@platform/enterprise-db';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { createS3Storage } from '@platform/enterprise-workflow';
import { freePort, startIssuer, startPostgres, startS3 } from '@platform/testkit';
import { cpuDuring, processCpuSeconds, treeCpuSeconds } from './lib/cpu-usage.js';
import { openLoop } from './lib/open-loop.js';
import { RawHttpClient } from './lib/raw-http-client.js';
import { percentile, waitReady } from './lib/wait.js';

const { values: args } = parseArgs({
  options: {
    duration: { type: 'string', default: '10' },
    connections: { type: 'string', default: '32' },
    pool: { type: 'string', default: '10' },
    'log-level': { type: 'string', default: 'info' },
    /** Write a V8 CPU profile of the service to this directory (node --cpu-prof). */
    profile: { type: 'string' },
  },
});
const DURATION_S = Number(args.duration);
const CONNECTIONS = Number(args.connections);
/** Proposed work items created for the decision runs, spread over alice's three sites. */
const ITEMS_PER_SITE = 5000;
const FIXED_RATE = 500;

const targets = { intentsPerS: 2000, decisionsPerS: 1500, p99Ms: 20, partUrlsP99Ms: 20 };
/** Requests per second for the part-URL run, each asking for PART_URLS URLs. */
const PART_URL_RATE = 50;
const PART_URLS = 100;
const MiB = 1024 * 1024;
/** The large upload: 1 GiB in the service's default 16 MiB parts, four parts in flight. */
const BIG_FILE_BYTES = 1024 * MiB;
const PART_BYTES = 16 * MiB;
const PARALLEL_PARTS = 4;

function log(message: string): void {
  process.stdout.write(`${message}\n`);
}

interface Line {
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  total: number;
}

function report(name: string, line: Line, cpuS?: Record<string, number>): Line {
  const ms = (v: number): string => (v < 10 ? v.toFixed(1) : String(Math.round(v))).padStart(4);
  log(
    `  ${name.padEnd(34)} ${String(line.rps).padStart(6)} req/s   p50 ${ms(line.p50)} ms   ` +
      `p99 ${ms(line.p99)} ms   non-2xx/errors ${line.errors} of ${line.total}`,
  );
  if (cpuS !== undefined && line.total > 0) {
    // CPU per request in each process: which one a request's cost is spent in.
    const perRequest = Object.entries(cpuS)
      .map(([process, s]) => `${process} ${Math.round((s * 1e6) / line.total)}`)
      .join(', ');
    log(`  ${''.padEnd(34)} CPU µs per request: ${perRequest}`);
  }
  return line;
}

const fromAutocannon = (r: Result): Line => ({
  rps: Math.round(r.requests.average),
  p50: r.latency.p50,
  p99: r.latency.p99,
  errors: r.non2xx + r.errors + r.timeouts,
  total: r.requests.total,
});

/**
 * Requests at evenly spaced times (the timer-paced open loop bench:gateway uses), each latency taken
 * from its own send time. Not autocannon's `overallRate`: that is a per-connection quota per second, so
 * every second starts with a burst at saturation and then idles, and its coordinated-omission correction
 * takes `1 / rate` as the expected interval in ms (1 ms here), adding made-up samples to every response
 * slower than that. Its "p99 at 500 req/s" was 27-35 ms where evenly spaced requests see a fraction.
 */
async function atFixedRate(
  port: number,
  authorization: string,
  rate: number,
  durationS: number,
  next: () => { path: string; body: string },
): Promise<Line> {
  const client = new RawHttpClient(port, 64, { authorization });
  const latencies: number[] = [];
  let errors = 0;
  const started = performance.now();
  try {
    await openLoop(rate, rate * durationS, async () => {
      const { path, body } = next();
      const t0 = performance.now();
      const status = await client.post(path, body);
      latencies.push(performance.now() - t0);
      if (status < 200 || status > 299) errors++;
    });
  } finally {
    client.close();
  }
  const elapsedS = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  return {
    rps: Math.round(latencies.length / elapsedS),
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
    errors,
    total: latencies.length,
  };
}

/** Writes `bytes` of random data to `path` (a 16 MiB random block repeated: the store hashes all of it). */
async function writeBigFile(path: string, bytes: number): Promise<void> {
  const block = randomBytes(16 * MiB);
  const out = createWriteStream(path);
  for (let left = bytes; left > 0; left -= block.length) {
    if (!out.write(left >= block.length ? block : block.subarray(0, left)))
      await new Promise<void>((resolve) => out.once('drain', () => resolve()));
  }
  await new Promise<void>((resolve, reject) =>
    out.end((err?: Error | null) => (err ? reject(err) : resolve())),
  );
}

/** PUTs bytes [start, start + length) of `path` to a presigned URL, streamed; resolves with the ETag. */
function putRange(
  url: string,
  headers: Record<string, string>,
  path: string,
  start: number,
  length: number,
): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      { method: 'PUT', headers: { ...headers, 'content-length': String(length) } },
      (res) => {
        res.resume();
        res.on('end', () => {
          if (res.statusCode === 200) resolve(String(res.headers.etag ?? ''));
          else reject(new Error(`PUT answered ${res.statusCode}`));
        });
      },
    );
    req.on('error', reject);
    createReadStream(path, { start, end: start + length - 1 }).pipe(req);
  });
}

async function callJson<T>(
  base: string,
  authorization: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<T> {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: { authorization, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  if (!res.ok) throw new Error(`${method} ${path} answered ${res.status}: ${await res.text()}`);
  return (await res.json()) as T;
}

interface PartUrl {
  part_number: number;
  url: string;
  headers: Record<string, string>;
  size_bytes: number;
}

/**
 * The large upload both ways, as a client on this machine would: one presigned PUT of the whole file, and
 * the service's plan (intent, part URLs, PARALLEL_PARTS parts in flight, completion). MB/s = 10^6 bytes/s.
 */
async function largeUpload(
  base: string,
  authorization: string,
  siteId: string,
  storage: {
    presignSingle(key: string, size: number): Promise<{ url: string; headers: Record<string, string> }>;
  },
): Promise<{ singleMBs: number; multipartMBs: number; partsOnlyMBs: number }> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-workflow-'));
  try {
    const path = join(dir, 'walkthrough.mp4');
    await writeBigFile(path, BIG_FILE_BYTES);
    const mb = BIG_FILE_BYTES / 1e6;

    const single = await storage.presignSingle(`bench/single-${Date.now()}.mp4`, BIG_FILE_BYTES);
    let t0 = performance.now();
    await putRange(single.url, single.headers, path, 0, BIG_FILE_BYTES);
    const singleS = (performance.now() - t0) / 1000;

    const intent = await callJson<{
      media_id: string;
      multipart: { part_count: number; part_size_bytes: number };
    }>(base, authorization, 'POST', `/sites/${siteId}/media/upload-intents`, {
      filename: 'walkthrough.mp4',
      content_type: 'video/mp4',
      size_bytes: BIG_FILE_BYTES,
    });
    const media = `/sites/${siteId}/media/${intent.media_id}/multipart`;
    const numbers = Array.from({ length: intent.multipart.part_count }, (_, i) => i + 1);
    t0 = performance.now();
    const urls: PartUrl[] = [];
    for (let i = 0; i < numbers.length; i += PART_URLS) {
      const batch = numbers.slice(i, i + PART_URLS).map((n) => ({ part_number: n }));
      urls.push(
        ...(
          await callJson<{ parts: PartUrl[] }>(base, authorization, 'POST', `${media}/part-urls`, {
            parts: batch,
          })
        ).parts,
      );
    }
    const etags = new Map<number, string>();
    let next = 0;
    await Promise.all(
      Array.from({ length: PARALLEL_PARTS }, async () => {
        for (;;) {
          const part = urls[next++];
          if (part === undefined) return;
          const start = (part.part_number - 1) * intent.multipart.part_size_bytes;
          etags.set(part.part_number, await putRange(part.url, part.headers, path, start, part.size_bytes));
        }
      }),
    );
    const partsS = (performance.now() - t0) / 1000;
    await callJson(base, authorization, 'POST', `${media}/complete`, {
      parts: numbers.map((n) => ({ part_number: n, etag: etags.get(n) ?? '' })),
    });
    const multipartS = (performance.now() - t0) / 1000;
    return { singleMBs: mb / singleS, multipartMBs: mb / multipartS, partsOnlyMBs: mb / partsS };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  log(`bench:workflow on ${cpus().length} cores, ${DURATION_S} s per run, ${CONNECTIONS} connections`);
  const [pg, issuer, s3] = await Promise.all([startPostgres(), startIssuer(), startS3()]);
  let service: ChildProcess | undefined;
  try {
    const admin = createDb<unknown>(pg.url, { max: 2 });
    await migrateToLatest(admin, [enterpriseMigrations]);
    await seedEnterprise(admin);
    const siteIds = [demoSites.acmeHq.id, demoSites.acmeWarehouse.id, demoSites.acmeLab.id];
    const { rows } = await sql<{ id: string; site_id: string }>`
      INSERT INTO enterprise.work_items (site_id, company_id, title, severity)
      SELECT s.id, s.company_id, 'Benchmark item ' || g, 'medium'
      FROM enterprise.sites s CROSS JOIN generate_series(1, ${ITEMS_PER_SITE}) g
      WHERE s.id = ANY (${siteIds}::uuid[])
      RETURNING id, site_id`.execute(admin);
    await sql`ANALYZE`.execute(admin);
    await admin.destroy();
    log(`  prepared ${rows.length} proposed work items for alice (3 sites)`);

    const port = await freePort('tcp');
    const base = `http://127.0.0.1:${port}`;
    service = spawn(
      process.execPath,
      [
        ...(args.profile === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${args.profile}`]),
        fileURLToPath(new URL('../../services/enterprise-workflow/dist/main.js', import.meta.url)),
      ],
      {
        env: {
          PATH: process.env.PATH ?? '',
          NODE_ENV: 'production',
          PORT: String(port),
          HOST: '127.0.0.1',
          LOG_LEVEL: args['log-level'],
          DB_POOL_MAX: args.pool,
          DATABASE_URL: urlForLogin(pg.url, API_LOGIN, devRolePasswords.enterpriseApi),
          OIDC_ISSUER_URL: issuer.issuerUrl,
          S3_ENDPOINT: s3.endpoint,
          S3_BUCKET: s3.bucket,
          S3_ACCESS_KEY_ID: s3.accessKeyId,
          S3_SECRET_ACCESS_KEY: s3.secretAccessKey,
          S3_FORCE_PATH_STYLE: 'true',
          // s3rver assembles a completed upload by reading and hashing the whole file before it answers.
          S3_REQUEST_TIMEOUT_MS: '120000',
          WEBHOOK_TOKENS: 'bench-webhook-token',
        },
        // The service's JSON log lines go to /dev/null: written (as in production), not kept.
        stdio: ['ignore', 'ignore', 'inherit'],
      },
    );
    await waitReady(`${base}/ready`, { timeoutMs: 20_000 });

    const token = await issuer.demoToken('alice', {}, { expiresInS: 3600 });
    const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
    const intentBody = JSON.stringify({
      filename: 'inspection photo.jpg',
      content_type: 'image/jpeg',
      size_bytes: 2_500_000,
    });
    let intentN = 0;
    const intentRequest = {
      method: 'POST' as const,
      headers,
      setupRequest: (req: autocannon.Request) => ({
        ...req,
        path: `/sites/${siteIds[intentN++ % siteIds.length]}/media/upload-intents`,
        body: intentBody,
      }),
    };
    // Each request defers the next item in turn: every one is a real transition (deferred items may
    // be decided again) with its audit row, and concurrent requests rarely wait on the same row lock.
    const deferUntil = new Date(Date.now() + 30 * 86400_000).toISOString();
    const decisionBody = JSON.stringify({
      decision: 'defer',
      defer_until: deferUntil,
      note: 'next budget cycle',
    });
    let decisionN = 0;
    const decisionRequest = {
      method: 'POST' as const,
      headers,
      setupRequest: (req: autocannon.Request) => {
        const item = rows[decisionN++ % rows.length]!;
        return { ...req, path: `/sites/${item.site_id}/work-items/${item.id}/decision`, body: decisionBody };
      },
    };

    const servicePid = service.pid ?? 0;
    const pgPid = pg.pid ?? 0;
    const cpuReaders = {
      service: () => processCpuSeconds(servicePid),
      postgres: () => treeCpuSeconds(pgPid),
      'load generator': () => processCpuSeconds(process.pid),
    };
    const measured = async (name: string, load: () => Promise<Result>) => {
      const { result, cpuS } = await cpuDuring(cpuReaders, load);
      return report(name, fromAutocannon(result), cpuS);
    };
    const measuredAtFixedRate = async (name: string, next: () => { path: string; body: string }) => {
      const { result, cpuS } = await cpuDuring(cpuReaders, () =>
        atFixedRate(port, headers.authorization, FIXED_RATE, DURATION_S, next),
      );
      return report(name, result, cpuS);
    };
    const run = (requests: object[]) => () =>
      autocannon({ url: base, connections: CONNECTIONS, duration: DURATION_S, requests: requests });

    // Warm-up: JIT, pool connections, plan caches.
    await autocannon({
      url: base,
      connections: 8,
      duration: 3,
      requests: [intentRequest] as autocannon.Request[],
    });
    await autocannon({
      url: base,
      connections: 8,
      duration: 2,
      requests: [decisionRequest] as autocannon.Request[],
    });

    log('\nsaturation');
    // The ceiling of this machine for the HTTP stack alone (express, request id, per-request log
    // line, no auth, no database): what the endpoints below are measured against.
    await measured('GET /health (HTTP-only ceiling)', () =>
      autocannon({ url: `${base}/health`, connections: CONNECTIONS, duration: DURATION_S }),
    );
    const intents = await measured('upload intents', run([intentRequest]));
    const decisions = await measured('decisions (defer, audited)', run([decisionRequest]));
    log(`\nfixed rate ${FIXED_RATE} req/s, evenly spaced (open loop, 64 keep-alive connections)`);
    const intentsFixed = await measuredAtFixedRate('upload intents', () => ({
      path: `/sites/${siteIds[intentN++ % siteIds.length]}/media/upload-intents`,
      body: intentBody,
    }));
    const decisionsFixed = await measuredAtFixedRate('decisions', () => {
      const item = rows[decisionN++ % rows.length]!;
      return { path: `/sites/${item.site_id}/work-items/${item.id}/decision`, body: decisionBody };
    });

    log(`\nuploads in parts`);
    // A 2 GiB video: 128 parts of 16 MiB, so every request can ask for PART_URLS of them.
    const plan = await callJson<{ media_id: string }>(
      base,
      headers.authorization,
      'POST',
      `/sites/${siteIds[0]}/media/upload-intents`,
      {
        filename: 'long walkthrough.mp4',
        content_type: 'video/mp4',
        size_bytes: 2048 * MiB,
      },
    );
    const partUrlsBody = JSON.stringify({
      parts: Array.from({ length: PART_URLS }, (_, i) => ({ part_number: i + 1 })),
    });
    const partUrlsPath = `/sites/${siteIds[0]}/media/${plan.media_id}/multipart/part-urls`;
    const { result: partUrlsFixed, cpuS: partUrlsCpu } = await cpuDuring(cpuReaders, () =>
      atFixedRate(port, headers.authorization, PART_URL_RATE, DURATION_S, () => ({
        path: partUrlsPath,
        body: partUrlsBody,
      })),
    );
    report(`${PART_URLS} part URLs per request, ${PART_URL_RATE} req/s`, partUrlsFixed, partUrlsCpu);
    log(`  ${''.padEnd(34)} ${partUrlsFixed.rps * PART_URLS} part URLs/s`);

    const signer = createS3Storage({
      endpoint: s3.endpoint,
      publicEndpoint: undefined,
      region: s3.region,
      bucket: s3.bucket,
      accessKeyId: s3.accessKeyId,
      secretAccessKey: s3.secretAccessKey,
      forcePathStyle: true,
    });
    const big = await largeUpload(base, headers.authorization, siteIds[0]!, {
      presignSingle: (key, size) =>
        signer.presignUpload({ key, contentType: 'video/mp4', sizeBytes: size, expiresInS: 3600 }),
    });
    signer.destroy();
    log(`  1 GiB, one PUT to s3rver               ${big.singleMBs.toFixed(0).padStart(5)} MB/s`);
    log(
      `  1 GiB in ${BIG_FILE_BYTES / PART_BYTES} parts, ${PARALLEL_PARTS} in flight     ${big.multipartMBs.toFixed(0).padStart(5)} MB/s ` +
        `(parts alone ${big.partsOnlyMBs.toFixed(0)} MB/s; the rest is s3rver assembling the file)`,
    );

    const audit = createDb<unknown>(pg.url, { max: 1 });
    const { rows: counts } = await sql<{ decisions: string; media: string }>`
      SELECT (SELECT count(*) FROM enterprise.work_item_decisions) AS decisions,
             (SELECT count(*) FROM enterprise.media_items) AS media`.execute(audit);
    await audit.destroy();
    log(`\n  rows written: ${counts[0]?.media} media items, ${counts[0]?.decisions} decision audit rows`);

    const verdict = (ok: boolean) => (ok ? 'met' : 'MISSED');
    log('\ntargets');
    log(
      `  intents/s   >= ${targets.intentsPerS}: ${intents.rps} (${verdict(intents.rps >= targets.intentsPerS)})`,
    );
    log(
      `  decisions/s >= ${targets.decisionsPerS}: ${decisions.rps} (${verdict(decisions.rps >= targets.decisionsPerS)})`,
    );
    const p99 = Math.max(intentsFixed.p99, decisionsFixed.p99);
    log(
      `  p99 at ${FIXED_RATE} req/s <= ${targets.p99Ms} ms: ${p99.toFixed(1)} ms (${verdict(p99 <= targets.p99Ms)})`,
    );
    log(
      `  part URLs p99 at ${PART_URL_RATE} req/s <= ${targets.partUrlsP99Ms} ms: ${partUrlsFixed.p99.toFixed(1)} ms ` +
        `(${verdict(partUrlsFixed.p99 <= targets.partUrlsP99Ms)})`,
    );
  } finally {
    if (service !== undefined && service.exitCode === null) {
      const exited = new Promise((resolve) => service?.once('exit', resolve));
      service.kill('SIGTERM');
      await exited;
    }
    await Promise.all([issuer.stop(), s3.stop()]);
    await pg.destroy();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(
    `bench:workflow failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
  );
  process.exit(1);
});
