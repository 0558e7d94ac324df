// Presigned URLs checked twice: the URL itself with an independent SigV4 implementation, and the URLs the
// service signs used against each test store (s3rver, which the test kit makes check presigned requests, and
// Ceph's RADOS Gateway, which checks them itself): a PUT whose signed Content-Type or Content-Length differs,
// or whose signature is wrong, is refused by the store.
import {
  CreateMultipartUploadCommand,
  GetObjectCommand,
  PutObjectCommand,
  S3Client,
  UploadPartCommand,
} from '@aws-sdk/client-s3';
import { getSignedUrl } from '@aws-sdk/s3-request-presigner';
import { OBJECT_STORE_KINDS, startObjectStore } from '@platform/testkit';
import type { TestObjectStore } from '@platform/testkit';
import { createS3Storage } from '../src/storage/s3-store.js';
import type { MediaStorage } from '../src/domain/ports.js';
import { contentDisposition } from '../src/domain/media-rules.js';
import { verifyPresigned } from './support/sigv4.js';

const credentials = { accessKeyId: 'test-access-key', secretAccessKey: 'test-secret-key' };

describe('presigned URLs', () => {
  let storage: MediaStorage;
  const now = new Date('2026-11-22T10:00:00Z');

  beforeAll(() => {
    storage = createS3Storage({
      endpoint: 'http://127.0.0.1:9',
      publicEndpoint: 'http://media.example.test:9000',
      region: 'eu-central-1',
      bucket: 'media',
      ...credentials,
      forcePathStyle: true,
    });
  });
  afterAll(() => storage.destroy());

  const upload = () =>
    storage.presignUpload({
      key: 'sites/s1/media/m1.png',
      contentType: 'image/png',
      sizeBytes: 1234,
      expiresInS: 900,
      now,
    });

  it('signs host, content-type and content-length into a PUT URL that verifies', async () => {
    const signed = await upload();
    expect(signed.method).toBe('PUT');
    expect(signed.headers).toEqual({ 'Content-Type': 'image/png' });
    expect(signed.expiresAt.toISOString()).toBe('2026-11-22T10:15:00.000Z');
    const url = new URL(signed.url);
    expect(url.origin).toBe('http://media.example.test:9000');
    expect(url.pathname).toBe('/media/sites/s1/media/m1.png');
    expect(url.searchParams.get('X-Amz-Expires')).toBe('900');

    const verdict = verifyPresigned(
      { method: 'PUT', url: signed.url, headers: { ...signed.headers, 'content-length': '1234' } },
      credentials,
      new Date(now.getTime() + 60_000),
    );
    expect(verdict).toEqual({
      ok: true,
      signedHeaders: ['content-length', 'content-type', 'host'],
      expiresAt: signed.expiresAt,
    });
  });

  it('carries no checksum of the empty body (custom endpoint: no SDK checksum middleware)', async () => {
    const url = new URL((await upload()).url);
    const names = [...url.searchParams.keys()].map((k) => k.toLowerCase());
    expect(
      names.filter((n) => n.startsWith('x-amz-checksum') || n === 'x-amz-sdk-checksum-algorithm'),
    ).toEqual([]);
  });

  it('is refused with another content type, length, key, method, host or after expiry', async () => {
    const signed = await upload();
    const good = { 'content-type': 'image/png', 'content-length': '1234' };
    const at = new Date(now.getTime() + 1000);
    const check = (method: string, url: string, headers: Record<string, string>, when = at) =>
      verifyPresigned({ method, url, headers }, credentials, when);

    expect(check('PUT', signed.url, good).ok).toBe(true);
    expect(check('PUT', signed.url, { ...good, 'content-type': 'text/html' })).toEqual({
      ok: false,
      reason: 'signature mismatch',
    });
    expect(check('PUT', signed.url, { ...good, 'content-length': '999999' }).ok).toBe(false);
    expect(check('PUT', signed.url.replace('m1.png', 'm2.png'), good).ok).toBe(false);
    expect(check('GET', signed.url, good).ok).toBe(false);
    expect(check('PUT', signed.url.replace('X-Amz-Expires=900', 'X-Amz-Expires=9000'), good).ok).toBe(false);
    expect(check('PUT', signed.url, { ...good, host: 'evil.example:9000' }).ok).toBe(false);
    expect(check('PUT', signed.url, good, new Date(now.getTime() + 901_000))).toEqual({
      ok: false,
      reason: 'expired',
    });
    expect(
      verifyPresigned(
        { method: 'PUT', url: signed.url, headers: good },
        { ...credentials, secretAccessKey: 'other' },
        at,
      ).ok,
    ).toBe(false);
  });

  it('binds a declared SHA-256 as a signed header the client must send', async () => {
    const checksum = 'n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=';
    const signed = await storage.presignUpload({
      key: 'k.png',
      contentType: 'image/png',
      sizeBytes: 3,
      checksumSha256: checksum,
      expiresInS: 60,
      now,
    });
    expect(signed.headers).toEqual({ 'Content-Type': 'image/png', 'x-amz-checksum-sha256': checksum });
    const headers = { 'content-type': 'image/png', 'content-length': '3', 'x-amz-checksum-sha256': checksum };
    const at = new Date(now.getTime() + 1000);
    const verdict = verifyPresigned({ method: 'PUT', url: signed.url, headers }, credentials, at);
    expect(verdict.ok && verdict.signedHeaders).toEqual([
      'content-length',
      'content-type',
      'host',
      'x-amz-checksum-sha256',
    ]);
    expect(
      verifyPresigned(
        { method: 'PUT', url: signed.url, headers: { ...headers, 'x-amz-checksum-sha256': 'AAAA' } },
        credentials,
        at,
      ).ok,
    ).toBe(false);
  });

  it('signs a short-lived GET with a safe Content-Disposition', async () => {
    const disposition = contentDisposition('../../etc/"boiler" room ü.png');
    const signed = await storage.presignDownload({
      key: 'sites/s1/media/m1.png',
      contentDisposition: disposition,
      contentType: 'image/png',
      expiresInS: 300,
      now,
    });
    expect(signed.expiresAt.toISOString()).toBe('2026-11-22T10:05:00.000Z');
    const url = new URL(signed.url);
    expect(url.searchParams.get('response-content-disposition')).toBe(
      `attachment; filename="_boiler_ room _.png"; filename*=UTF-8''%22boiler%22%20room%20%C3%BC.png`,
    );
    expect(url.searchParams.get('response-content-type')).toBe('image/png');
    expect(url.searchParams.has('x-amz-checksum-mode')).toBe(false);
    const at = new Date(now.getTime() + 1000);
    expect(verifyPresigned({ method: 'GET', url: signed.url, headers: {} }, credentials, at).ok).toBe(true);
    const tampered = signed.url.replace(
      'response-content-type=image%2Fpng',
      'response-content-type=text%2Fhtml',
    );
    expect(tampered).not.toBe(signed.url);
    expect(verifyPresigned({ method: 'GET', url: tampered, headers: {} }, credentials, at).ok).toBe(false);
    expect(
      verifyPresigned(
        { method: 'GET', url: signed.url, headers: {} },
        credentials,
        new Date(now.getTime() + 301_000),
      ).ok,
    ).toBe(false);
  });
});

