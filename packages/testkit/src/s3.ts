import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './ports.js';
import { isPresigned, verifyPresigned } from './sigv4.js';

/**
 * An S3 event notification record, as AWS sends it (s3rver's shape plus MinIO's `contentType`; the RADOS
 * Gateway's records carry more fields, `eventSource: 'ceph:s3'`, and the key as stored).
 */
export interface S3EventRecord {
  eventVersion: string;
  eventSource: string;
  awsRegion: string;
  eventTime: string;
  /** `ObjectCreated:Put`, `ObjectCreated:Post`, `ObjectCreated:Copy` or `ObjectCreated:CompleteMultipartUpload`. */
  eventName: string;
  userIdentity: { principalId: string };
  requestParameters: { sourceIPAddress: string };
  responseElements: Record<string, string>;
  s3: {
    s3SchemaVersion: string;
    configurationId: string;
    bucket: { name: string; ownerIdentity: { principalId: string }; arn: string };
    object: {
      /**
       * From s3rver: URL-encoded like AWS (form encoding: space as `+`, `/` kept; see `encodeEventKey`). From
       * the RADOS Gateway: as stored, not encoded.
       */
      key: string;
      /** Bytes. */
      size?: number;
      /** MD5 hex, without quotes (absent on s3rver's Copy events). */
      eTag?: string;
      /** The stored Content-Type (MinIO sends it; AWS does not). */
      contentType?: string;
      sequencer: string;
    };
  };
}

export interface StartS3Options {
  /** Bucket created at start. Default `media`. */
  bucket?: string;
  /** TCP port on 127.0.0.1. Default: a free port. */
  port?: number;
  /** Object store directory, kept (for `npm start`). Default: a temporary directory removed by `stop()`. */
  directory?: string;
  /**
   * Called once per ObjectCreated record (Put, Post, Copy), after the object is stored. A rejection
   * is passed to `onError`, never thrown into s3rver.
   */
  onObjectCreated?: (record: S3EventRecord) => void | Promise<void>;
  /** Report only keys that start with this, as a MinIO event rule with `--prefix` does. Default: every key. */
  eventPrefix?: string;
  /** Default: `console.error`. */
  onError?: (err: unknown) => void;
  /**
   * Browser origins allowed by the bucket's CORS rule (PUT, GET, HEAD; any request header; `ETag`
   * exposed, which a browser uploading parts must read). Default: none, no CORS rule.
   */
  corsOrigins?: readonly string[];
  /**
   * Check presigned (query-string) requests as S3 does, which s3rver itself does not: a signature that does
   * not verify for the headers sent (Content-Type, Content-Length when signed) is 403
   * `SignatureDoesNotMatch`, an expired URL 403 `AccessDenied`. Requests signed in the Authorization header
   * still pass unchecked. Default false.
   */
  verifyPresignedUrls?: boolean;
}

/** One request s3rver received, as tests count them (e.g. the part PUTs of a resumed upload). */
export interface S3Request {
  method: string;
  /** The decoded object key (empty for bucket requests). */
  key: string;
  /** The multipart upload part number of an UploadPart request. */
  partNumber: number | undefined;
  uploadId: string | undefined;
  /** The HTTP status answered. */
  status: number;
}

/** A local S3 store for tests: s3rver (`startS3`) or the RADOS Gateway (`startRgw`, rgw.ts). */
export interface TestObjectStore {
  readonly kind: 's3rver' | 'rgw';
  /** e.g. `http://127.0.0.1:41234`; clients need `forcePathStyle: true`. */
  endpoint: string;
  region: string;
  bucket: string;
  accessKeyId: string;
  secretAccessKey: string;
  /** Every ObjectCreated record so far, oldest first. */
  readonly objectCreated: readonly S3EventRecord[];
  /** Every request answered so far (CORS preflights included), oldest first. */
  readonly requests: readonly S3Request[];
  /**
   * Requests received and not answered yet: 0 once every upload that reached the store (say, one a reloaded
   * page had under way) has been stored or dropped, so its state can be read.
   */
  readonly inFlight: number;
  /** Resolves with the first ObjectCreated record for `key` (decoded), waiting up to `timeoutMs`. */
  waitForObjectCreated(key: string, timeoutMs?: number): Promise<S3EventRecord>;
  stop(): Promise<void>;
}

