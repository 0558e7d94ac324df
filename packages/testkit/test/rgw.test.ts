// The test kit's RADOS Gateway: a real S3 (Ceph 16.2 from Debian) started per test file. These tests pin what
// the workflow's suites rely on (presigned URLs checked by the store: object-store.test.ts): the multipart API, CORS, the bucket notification
// in AWS's record shape with keys as stored, the request log, a clean stop, and a clear failure without the
// Debian packages.
import { readFile } from 'node:fs/promises';
import type { S3Client } from '@aws-sdk/client-s3';
import {
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  GetObjectCommand,
  HeadObjectCommand,
  PutObjectCommand,
  UploadPartCommand,
} from '@aws-sdk/client-s3';
import { jest } from '@jest/globals';
import { validateObjectCreatedEvent } from '@platform/contracts';
import { requireRgwCommands, RgwMissingError, startRgw } from '@platform/testkit';
import type { RgwServer, S3EventRecord } from '@platform/testkit';
import { storeClient } from './support/store-client.js';

jest.setTimeout(60_000);

describe('startRgw', () => {
  let rgw: RgwServer;
  let client: S3Client;
  const delivered: S3EventRecord[] = [];

  beforeAll(async () => {
    rgw = await startRgw({
      bucket: 'media-test',
      corsOrigins: ['http://portal.test'],
      eventPrefix: 'sites/',
      onObjectCreated: (record) => {
        delivered.push(record);
      },
    });
    process.stdout.write(`RADOS Gateway started in ${rgw.startupMs} ms\n`);
    client = storeClient(rgw);
  });
  afterAll(async () => {
    client?.destroy();
    await rgw?.stop();
  });

  it('stores an object and pushes an AWS-shaped ObjectCreated record with the key as stored', async () => {
    const key = 'sites/a dir/ünï+100%.jpg';
    const body = Buffer.from('not really a jpeg');
    await client.send(
      new PutObjectCommand({ Bucket: rgw.bucket, Key: key, Body: body, ContentType: 'image/jpeg' }),
    );
    const stored = await client.send(new GetObjectCommand({ Bucket: rgw.bucket, Key: key }));
    expect(Buffer.from(await stored.Body!.transformToByteArray())).toEqual(body);

    const record = await rgw.waitForObjectCreated(key);
    expect(record).toMatchObject({
      eventSource: 'ceph:s3',
      eventName: 'ObjectCreated:Put',
      s3: { bucket: { name: 'media-test' }, object: { key, size: body.length } },
    });
    expect(delivered).toContain(record);
    // The workflow webhook's contract accepts it as a plain S3 event body.
    expect(validateObjectCreatedEvent({ Records: [record] }).ok).toBe(true);
    // Outside the notification's prefix: no record.
    await client.send(new PutObjectCommand({ Bucket: rgw.bucket, Key: 'elsewhere.txt', Body: 'x' }));
    await expect(rgw.waitForObjectCreated('elsewhere.txt', 500)).rejects.toThrow(/no ObjectCreated/);
    // Every request went through the request log, answered.
    expect(rgw.requests).toContainEqual({
      method: 'PUT',
      key,
      partNumber: undefined,
      uploadId: undefined,
      status: 200,
    });
  });

  it('answers the CORS preflight of the portal origin with ETag exposed', async () => {
    const res = await fetch(`${rgw.endpoint}/${rgw.bucket}/sites/x.png`, {
      method: 'OPTIONS',
      headers: {
        Origin: 'http://portal.test',
        'Access-Control-Request-Method': 'PUT',
        'Access-Control-Request-Headers': 'content-type',
      },
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('access-control-allow-origin')).toBe('http://portal.test');
    expect(res.headers.get('access-control-expose-headers')?.toLowerCase()).toContain('etag');
    const other = await fetch(`${rgw.endpoint}/${rgw.bucket}/sites/x.png`, {
      method: 'OPTIONS',
      headers: { Origin: 'http://evil.test', 'Access-Control-Request-Method': 'PUT' },
    });
    expect(other.headers.get('access-control-allow-origin')).toBeNull();
  });

  it('assembles uploads in parts and reports CompleteMultipartUpload', async () => {
    const key = 'sites/video.mp4';
    const { UploadId } = await client.send(
      new CreateMultipartUploadCommand({ Bucket: rgw.bucket, Key: key, ContentType: 'video/mp4' }),
    );
    const parts = [];
    for (const [n, size] of [
      [1, 5 * 1024 * 1024],
      [2, 10],
    ] as const) {
      const out = await client.send(
        new UploadPartCommand({
          Bucket: rgw.bucket,
          Key: key,
          UploadId,
          PartNumber: n,
          Body: Buffer.alloc(size, n),
        }),
      );
      parts.push({ PartNumber: n, ETag: out.ETag });
    }
    await client.send(
      new CompleteMultipartUploadCommand({
        Bucket: rgw.bucket,
        Key: key,
        UploadId,
        MultipartUpload: { Parts: parts },
      }),
    );
    const record = await rgw.waitForObjectCreated(key);
    expect(record.eventName).toBe('ObjectCreated:CompleteMultipartUpload');
    expect(record.s3.object.eTag).toMatch(/^[0-9a-f]{32}-2$/);
  });

  it('copies despite a wrong x-amz-copy-source-if-match (Ceph 16.2; design §4.6 relies on it being known)', async () => {
    await client.send(new PutObjectCommand({ Bucket: rgw.bucket, Key: 'src.txt', Body: 'hello' }));
    const copy = await client.send(
      new CopyObjectCommand({
        Bucket: rgw.bucket,
        Key: 'dst.txt',
        CopySource: `${rgw.bucket}/src.txt`,
        CopySourceIfMatch: '"00000000000000000000000000000000"',
      }),
    );
    expect(copy.CopyObjectResult?.ETag).toBeDefined();
    const head = await client.send(new HeadObjectCommand({ Bucket: rgw.bucket, Key: 'dst.txt' }));
    expect(head.ContentLength).toBe(5);
  });

  it('stops every daemon and removes its directory', async () => {
    const other = await startRgw();
    const pids = other.pids;
    expect(pids).toHaveLength(3);
    const rss = await Promise.all(
      pids.map(async (pid) =>
        Number(/VmRSS:\s+(\d+) kB/.exec(await readFile(`/proc/${pid}/status`, 'utf8'))?.[1]),
      ),
    );
    process.stdout.write(
      `RADOS Gateway: started in ${other.startupMs} ms, resident ${Math.round(rss.reduce((a, b) => a + b) / 1024)} MiB (mon, osd, rgw)\n`,
    );
    await other.stop();
    for (const pid of pids) expect(() => process.kill(pid, 0)).toThrow();
    await expect(fetch(other.endpoint)).rejects.toThrow();
  });
});

it('fails, naming the Debian packages, when the Ceph commands are not on PATH (never skips)', async () => {
  const path = process.env.PATH;
  process.env.PATH = '/nonexistent';
  try {
    const failure = requireRgwCommands();
    await expect(failure).rejects.toBeInstanceOf(RgwMissingError);
    await expect(failure).rejects.toThrow(
      /RADOS Gateway is not installed or not on PATH \(missing: radosgw, ceph-mon, .*`radosgw ceph-mon ceph-osd ceph-common`/,
    );
    await expect(startRgw()).rejects.toBeInstanceOf(RgwMissingError);
  } finally {
    process.env.PATH = path;
  }
});
