import type { Server } from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort } from './ports.js';

/** An S3 event notification record, as AWS sends it (s3rver's shape plus MinIO's `contentType`). */
export interface S3EventRecord {
  eventVersion: string;
  eventSource: string;
  awsRegion: string;
  eventTime: string;
  /** `ObjectCreated:Put`, `ObjectCreated:Post` or `ObjectCreated:Copy`. */
  eventName: string;
  userIdentity: { principalId: string };
  requestParameters: { sourceIPAddress: string };
  responseElements: Record<string, string>;
  s3: {
    s3SchemaVersion: string;
    configurationId: string;
    bucket: { name: string; ownerIdentity: { principalId: string }; arn: string };
    object: {
      /** URL-encoded like AWS (form encoding: space as `+`, `/` kept); see `encodeEventKey`. */
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
}

export interface S3Server {
  /** e.g. `http://127.0.0.1:41234`; clients need `forcePathStyle: true`. */
  endpoint: string;
  region: string;
  bucket: string;
  /** s3rver's built-in credentials. It does not verify SigV4 signatures (any signature passes). */
  accessKeyId: string;
  secretAccessKey: string;
  /** Every ObjectCreated record so far, oldest first. */
  readonly objectCreated: readonly S3EventRecord[];
  /** Resolves with the first ObjectCreated record for `key` (decoded), waiting up to `timeoutMs`. */
  waitForObjectCreated(key: string, timeoutMs?: number): Promise<S3EventRecord>;
  stop(): Promise<void>;
}

/** s3rver's API as used here (it ships no type declarations). */
interface S3rverInstance {
  run(): Promise<{ port: number }>;
  close(): Promise<void>;
  httpServer?: Server;
  store: { getMetadata(bucket: string, key: string): Promise<Record<string, unknown>> };
  on(event: 'event', listener: (event: { Records: S3EventRecord[] }) => void): unknown;
  on(event: 'error', listener: (err: unknown) => void): unknown;
}
type S3rverConstructor = new (options: Record<string, unknown>) => S3rverInstance;

/** AWS encodes event keys as form data per path segment: `a dir/ünï.jpg` → `a+dir/%C3%BCn%C3%AF.jpg`. */
export function encodeEventKey(key: string): string {
  return key
    .split('/')
    .map((segment) => encodeURIComponent(segment).replace(/%20/g, '+'))
    .join('/');
}

const S3_ACCESS_KEY_ID = 'S3RVER';
const S3_SECRET_ACCESS_KEY = 'S3RVER';

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
    configureBuckets: [{ name: bucket, configs: [] }],
  });
  // Koa logs every failed request (404s included) to stderr unless the app has an error listener.
  server.on('error', () => undefined);

  const records: S3EventRecord[] = [];
  const waiters = new Set<(record: S3EventRecord) => void>();
  // Records are delivered in the order s3rver emits them, one at a time.
  let delivery = Promise.resolve();

  server.on('event', (event) => {
    for (const raw of event.Records) {
      if (!raw.eventName.startsWith('ObjectCreated:')) continue;
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
    endpoint: `http://127.0.0.1:${port}`,
    region: 'us-east-1',
    bucket,
    accessKeyId: S3_ACCESS_KEY_ID,
    secretAccessKey: S3_SECRET_ACCESS_KEY,
    objectCreated: records,
    waitForObjectCreated(key, timeoutMs = 5000) {
      const encoded = encodeEventKey(key);
      const seen = records.find((r) => r.s3.object.key === encoded);
      if (seen !== undefined) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          waiters.delete(waiter);
          reject(new Error(`no ObjectCreated event for "${key}" within ${timeoutMs} ms`));
        }, timeoutMs);
        const waiter = (record: S3EventRecord): void => {
          if (record.s3.object.key !== encoded) return;
          clearTimeout(timer);
          waiters.delete(waiter);
          resolve(record);
        };
        waiters.add(waiter);
      });
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