/**
 * s3rver. Its credentials are built in; it verifies no SigV4 signature unless asked to check presigned URLs
 * (`verifyPresignedUrls`).
 */
export interface S3Server extends TestObjectStore {
  readonly kind: 's3rver';
}

/** s3rver's API as used here (it ships no type declarations). */
interface S3rverInstance {
  run(): Promise<{ port: number }>;
  close(): Promise<void>;
  httpServer?: Server;
  store: {
    getMetadata(bucket: string, key: string): Promise<Record<string, unknown>>;
    getResourcePath(bucket: string, key: string | undefined, resource: string): string;
  };
  middleware: KoaMiddleware[];
  on(event: 'event', listener: (event: { Records: S3EventRecord[] }) => void): unknown;
  on(event: 'error', listener: (err: unknown) => void): unknown;
}
type S3rverConstructor = new (options: Record<string, unknown>) => S3rverInstance;

/** The part of Koa's context the added middleware reads and writes. */
interface KoaContext {
  method: string;
  path: string;
  query: Record<string, string | string[] | undefined>;
  status: number;
  body: unknown;
  req: IncomingMessage;
  res: ServerResponse;
  set(name: string, value: string): void;
}
type KoaMiddleware = (ctx: KoaContext, next: () => Promise<void>) => Promise<void>;

