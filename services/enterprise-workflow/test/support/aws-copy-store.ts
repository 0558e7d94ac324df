// A store whose copies have ETags of their own, as on Amazon S3, in front of a test store (s3rver and the
// RADOS Gateway both give a copy its source's ETag). On AWS a copy of an object assembled from parts gets the
// MD5 of its bytes, never the source's `<md5 of the parts' md5s>-<parts>`, and an SSE-KMS or SSE-C copy an
// ETag that is no MD5 at all (Amazon S3 API Reference, "Object" data type, ETag; "CopyObjectResult": "the
// source and destination ETag is identical for a successfully copied non-multipart object"). AWS honours
// x-amz-copy-source-if-match (412). This proxy does both: it checks the condition against the source, lets
// the store copy, and from then on reports the copy (CopyObject's answer, HEAD and GET) with an ETag of its
// own, as an SSE-KMS bucket would. Every other request goes to the store unchanged (same Host header, so
// signatures verify).
import { createHash } from 'node:crypto';
import { createServer, request as httpRequest } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { HeadObjectCommand, S3Client } from '@aws-sdk/client-s3';
import type { TestObjectStore } from '@platform/testkit';

export interface AwsCopyStoreOptions {
  /**
   * Whether x-amz-copy-source-if-match is honoured (412), as on AWS. Default true; false makes the worst store
   * the webhook must cope with: one that ignores the condition (s3rver, Ceph RGW 16.2) and still gives each
   * copy an ETag of its own.
   */
  honourIfMatch?: boolean;
}

export interface AwsCopyStore {
  endpoint: string;
  /** Runs when a CopyObject arrives, before anything else (e.g. a PUT that replaces the source meanwhile). */
  beforeCopy: (() => Promise<void>) | undefined;
  /** The copies made through this proxy: destination key → the ETag it reports for it. */
  copies: Map<string, string>;
  stop(): Promise<void>;
}

/** The object key of a path-style request (`/<bucket>/<key>`), decoded. */
function keyOf(url: string): string {
  return new URL(url, 'http://store').pathname
    .split('/')
    .slice(2)
    .map((segment) => decodeURIComponent(segment))
    .join('/');
}

const unquoted = (etag: string | undefined): string => (etag ?? '').replace(/"/g, '');

export async function startAwsCopyStore(
  store: TestObjectStore,
  options: AwsCopyStoreOptions = {},
): Promise<AwsCopyStore> {
  const client = new S3Client({
    endpoint: store.endpoint,
    region: store.region,
    forcePathStyle: true,
    credentials: { accessKeyId: store.accessKeyId, secretAccessKey: store.secretAccessKey },
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
  });
  const target = new URL(store.endpoint);
  const copies = new Map<string, string>();
  let made = 0;
  const proxy: AwsCopyStore = {
    endpoint: '',
    beforeCopy: undefined,
    copies,
    stop: () => Promise.resolve(),
  };

  /**
   * Sends the request to the store. `etag` replaces the ETag header of a 200 answer; `body` rewrites the body
   * of a (small, XML) answer before it goes back.
   */
  function forward(
    req: IncomingMessage,
    res: ServerResponse,
    change: { etag?: string; body?: (status: number, body: string) => string } = {},
  ): void {
    const { expect: _expect, ...headers } = req.headers;
    const upstream = httpRequest(
      { host: target.hostname, port: target.port, method: req.method, path: req.url, headers },
      (answer) => {
        const status = answer.statusCode ?? 502;
        const out = { ...answer.headers };
        if (change.etag !== undefined && status === 200) out.etag = `"${change.etag}"`;
        const rewrite = change.body;
        if (rewrite === undefined) {
          res.writeHead(status, out);
          answer.pipe(res);
          return;
        }
        const chunks: Buffer[] = [];
        answer.on('data', (chunk: Buffer) => chunks.push(chunk));
        answer.on('end', () => {
          delete out['content-length'];
          delete out['transfer-encoding'];
          res.writeHead(status, out).end(rewrite(status, Buffer.concat(chunks).toString('utf8')));
        });
      },
    );
    upstream.on('error', () => {
      if (!res.headersSent) res.writeHead(502).end();
    });
    req.pipe(upstream);
  }

  /** CopyObject as AWS answers it: the condition checked first, then the store's copy with an ETag of its own. */
  async function copy(req: IncomingMessage, res: ServerResponse, source: string, key: string): Promise<void> {
    const [bucket = '', ...rest] = decodeURIComponent(source.replace(/^\//, '')).split('/');
    const ifMatch = req.headers['x-amz-copy-source-if-match'];
    await proxy.beforeCopy?.();
    let sourceEtag: string | undefined;
    try {
      sourceEtag = (await client.send(new HeadObjectCommand({ Bucket: bucket, Key: rest.join('/') }))).ETag;
    } catch {
      // The source is gone: the store answers NoSuchKey itself.
      forward(req, res);
      return;
    }
    if (
      options.honourIfMatch !== false &&
      typeof ifMatch === 'string' &&
      unquoted(ifMatch) !== unquoted(sourceEtag)
    ) {
      req.resume();
      res
        .writeHead(412, { 'Content-Type': 'application/xml' })
        .end(
          '<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>',
        );
      return;
    }
    forward(req, res, {
      body: (status, body) => {
        if (status !== 200) return body;
        const etag = createHash('md5').update(`sse-kms copy ${++made} of ${key}`).digest('hex');
        copies.set(key, etag);
        return body.replace(/<ETag>[^<]*<\/ETag>/, `<ETag>"${etag}"</ETag>`);
      },
    });
  }

  const server = createServer((req, res) => {
    const source = req.headers['x-amz-copy-source'];
    const key = keyOf(req.url ?? '/');
    if (req.method === 'PUT' && typeof source === 'string') {
      copy(req, res, source, key).catch(() => {
        if (!res.headersSent) res.writeHead(500).end();
      });
      return;
    }
    const own = copies.get(key);
    if ((req.method === 'HEAD' || req.method === 'GET') && own !== undefined) {
      forward(req, res, { etag: own });
      return;
    }
    forward(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  proxy.endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  proxy.stop = async () => {
    client.destroy();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  return proxy;
}