describe('presigned URLs on AWS (no custom endpoint: the SDK presigner, getSignedUrl)', () => {
  const now = new Date('2026-11-22T10:00:00Z');
  let storage: MediaStorage;

  // Without S3_ENDPOINT the service signs through getSignedUrl and the service's own S3 client, so
  // only that client's configuration keeps the SDK's default checksums out of the URL. Signing is
  // local: nothing is sent to AWS.
  beforeAll(() => {
    storage = createS3Storage({
      endpoint: undefined,
      publicEndpoint: undefined,
      region: 'eu-central-1',
      bucket: 'media',
      ...credentials,
      forcePathStyle: false,
    });
  });
  afterAll(() => storage.destroy());

  const checksumParams = (url: string) =>
    [...new URL(url).searchParams.keys()]
      .map((name) => name.toLowerCase())
      .filter((name) => name.startsWith('x-amz-checksum') || name === 'x-amz-sdk-checksum-algorithm');

  it('signs a PUT with content-type bound and no checksum of the empty body', async () => {
    const signed = await storage.presignUpload({
      key: 'sites/s1/media/m1.png',
      contentType: 'image/png',
      sizeBytes: 1234,
      expiresInS: 900,
      now,
    });
    const url = new URL(signed.url);
    // Proof that this is the SDK's endpoint resolution, not the custom-endpoint presigner.
    expect(url.origin).toBe('https://media.s3.eu-central-1.amazonaws.com');
    expect(url.searchParams.get('X-Amz-SignedHeaders')).toBe('content-length;content-type;host');
    expect(checksumParams(signed.url)).toEqual([]);
    const verdict = verifyPresigned(
      { method: 'PUT', url: signed.url, headers: { 'content-type': 'image/png', 'content-length': '1234' } },
      credentials,
      new Date(now.getTime() + 1000),
    );
    expect(verdict.ok).toBe(true);
  });

  it('signs a GET without checksum parameters (x-amz-checksum-crc32, x-amz-checksum-mode)', async () => {
    const signed = await storage.presignDownload({
      key: 'sites/s1/media/m1.png',
      contentDisposition: contentDisposition('m1.png'),
      contentType: 'image/png',
      expiresInS: 300,
      now,
    });
    expect(new URL(signed.url).origin).toBe('https://media.s3.eu-central-1.amazonaws.com');
    expect(checksumParams(signed.url)).toEqual([]);
  });
});

