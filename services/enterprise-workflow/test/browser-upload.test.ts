// A real uploader in a real browser (design §4.4): Debian's chromium, headless, driven by playwright-core,
// opens a page on the portal origin that uses Uppy's @uppy/aws-s3 against the workflow service (the page
// forwards /api/ to it) and uploads straight to the store (each test store, s3rver and Ceph's RADOS Gateway,
// with the CORS rule for that origin):
// (a) a small photo with one presigned PUT; (b) a 150 MiB video in parts, interrupted by a page reload
// midway and resumed from the parts the store already holds. Each download serves the source's bytes.
//
// The page's script is bundled by esbuild when the test starts: @uppy/core and @uppy/aws-s3 publish ESM
// with bare imports of their dependencies, which a browser cannot resolve without a bundler or a
// hand-written import map of a dozen packages.
import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, request as httpRequest } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { demoSites } from '@platform/enterprise-db';
import { freePort, OBJECT_STORE_KINDS } from '@platform/testkit';
import { build } from 'esbuild';
import { sql } from 'kysely';
import { chromium } from 'playwright-core';
import type { Browser, Page } from 'playwright-core';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

/** What test/browser/uploader-page.ts puts on the page's window. */
interface UploaderPage {
  uploadSelected(): Promise<{ mediaId: string; multipart: boolean }>;
  resumeSelected(): Promise<{ mediaId: string; multipart: boolean }>;
}

const MiB = 1024 * 1024;
const VIDEO_BYTES = 150 * MiB;
const PART_BYTES = 16 * MiB;
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

let h: Harness;
let api: Server;
let portal: Server;
let origin: string;
let browser: Browser;
let dir: string;
let photoPath: string;
let videoPath: string;
let photoSha: string;
let videoSha: string;
let token: string;
const hq = demoSites.acmeHq.id;

/** Writes `bytes` pseudo-random bytes to `path` and returns their SHA-256 (hex). */
async function writeRandomFile(path: string, bytes: number): Promise<string> {
  const hash = createHash('sha256');
  const out = createWriteStream(path);
  for (let left = bytes; left > 0; left -= 8 * MiB) {
    const chunk = randomBytes(Math.min(8 * MiB, left));
    hash.update(chunk);
    if (!out.write(chunk)) await new Promise<void>((resolve) => out.once('drain', () => resolve()));
  }
  await new Promise<void>((resolve, reject) =>
    out.end((err?: Error | null) => (err ? reject(err) : resolve())),
  );
  return hash.digest('hex');
}

const PAGE = `<!doctype html><meta charset="utf-8"><title>upload</title>
<input type="file" id="file"><script src="/uploader.js"></script>`;

let script: Uint8Array;

// Once for both stores: the files, the page's script and the browser.
beforeAll(async () => {
  const bundle = await build({
    entryPoints: [fileURLToPath(new URL('./browser/uploader-page.ts', import.meta.url))],
    bundle: true,
    format: 'iife',
    platform: 'browser',
    target: 'chrome120',
    write: false,
    logLevel: 'silent',
  });
  script = bundle.outputFiles[0]!.contents;
  dir = await mkdtemp(join(tmpdir(), 'browser-upload-'));
  photoPath = join(dir, 'roof leak.jpg');
  videoPath = join(dir, 'walkthrough.mp4');
  [photoSha, videoSha] = await Promise.all([
    writeRandomFile(photoPath, 300 * 1024),
    writeRandomFile(videoPath, VIDEO_BYTES),
  ]);
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}, 60_000);