function xmlEscape(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function s3Error(ctx: KoaContext, status: number, code: string, message: string): void {
  ctx.status = status;
  ctx.set('Content-Type', 'application/xml');
  ctx.body = `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${xmlEscape(message)}</Message></Error>`;
}

/** A CORS rule as S3 and MinIO take it; the ETag header must be exposed for multipart uploads. */
export function corsConfiguration(origins: readonly string[]): string {
  const rule = [
    ...origins.map((origin) => `<AllowedOrigin>${xmlEscape(origin)}</AllowedOrigin>`),
    '<AllowedMethod>PUT</AllowedMethod><AllowedMethod>GET</AllowedMethod><AllowedMethod>HEAD</AllowedMethod>',
    '<AllowedHeader>*</AllowedHeader><ExposeHeader>ETag</ExposeHeader><MaxAgeSeconds>600</MaxAgeSeconds>',
  ].join('');
  return `<CORSConfiguration><CORSRule>${rule}</CORSRule></CORSConfiguration>`;
}

/**
 * What s3rver 3.7 lacks of the multipart API, added in front of it: ListParts and AbortMultipartUpload,
 * NoSuchUpload for parts and completions of an upload that is gone (s3rver would recreate it), and the
 * event name S3 gives a completion (`ObjectCreated:CompleteMultipartUpload`; s3rver says `Post`). Parts
 * live in s3rver's own upload directory: `<n>` with `<n>.md5` once the part is fully stored.
 */
function multipartMiddleware(
  server: S3rverInstance,
  completing: Set<string>,
  log: S3Request[],
  verifyUrls: boolean,
  counter: { inFlight: number },
): KoaMiddleware {
  return async (ctx, next) => {
    const [, bucket = '', ...rest] = ctx.path.split('/');
    const key = rest.map((segment) => decodeURIComponent(segment)).join('/');
    const uploadId = typeof ctx.query.uploadId === 'string' ? ctx.query.uploadId : undefined;
    const partNumber = typeof ctx.query.partNumber === 'string' ? Number(ctx.query.partNumber) : undefined;
    // Counted until the response is sent or the client is gone (an upload cut off mid-body never ends here).
    counter.inFlight++;
    ctx.res.once('close', () => {
      counter.inFlight--;
    });
    try {
      if (verifyUrls && !signatureAccepted(ctx)) {
        ctx.req.resume();
        return;
      }
      if (ctx.method === 'GET' && key === '' && bucket !== '' && 'uploads' in ctx.query) {
        await listMultipartUploads(server, bucket, ctx);
        return;
      }
      if (uploadId === undefined || ctx.method === 'OPTIONS' || key === '') {
        await next();
        return;
      }
      const directory = join(server.store.getResourcePath(bucket, undefined, 'uploads'), uploadId);
      const exists = await stat(join(directory, 'key')).then(
        () => true,
        () => false,
      );
      if (!exists) {
        s3Error(ctx, 404, 'NoSuchUpload', 'The specified upload does not exist.');
        return;
      }
      if (ctx.method === 'DELETE') {
        await rm(directory, { recursive: true, force: true });
        ctx.status = 204;
        ctx.body = '';
        return;
      }
      if (ctx.method === 'GET') {
        const names = await readdir(directory);
        const parts = await Promise.all(
          names
            .filter((name) => /^\d+\.md5$/.test(name))
            .map(async (name) => {
              const number = Number(name.slice(0, -4));
              const [md5, info] = await Promise.all([
                readFile(join(directory, name), 'utf8'),
                stat(join(directory, String(number))),
              ]);
              return { number, md5, size: info.size, modified: info.mtime.toISOString() };
            }),
        );
        parts.sort((a, b) => a.number - b.number);
        const marker = Number(ctx.query['part-number-marker'] ?? 0);
        const max = Math.min(Number(ctx.query['max-parts'] ?? 1000), 1000);
        const page = parts.filter((p) => p.number > marker).slice(0, max);
        const truncated = parts.filter((p) => p.number > marker).length > page.length;
        ctx.status = 200;
        ctx.set('Content-Type', 'application/xml');
        ctx.body = [
          '<?xml version="1.0" encoding="UTF-8"?>\n<ListPartsResult>',
          `<Bucket>${xmlEscape(bucket)}</Bucket><Key>${xmlEscape(key)}</Key><UploadId>${uploadId}</UploadId>`,
          `<PartNumberMarker>${marker}</PartNumberMarker>`,
          `<NextPartNumberMarker>${page.at(-1)?.number ?? marker}</NextPartNumberMarker>`,
          `<MaxParts>${max}</MaxParts><IsTruncated>${truncated}</IsTruncated>`,
          ...page.map(
            (p) =>
              `<Part><PartNumber>${p.number}</PartNumber><LastModified>${p.modified}</LastModified>` +
              `<ETag>"${p.md5}"</ETag><Size>${p.size}</Size></Part>`,
          ),
          '</ListPartsResult>',
        ].join('');
        return;
      }
      if (ctx.method === 'POST') completing.add(key);
      try {
        await next();
      } finally {
        completing.delete(key);
      }
    } finally {
      log.push({ method: ctx.method, key, partNumber, uploadId, status: ctx.status });
    }
  };
}

/**
 * A presigned request checked as S3 checks it (verifyPresignedUrls); false when it was refused (answered
 * here). The URL is the one the client addressed: its Host header and the path and query as sent.
 */
function signatureAccepted(ctx: KoaContext): boolean {
  const url = ctx.req.url ?? '/';
  // A browser's CORS preflight carries the URL's query but is never signed: the CORS rule answers it.
  if (ctx.method === 'OPTIONS' || !isPresigned(url)) return true;
  const headers: Record<string, string | undefined> = {};
  for (const [name, value] of Object.entries(ctx.req.headers))
    headers[name] = Array.isArray(value) ? value.join(',') : value;
  const verdict = verifyPresigned(
    { method: ctx.method, url: `http://${ctx.req.headers.host ?? ''}${url}`, headers },
    { accessKeyId: S3_ACCESS_KEY_ID, secretAccessKey: S3_SECRET_ACCESS_KEY },
  );
  if (verdict.ok) return true;
  if (verdict.reason === 'expired') s3Error(ctx, 403, 'AccessDenied', 'Request has expired');
  else
    s3Error(ctx, 403, 'SignatureDoesNotMatch', `The request signature does not match (${verdict.reason}).`);
  return false;
}

/**
 * ListMultipartUploads (`GET /<bucket>?uploads`), which s3rver answers NotImplemented: the uploads started and
 * neither completed nor aborted, from its uploads directory (`<id>/key` names the key; the file's time is the
 * initiation). Sorted by key, then initiation, as S3 lists them; `prefix`, `key-marker`, `upload-id-marker` and
 * `max-uploads` (at most 1000) as S3 reads them.
 */
async function listMultipartUploads(server: S3rverInstance, bucket: string, ctx: KoaContext): Promise<void> {
  const query = (name: string): string | undefined =>
    typeof ctx.query[name] === 'string' ? ctx.query[name] : undefined;
  const prefix = query('prefix') ?? '';
  const keyMarker = query('key-marker') ?? '';
  const uploadIdMarker = query('upload-id-marker') ?? '';
  const max = Math.max(1, Math.min(Number(query('max-uploads') ?? 1000), 1000));
  const root = server.store.getResourcePath(bucket, undefined, 'uploads');
  const ids = await readdir(root).catch(() => [] as string[]);
  const uploads = (
    await Promise.all(
      ids.map(async (id) => {
        const file = join(root, id, 'key');
        const [key, info] = await Promise.all([
          readFile(file, 'utf8').catch(() => undefined),
          stat(file).catch(() => undefined),
        ]);
        return key === undefined || info === undefined ? [] : [{ key, id, initiated: info.mtime }];
      }),
    )
  )
    .flat()
    .filter((u) => u.key.startsWith(prefix))
    .sort((a, b) =>
      a.key !== b.key
        ? a.key < b.key
          ? -1
          : 1
        : a.initiated.getTime() - b.initiated.getTime() || (a.id < b.id ? -1 : 1),
    );
  const start =
    keyMarker === ''
      ? 0
      : uploadIdMarker === ''
        ? uploads.findIndex((u) => u.key > keyMarker)
        : uploads.findIndex((u) => u.key === keyMarker && u.id === uploadIdMarker) + 1;
  const rest = start < 0 ? [] : uploads.slice(start);
  const page = rest.slice(0, max);
  const truncated = rest.length > page.length;
  ctx.status = 200;
  ctx.set('Content-Type', 'application/xml');
  ctx.body = [
    '<?xml version="1.0" encoding="UTF-8"?>\n<ListMultipartUploadsResult>',
    `<Bucket>${xmlEscape(bucket)}</Bucket><KeyMarker>${xmlEscape(keyMarker)}</KeyMarker>`,
    `<UploadIdMarker>${xmlEscape(uploadIdMarker)}</UploadIdMarker><Prefix>${xmlEscape(prefix)}</Prefix>`,
    truncated
      ? `<NextKeyMarker>${xmlEscape(page.at(-1)!.key)}</NextKeyMarker><NextUploadIdMarker>${page.at(-1)!.id}</NextUploadIdMarker>`
      : '',
    `<MaxUploads>${max}</MaxUploads><IsTruncated>${truncated}</IsTruncated>`,
    ...page.map(
      (u) =>
        `<Upload><Key>${xmlEscape(u.key)}</Key><UploadId>${u.id}</UploadId>` +
        `<Initiated>${u.initiated.toISOString()}</Initiated><StorageClass>STANDARD</StorageClass></Upload>`,
    ),
    '</ListMultipartUploadsResult>',
  ].join('');
}

/** AWS encodes event keys as form data per path segment: `a dir/ünï.jpg` → `a+dir/%C3%BCn%C3%AF.jpg`. */
export function encodeEventKey(key: string): string {
  return key
    .split('/')
    .map((segment) => encodeURIComponent(segment).replace(/%20/g, '+'))
    .join('/');
}

const S3_ACCESS_KEY_ID = 'S3RVER';
const S3_SECRET_ACCESS_KEY = 'S3RVER';

/**
 * The first of `records`, or else of the records `waiters` hear from now on, whose key is `recordKey` (`key` as
 * the store writes it in its records); rejected after `timeoutMs`. For a store's `waitForObjectCreated`.
 */
export function waitForRecord(
  records: readonly S3EventRecord[],
  waiters: Set<(record: S3EventRecord) => void>,
  key: string,
  recordKey: string,
  timeoutMs: number,
): Promise<S3EventRecord> {
  const seen = records.find((r) => r.s3.object.key === recordKey);
  if (seen !== undefined) return Promise.resolve(seen);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      waiters.delete(waiter);
      reject(new Error(`no ObjectCreated event for "${key}" within ${timeoutMs} ms`));
    }, timeoutMs);
    const waiter = (record: S3EventRecord): void => {
      if (record.s3.object.key !== recordKey) return;
      clearTimeout(timer);
      waiters.delete(waiter);
      resolve(record);
    };
    waiters.add(waiter);
  });
}