describe('direct presigning equals the SDK command pipeline', () => {
  const now = new Date('2026-11-22T10:00:00Z');
  const key = 'sites/s1/media/a b+c ü(1)*.png';
  const disposition = contentDisposition('Report "Q4" ü.png');

  it.each([
    ['path style with port', 'http://127.0.0.1:9000', true],
    ['virtual host', 'https://minio.example.com', false],
    ['path style with a base path', 'https://gw.example.com/s3', true],
  ])('%s', async (_name, endpoint, forcePathStyle) => {
    const settings = {
      endpoint,
      publicEndpoint: undefined,
      region: 'eu-west-1',
      bucket: 'media',
      ...credentials,
      forcePathStyle,
    };
    const storage = createS3Storage(settings);
    const reference = new S3Client({
      endpoint,
      region: 'eu-west-1',
      forcePathStyle,
      credentials,
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    });
    try {
      const checksum = 'n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=';
      const ours = await storage.presignUpload({
        key,
        contentType: 'image/png',
        sizeBytes: 42,
        checksumSha256: checksum,
        expiresInS: 900,
        now,
      });
      const theirs = await getSignedUrl(
        reference,
        new PutObjectCommand({
          Bucket: 'media',
          Key: key,
          ContentType: 'image/png',
          ContentLength: 42,
          ChecksumSHA256: checksum,
        }),
        {
          expiresIn: 900,
          signingDate: now,
          signableHeaders: new Set(['content-type']),
          unhoistableHeaders: new Set(['x-amz-checksum-sha256']),
        },
      );
      expect(ours.url).toBe(theirs);

      const download = await storage.presignDownload({
        key,
        contentDisposition: disposition,
        contentType: 'image/png',
        expiresInS: 300,
        now,
      });
      const theirsGet = await getSignedUrl(
        reference,
        new GetObjectCommand({
          Bucket: 'media',
          Key: key,
          ResponseContentDisposition: disposition,
          ResponseContentType: 'image/png',
        }),
        { expiresIn: 300, signingDate: now },
      );
      expect(download.url).toBe(theirsGet);

      // Part URLs are signed by @smithy/signature-v4 directly (s3-url-signer.ts): byte for byte getSignedUrl's, with and without
      // a part checksum.
      for (const partChecksum of [undefined, checksum]) {
        const part = await storage.presignPart({
          key,
          uploadId: 'VXBsb2FkIElE+/=',
          partNumber: 17,
          sizeBytes: 16 * 1024 * 1024,
          checksumSha256: partChecksum,
          expiresInS: 900,
          now,
        });
        const theirsPart = await getSignedUrl(
          reference,
          new UploadPartCommand({
            Bucket: 'media',
            Key: key,
            UploadId: 'VXBsb2FkIElE+/=',
            PartNumber: 17,
            ContentLength: 16 * 1024 * 1024,
            ...(partChecksum === undefined ? {} : { ChecksumSHA256: partChecksum }),
          }),
          { expiresIn: 900, signingDate: now, unhoistableHeaders: new Set(['x-amz-checksum-sha256']) },
        );
        expect(part.url).toBe(theirsPart);
        expect(part.headers).toEqual(
          partChecksum === undefined ? {} : { 'x-amz-checksum-sha256': partChecksum },
        );
      }
    } finally {
      storage.destroy();
      reference.destroy();
    }
  });
});

