// Both local stores the workflow's suites run against refuse a presigned PUT whose signed Content-Type or
// Content-Length differs, whose signature is wrong or which expired, as S3 does: the RADOS Gateway by
// itself, s3rver (which checks no signature) through the check startObjectStore adds; and both answer a
// browser's preflight of such a URL from the bucket's CORS rule.
import { jest } from '@jest/globals';
import type { S3Client } from '@aws-sdk/client-s3';
import { PutObjectCommand } from '@aws-sdk/client-s3';
import { getSignedUrl } from '@aws-sdk/s3-request-presigner';
import { OBJECT_STORE_KINDS, startObjectStore } from '@platform/testkit';
import type { TestObjectStore } from '@platform/testkit';
import { storeClient } from './support/store-client.js';

jest.setTimeout(60_000);

describe.each(OBJECT_STORE_KINDS)('startObjectStore(%s)', (kind) => {
  let store: TestObjectStore;
  let client: S3Client;

  beforeAll(async () => {
    store = await startObjectStore(kind, { corsOrigins: ['http://portal.test'] });
    client = storeClient(store);
  });
  afterAll(async () => {
    client?.destroy();
    await store?.stop();
  });

  const presign = (key: string, expiresIn: number, signingDate?: Date) =>
    getSignedUrl(
      client,
      new PutObjectCommand({ Bucket: store.bucket, Key: key, ContentType: 'image/png', ContentLength: 5 }),
      { expiresIn, signableHeaders: new Set(['content-type']), ...(signingDate ? { signingDate } : {}) },
    );
  const put = (url: string, type: string, body: string) =>
    fetch(url, { method: 'PUT', headers: { 'Content-Type': type }, body });
  const code = async (res: Response) => /<Code>([^<]+)<\/Code>/.exec(await res.text())?.[1];

  it('refuses another Content-Type, another length and a wrong signature with 403 SignatureDoesNotMatch', async () => {
    const url = await presign('sites/p.png', 60);
    for (const res of [
      await put(url, 'text/html', '12345'),
      await put(url, 'image/png', '123456'),
      await put(
        url.replace(
          /X-Amz-Signature=([0-9a-f])/,
          (_m, d: string) => `X-Amz-Signature=${d === '0' ? '1' : '0'}`,
        ),
        'image/png',
        '12345',
      ),
    ]) {
      expect(res.status).toBe(403);
      expect(await code(res)).toBe('SignatureDoesNotMatch');
    }
    expect((await put(url, 'image/png', '12345')).status).toBe(200);
  });

  it("answers a browser's preflight of a presigned URL from the CORS rule (a preflight is never signed)", async () => {
    const url = await presign('sites/cors.png', 60);
    const res = await fetch(url, {
      method: 'OPTIONS',
      headers: {
        Origin: 'http://portal.test',
        'Access-Control-Request-Method': 'PUT',
        'Access-Control-Request-Headers': 'content-type',
      },
    });
    expect(res.status).toBe(200);
    // The RADOS Gateway names the origin, s3rver answers `*`: a browser sends no credentials to either.
    expect(['http://portal.test', '*']).toContain(res.headers.get('access-control-allow-origin'));
  });

  it('refuses an expired URL with 403', async () => {
    const url = await presign('sites/old.png', 60, new Date(Date.now() - 120_000));
    const res = await put(url, 'image/png', '12345');
    expect(res.status).toBe(403);
    expect(await code(res)).toBe('AccessDenied');
  });
});