/** A local S3 (s3rver) on 127.0.0.1 with one bucket, reporting created objects as S3 event records. */
export async function startS3(options: StartS3Options = {}): Promise<S3Server> {
  const require = createRequire(import.meta.url);
  const S3rver = require('s3rver') as S3rverConstructor;
  const bucket = options.bucket ?? 'media';
  const temporary =
    options.directory === undefined ? await mkdtemp(join(tmpdir(), 'testkit-s3-')) : undefined;
  const directory = options.directory ?? temporary ?? '';
  const onError =
    options.onError ??
    ((err: unknown) => {
      console.error('testkit S3: onObjectCreated failed', err);
    });

  const server = new S3rver({
    address: '127.0.0.1',
    port: options.port ?? (await freePort('tcp')),
    directory,
    silent: true,
    configureBuckets: [
      {
        name: bucket,
        configs:
          options.corsOrigins === undefined || options.corsOrigins.length === 0
            ? []
            : [corsConfiguration(options.corsOrigins)],
      },
    ],
  });
  const requests: S3Request[] = [];
  const counter = { inFlight: 0 };
  const completing = new Set<string>();
  // Koa composes its middleware when the server starts: placed first, this sees every request.
  server.middleware.unshift(
    multipartMiddleware(server, completing, requests, options.verifyPresignedUrls === true, counter),
  );
  // Koa logs every failed request (404s included) to stderr unless the app has an error listener.
  server.on('error', () => undefined);

  const records: S3EventRecord[] = [];
  const waiters = new Set<(record: S3EventRecord) => void>();
  // Records are delivered in the order s3rver emits them, one at a time.
  let delivery = Promise.resolve();

  server.on('event', (event) => {
    for (const emitted of event.Records) {
      if (!emitted.eventName.startsWith('ObjectCreated:')) continue;
      // Emitted while the completion's request is still being handled (see multipartMiddleware).
      const raw =
        emitted.eventName === 'ObjectCreated:Post' && completing.has(emitted.s3.object.key)
          ? { ...emitted, eventName: 'ObjectCreated:CompleteMultipartUpload' }
          : emitted;
      if (options.eventPrefix !== undefined && !raw.s3.object.key.startsWith(options.eventPrefix)) continue;
      delivery = delivery.then(async () => {
        const rawKey = raw.s3.object.key;
        const metadata = await server.store.getMetadata(raw.s3.bucket.name, rawKey).catch(() => undefined);
        const contentType = metadata?.['content-type'];
        const record: S3EventRecord = {
          ...raw,
          s3: {
            ...raw.s3,
            object: {
              ...raw.s3.object,
              key: encodeEventKey(rawKey),
              ...(typeof contentType === 'string' ? { contentType } : {}),
            },
          },
        };
        records.push(record);
        for (const waiter of waiters) waiter(record);
        try {
          await options.onObjectCreated?.(record);
        } catch (err) {
          onError(err);
        }
      });
    }
  });

  const { port } = await server.run();

  return {
    kind: 's3rver',
    endpoint: `http://127.0.0.1:${port}`,
    region: 'us-east-1',
    bucket,
    accessKeyId: S3_ACCESS_KEY_ID,
    secretAccessKey: S3_SECRET_ACCESS_KEY,
    objectCreated: records,
    requests,
    get inFlight() {
      return counter.inFlight;
    },
    waitForObjectCreated(key, timeoutMs = 5000) {
      return waitForRecord(records, waiters, key, encodeEventKey(key), timeoutMs);
    },
    async stop() {
      // SDK clients keep sockets alive; close() would otherwise wait for them to time out.
      const closing = server.close();
      server.httpServer?.closeAllConnections();
      await closing;
      await delivery;
      if (temporary !== undefined) await rm(temporary, { recursive: true, force: true });
    },
  };
}