describe.each(OBJECT_STORE_KINDS)("the service's presigned URLs at %s", (kind) => {
  let store: TestObjectStore;
  let storage: MediaStorage;
  let client: S3Client;

  beforeAll(async () => {
    store = await startObjectStore(kind);
    storage = createS3Storage({
      endpoint: store.endpoint,
      publicEndpoint: undefined,
      region: store.region,
      bucket: store.bucket,
      accessKeyId: store.accessKeyId,
      secretAccessKey: store.secretAccessKey,
      forcePathStyle: true,
    });
    client = new S3Client({
      endpoint: store.endpoint,
      region: store.region,
      forcePathStyle: true,
      credentials: { accessKeyId: store.accessKeyId, secretAccessKey: store.secretAccessKey },
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    });
  }, 60_000);
  afterAll(async () => {
    storage?.destroy();
    client?.destroy();
    await store?.stop();
  });

  const errorCode = async (res: Response) => /<Code>([^<]+)<\/Code>/.exec(await res.text())?.[1];
  /** The URL with its signature's first hex digit changed. */
  const forged = (url: string) =>
    url.replace(/X-Amz-Signature=([0-9a-f])/, (_m, d: string) => `X-Amz-Signature=${d === '0' ? '1' : '0'}`);

  it('a PUT URL takes exactly the signed type and length; another type, length or signature is 403', async () => {
    const signed = await storage.presignUpload({
      key: 'sites/s1/media/m1.png',
      contentType: 'image/png',
      sizeBytes: 5,
      expiresInS: 60,
    });
    const put = (url: string, headers: Record<string, string>, body: string) =>
      fetch(url, { method: 'PUT', headers, body });
    for (const refused of [
      await put(signed.url, { 'Content-Type': 'text/html' }, '12345'),
      await put(signed.url, signed.headers, '123456'),
      await put(signed.url, signed.headers, '1234'),
      await put(forged(signed.url), signed.headers, '12345'),
    ]) {
      expect(refused.status).toBe(403);
      expect(await errorCode(refused)).toBe('SignatureDoesNotMatch');
    }
    expect((await put(signed.url, signed.headers, '12345')).status).toBe(200);
  });

  it('a part URL takes exactly its part length', async () => {
    const key = 'sites/s1/media/v1.mp4';
    const { UploadId } = await client.send(
      new CreateMultipartUploadCommand({ Bucket: store.bucket, Key: key, ContentType: 'video/mp4' }),
    );
    const part = await storage.presignPart({
      key,
      uploadId: UploadId!,
      partNumber: 1,
      sizeBytes: 10,
      expiresInS: 60,
    });
    const short = await fetch(part.url, { method: 'PUT', headers: part.headers, body: 'x'.repeat(9) });
    expect(short.status).toBe(403);
    expect(await errorCode(short)).toBe('SignatureDoesNotMatch');
    const stored = await fetch(part.url, { method: 'PUT', headers: part.headers, body: 'x'.repeat(10) });
    expect(stored.status).toBe(200);
    expect(stored.headers.get('etag')).toMatch(/^"[0-9a-f]{32}"$/);
  });

  it('a GET URL serves the object with the signed disposition and type; a changed one is 403', async () => {
    const key = 'sites/s1/media/d1.png';
    await client.send(
      new PutObjectCommand({ Bucket: store.bucket, Key: key, Body: 'abc', ContentType: 'image/png' }),
    );
    const disposition = contentDisposition('Report "Q4" ü.png');
    const signed = await storage.presignDownload({
      key,
      contentDisposition: disposition,
      contentType: 'image/png',
      expiresInS: 60,
    });
    const got = await fetch(signed.url);
    expect(got.status).toBe(200);
    expect(got.headers.get('content-disposition')).toBe(disposition);
    expect(got.headers.get('content-type')).toBe('image/png');
    expect(await got.text()).toBe('abc');
    const tampered = await fetch(
      signed.url.replace('response-content-type=image%2Fpng', 'response-content-type=text%2Fhtml'),
    );
    expect(tampered.status).toBe(403);
  });
});
