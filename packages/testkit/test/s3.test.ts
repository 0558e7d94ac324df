import { createHash } from 'node:crypto';
import { GetObjectCommand, PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
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

  it('times out waiting for an object nobody uploaded', async () => {
    await expect(s3.waitForObjectCreated('never-uploaded', 100)).rejects.toThrow(/never-uploaded/);
  });
});
