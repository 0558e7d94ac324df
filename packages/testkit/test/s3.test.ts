import { createHash } from 'node:crypto';
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CreateMultipartUploadCommand,
  GetObjectCommand,
  ListPartsCommand,
  PutObjectCommand,
  S3Client,
  UploadPartCommand,
} from '@aws-sdk/client-s3';
import { decodeEventObjectKey, validateObjectCreatedEvent } from '@platform/contracts';
import { startS3 } from '@platform/testkit';
import type { S3EventRecord, S3Server } from '@platform/testkit';

describe('startS3', () => {
  let s3: S3Server;
  let client: S3Client;
  const delivered: S3EventRecord[] = [];

  beforeAll(async () => {
    s3 = await startS3({
      bucket: 'media-test',
      corsOrigins: ['http://portal.test'],
      onObjectCreated: (record) => {
        delivered.push(record);
      },
    });
    client = new S3Client({
      endpoint: s3.endpoint,
      region: s3.region,
      forcePathStyle: true,
      credentials: { accessKeyId: s3.accessKeyId, secretAccessKey: s3.secretAccessKey },
    });
  });
  afterAll(async () => {
    client.destroy();
    await s3.stop();
  });

  it('stores an object uploaded with the AWS SDK and reports an S3 ObjectCreated record', async () => {
    const key = 'site 1/photo ü.jpg';
    const body = Buffer.from('not really a jpeg, 34 bytes long!!');
    await client.send(
      new PutObjectCommand({ Bucket: s3.bucket, Key: key, Body: body, ContentType: 'image/jpeg' }),
    );

    const stored = await client.send(new GetObjectCommand({ Bucket: s3.bucket, Key: key }));
    expect(Buffer.from(await stored.Body!.transformToByteArray())).toEqual(body);

    const record = await s3.waitForObjectCreated(key);
    expect(record.eventName).toBe('ObjectCreated:Put');
    expect(record.s3.bucket.name).toBe('media-test');
    expect(record.s3.object.key).toBe('site+1/photo+%C3%BC.jpg');
    expect(decodeEventObjectKey(record.s3.object.key)).toBe(key);
    expect(record.s3.object.size).toBe(body.length);
    expect(record.s3.object.eTag).toBe(createHash('md5').update(body).digest('hex'));
    expect(record.s3.object.contentType).toBe('image/jpeg');
    // The workflow webhook's contract accepts it as a plain S3 event body.
    expect(validateObjectCreatedEvent({ Records: [record] }).ok).toBe(true);
    expect(delivered).toContain(record);
  });

  it('lists the parts of a multipart upload, completes it as CompleteMultipartUpload, and aborts another', async () => {
    const key = 'uploads/walk.mp4';
    const { UploadId } = await client.send(
      new CreateMultipartUploadCommand({ Bucket: s3.bucket, Key: key, ContentType: 'video/mp4' }),
    );
    const first = Buffer.alloc(5 * 1024 * 1024, 1);
    const second = Buffer.from('the rest');
    const etags: string[] = [];
    for (const [i, body] of [first, second].entries()) {
      const out = await client.send(
        new UploadPartCommand({ Bucket: s3.bucket, Key: key, UploadId, PartNumber: i + 1, Body: body }),
      );
      etags.push(out.ETag ?? '');
    }
    const listed = await client.send(new ListPartsCommand({ Bucket: s3.bucket, Key: key, UploadId }));
    expect(listed.Parts?.map((p) => [p.PartNumber, p.Size, p.ETag])).toEqual([
      [1, first.length, etags[0]],
      [2, second.length, etags[1]],
    ]);
    expect(
      s3.requests.filter((r) => r.method === 'PUT' && r.uploadId === UploadId).map((r) => r.partNumber),
    ).toEqual([1, 2]);
    await client.send(
      new CompleteMultipartUploadCommand({
        Bucket: s3.bucket,
        Key: key,
        UploadId,
        MultipartUpload: { Parts: etags.map((ETag, i) => ({ ETag, PartNumber: i + 1 })) },
      }),
    );
    const record = await s3.waitForObjectCreated(key);
    expect(record.eventName).toBe('ObjectCreated:CompleteMultipartUpload');
    expect(record.s3.object.size).toBe(first.length + second.length);
    // Gone once completed: listing it is NoSuchUpload, as on S3.
    await expect(
      client.send(new ListPartsCommand({ Bucket: s3.bucket, Key: key, UploadId })),
    ).rejects.toMatchObject({ name: 'NoSuchUpload' });

    const other = await client.send(
      new CreateMultipartUploadCommand({ Bucket: s3.bucket, Key: 'uploads/b.mp4' }),
    );
    await client.send(
      new AbortMultipartUploadCommand({ Bucket: s3.bucket, Key: 'uploads/b.mp4', UploadId: other.UploadId }),
    );
    await expect(
      client.send(
        new UploadPartCommand({
          Bucket: s3.bucket,
          Key: 'uploads/b.mp4',
          UploadId: other.UploadId,
          PartNumber: 1,
          Body: second,
        }),
      ),
    ).rejects.toMatchObject({ name: 'NoSuchUpload' });
  });

  it('answers a browser preflight for the configured origin only, and exposes ETag', async () => {
    const preflight = (origin: string) =>
      fetch(`${s3.endpoint}/${s3.bucket}/x.jpg`, {
        method: 'OPTIONS',
        headers: {
          Origin: origin,
          'Access-Control-Request-Method': 'PUT',
          'Access-Control-Request-Headers': 'content-type',
        },
      });
    expect((await preflight('http://portal.test')).status).toBe(200);
    expect((await preflight('http://elsewhere.test')).status).toBe(403);
    const put = await fetch(`${s3.endpoint}/${s3.bucket}/x.jpg`, {
      method: 'PUT',
      headers: { Origin: 'http://portal.test', 'Content-Type': 'image/jpeg' },
      body: 'x',
    });
    expect(put.headers.get('access-control-allow-origin')).toBe('http://portal.test');
    expect(put.headers.get('access-control-expose-headers')).toBe('ETag');
  });

  it('times out waiting for an object nobody uploaded', async () => {
    await expect(s3.waitForObjectCreated('never-uploaded', 100)).rejects.toThrow(/never-uploaded/);
  });
});