afterAll(async () => {
  await browser?.close();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe.each(OBJECT_STORE_KINDS)('uploads from a browser to %s', (store) => {
  beforeAll(async () => {
    const portalPort = await freePort('tcp');
    origin = `http://127.0.0.1:${portalPort}`;
    h = await startHarness({
      store,
      forwardEvents: true,
      corsOrigins: [origin],
      multipart: { thresholdBytes: 64 * MiB, partSizeBytes: PART_BYTES, uploadTtlS: 3600 },
    });
    api = createServer(h.app);
    await new Promise<void>((resolve) => api.listen(0, '127.0.0.1', resolve));
    const apiPort = (api.address() as AddressInfo).port;
    h.setEventTarget(`http://127.0.0.1:${apiPort}/internal/media/object-created`);

    // The portal origin: the page, its script, and /api/ forwarded to the workflow service.
    portal = createServer((req, res) => {
      if (req.url?.startsWith('/api/')) {
        const upstream = httpRequest(
          {
            host: '127.0.0.1',
            port: apiPort,
            method: req.method,
            path: req.url.slice('/api'.length),
            headers: req.headers,
          },
          (answer) => {
            res.writeHead(answer.statusCode ?? 502, answer.headers);
            answer.pipe(res);
          },
        );
        req.pipe(upstream);
        return;
      }
      if (req.url === '/uploader.js') {
        res.writeHead(200, { 'Content-Type': 'text/javascript' }).end(script);
        return;
      }
      res.writeHead(200, { 'Content-Type': 'text/html' }).end(PAGE);
    });
    await new Promise<void>((resolve) => portal.listen(portalPort, '127.0.0.1', resolve));
    token = await h.issuer.demoToken('alice');
  }, 60_000);

  afterAll(async () => {
    portal?.closeAllConnections();
    api?.closeAllConnections();
    await Promise.all([
      new Promise((resolve) => portal?.close(resolve)),
      new Promise((resolve) => api?.close(resolve)),
    ]);
    await h?.close();
  });

  async function openPage(): Promise<Page> {
    const page = await browser.newPage();
    await page.goto(`${origin}/?site=${hq}&token=${encodeURIComponent(token)}`);
    return page;
  }

  /** Polls the download resource until the item is available; returns the SHA-256 of what its URL serves. */
  async function downloadedSha(mediaId: string): Promise<{ sha: string; size: number }> {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const res = await fetch(`${origin}/api/sites/${hq}/media/${mediaId}/download`, {
        headers: { Authorization: `Bearer ${token}` },
      });
      if (res.status === 200) {
        const { url } = (await res.json()) as { url: string };
        const bytes = Buffer.from(await (await fetch(url)).arrayBuffer());
        return { sha: createHash('sha256').update(bytes).digest('hex'), size: bytes.length };
      }
      expect(res.status).toBe(409);
      if (Date.now() > deadline) throw new Error('the upload never became available');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  it('a photo goes up with one presigned PUT from the browser', async () => {
    const page = await openPage();
    try {
      await page.setInputFiles('#file', photoPath);
      const before = h.s3.requests.length;
      const outcome = await page.evaluate(() => (globalThis as unknown as UploaderPage).uploadSelected());
      expect(outcome.multipart).toBe(false);
      // The browser's PUTs, not the service's own acceptance copy to `accepted/…` (a CopyObject is a PUT too, and
      // the object-created event may already have been handled when the page reports success).
      const puts = h.s3.requests
        .slice(before)
        .filter((r) => r.method === 'PUT' && !r.key.startsWith('accepted/'));
      expect(puts.map((r) => ({ part: r.partNumber, status: r.status }))).toEqual([
        { part: undefined, status: 200 },
      ]);
      // The browser's preflight found the CORS rule for the portal origin.
      expect(h.s3.requests.slice(before).some((r) => r.method === 'OPTIONS' && r.status === 200)).toBe(true);
      expect(await downloadedSha(outcome.mediaId)).toEqual({ sha: photoSha, size: 300 * 1024 });
    } finally {
      await page.close();
    }
  });

  it('a 150 MiB video goes up in parts, survives a page reload midway and resends no stored part', async () => {
    const partCount = Math.ceil(VIDEO_BYTES / PART_BYTES);
    const page = await openPage();
    try {
      await page.setInputFiles('#file', videoPath);
      const start = h.s3.requests.length;
      const storedParts = () =>
        h.s3.requests
          .slice(start)
          .filter((r) => r.method === 'PUT' && r.partNumber !== undefined && r.status === 200);
      // Started, not awaited: the reload below ends it.
      void page
        .evaluate(() => (globalThis as unknown as UploaderPage).uploadSelected())
        .catch(() => undefined);
      const deadline = Date.now() + 60_000;
      while (storedParts().length < 4) {
        if (Date.now() > deadline) throw new Error('parts never arrived');
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      await page.reload();
      // A part the old page had in flight can still land in the store after the reload: wait until the store
      // has answered every request it received and been quiet for half a second, so such a part counts as held,
      // not as one the resumed page left out or sent twice (seen under load: part 4 in both lists; and, with the
      // RADOS Gateway slower to answer than the half second, part 4 stored after the list below was read).
      for (let seen = -1; seen !== h.s3.requests.length || h.s3.inFlight > 0;) {
        seen = h.s3.requests.length;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      const firstRun = storedParts().length;
      expect(firstRun).toBeLessThan(partCount);

      // What the store holds when the new page resumes.
      const { rows } = await sql<{ id: string; object_key: string; multipart_upload_id: string }>`
      SELECT id, object_key, multipart_upload_id FROM enterprise.media_items
      WHERE filename = 'walkthrough.mp4' AND status = 'pending_upload'`.execute(h.admin);
      expect(rows).toHaveLength(1);
      const item = rows[0]!;
      const held = await h.storage.listParts({ key: item.object_key, uploadId: item.multipart_upload_id });
      const heldNumbers = (held ?? []).map((p) => p.partNumber);
      expect(heldNumbers.length).toBeGreaterThanOrEqual(4);

      await page.setInputFiles('#file', videoPath);
      const resumeFrom = h.s3.requests.length;
      const outcome = await page.evaluate(() => (globalThis as unknown as UploaderPage).resumeSelected());
      expect(outcome.mediaId).toBe(item.id);
      const resumedPuts = h.s3.requests
        .slice(resumeFrom)
        .filter((r) => r.method === 'PUT' && r.partNumber !== undefined);
      const resent = resumedPuts.filter((r) => heldNumbers.includes(r.partNumber!));
      // Every part the store held is skipped; exactly the others are sent, each once.
      expect(resent).toEqual([]);
      expect(resumedPuts.map((r) => r.partNumber).sort((a, b) => a! - b!)).toEqual(
        Array.from({ length: partCount }, (_, i) => i + 1).filter((n) => !heldNumbers.includes(n)),
      );
      expect(resumedPuts.every((r) => r.status === 200)).toBe(true);
      process.stdout.write(
        `browser multipart upload: ${partCount} parts; ${heldNumbers.length} stored before the reload, ` +
          `${resumedPuts.length} PUT after it, ${resent.length} re-sent\n`,
      );

      expect(await downloadedSha(item.id)).toEqual({ sha: videoSha, size: VIDEO_BYTES });
      // Accepted through the store's completion event (the store reports it after answering the completion).
      expect(h.s3.objectCreated.some((r) => r.eventName === 'ObjectCreated:CompleteMultipartUpload')).toBe(
        true,
      );
    } finally {
      await page.close();
    }
  }, 90_000);
});
