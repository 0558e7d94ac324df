import {
  decodeEventObjectKey,
  isObjectCreatedEventName,
  validateObjectCreatedEvent,
  type ObjectCreatedEvent,
} from '@platform/contracts';
import { pathsOf } from './helpers.js';

// Shaped after MinIO's webhook body (event.Log: EventName, Key, Records with one event.Event) with the
// extra fields MinIO sends; the values are made up.
function minioBody(objectOverrides: Record<string, unknown> = {}, eventName = 's3:ObjectCreated:Put') {
  return {
    EventName: eventName,
    Key: 'media/sites/2f0c/media/7d1e photo.jpg',
    Records: [
      {
        eventVersion: '2.0',
        eventSource: 'minio:s3',
        awsRegion: '',
        eventTime: '2025-06-01T10:00:00.000Z',
        eventName,
        userIdentity: { principalId: 'minioadmin' },
        requestParameters: { principalId: 'minioadmin', region: '', sourceIPAddress: '172.18.0.1' },
        responseElements: {
          'x-amz-request-id': '1842A6B3C1D2E3F4',
          'x-minio-origin-endpoint': 'http://minio:9000',
        },
        s3: {
          s3SchemaVersion: '1.0',
          configurationId: 'Config',
          bucket: { name: 'media', ownerIdentity: { principalId: 'minioadmin' }, arn: 'arn:aws:s3:::media' },
          object: {
            key: 'sites%2F2f0c%2Fmedia%2F7d1e+photo.jpg',
            size: 524288,
            eTag: 'd41d8cd98f00b204e9800998ecf8427e',
            contentType: 'image/jpeg',
            userMetadata: { 'content-type': 'image/jpeg' },
            sequencer: '1842A6B3C1D2E3F5',
            ...objectOverrides,
          },
        },
        source: { host: '172.18.0.1', port: '', userAgent: 'MinIO (linux; amd64) minio-go/v7.0.70' },
      },
    ],
  };
}

// Shaped after s3rver's S3Event (plain notification, eventName without the "s3:" prefix, raw key).
const s3rverBody = {
  Records: [
    {
      eventVersion: '2.0',
      eventSource: 'aws:s3',
      awsRegion: 'us-east-1',
      eventTime: '2025-06-01T10:00:00.000Z',
      eventName: 'ObjectCreated:Put',
      userIdentity: { principalId: 'AWS:ABCDEF' },
      requestParameters: { sourceIPAddress: '127.0.0.1' },
      responseElements: { 'x-amz-request-id': 'ABC', 'x-amz-id-2': 'xyz=' },
      s3: {
        s3SchemaVersion: '1.0',
        configurationId: 'testConfigId',
        bucket: { name: 'media', ownerIdentity: { principalId: 'ABC' }, arn: 'arn:aws:s3: : :media' },
        object: { key: 'sites/2f0c/media/7d1e', sequencer: '1972B3C4D5E', size: 10, eTag: 'abc123' },
      },
    },
  ],
};

describe('object-created event bodies', () => {
  it('accepts a MinIO webhook body with all its extra fields, unchanged', () => {
    const body = minioBody();
    const result = validateObjectCreatedEvent(body);
    expect(result).toEqual({ ok: true, value: body });
    const value: ObjectCreatedEvent | undefined = result.ok ? result.value : undefined;
    expect(value?.Records[0]?.s3.object.size).toBe(524288);
  });

  it('accepts a plain S3 notification (s3rver)', () => {
    expect(validateObjectCreatedEvent(s3rverBody).ok).toBe(true);
  });

  it('accepts records that lack size or eTag (MinIO omits zero sizes; removals carry neither)', () => {
    const body = minioBody();
    const object: Record<string, unknown> = body.Records[0]!.s3.object;
    delete object.size;
    delete object.eTag;
    expect(validateObjectCreatedEvent(body).ok).toBe(true);
    expect(validateObjectCreatedEvent({ ...body, EventName: 's3:ObjectRemoved:Delete' }).ok).toBe(true);
  });

  it('accepts several records (AWS may batch)', () => {
    expect(validateObjectCreatedEvent({ Records: [...s3rverBody.Records, ...minioBody().Records] }).ok).toBe(
      true,
    );
  });

  it.each([
    [{ size: -1 }, '/Records/0/s3/object/size'],
    [{ size: 1.5 }, '/Records/0/s3/object/size'],
    [{ size: '524288' }, '/Records/0/s3/object/size'],
    [{ eTag: 42 }, '/Records/0/s3/object/eTag'],
    [{ contentType: null }, '/Records/0/s3/object/contentType'],
    [{ key: '' }, '/Records/0/s3/object/key'],
    [{ key: undefined }, '/Records/0/s3/object/key'],
  ])('is strict on the fields the workflow reads: %j at %s', (override, path) => {
    expect(pathsOf(validateObjectCreatedEvent(JSON.parse(JSON.stringify(minioBody(override)))))).toEqual([
      path,
    ]);
  });

  it.each([
    [{}, '/Records'],
    [{ Records: [] }, '/Records'],
    [{ Records: {} }, '/Records'],
    [{ Records: [{ s3: s3rverBody.Records[0]!.s3 }] }, '/Records/0/eventName'],
    [{ Records: [{ eventName: 'ObjectCreated:Put' }] }, '/Records/0/s3'],
    [{ Records: [{ eventName: 'ObjectCreated:Put', s3: { object: { key: 'k' } } }] }, '/Records/0/s3/bucket'],
    [
      { Records: [{ eventName: 'ObjectCreated:Put', s3: { bucket: { name: '' }, object: { key: 'k' } } }] },
      '/Records/0/s3/bucket/name',
    ],
    [{ EventName: 7, Records: s3rverBody.Records }, '/EventName'],
    [{ Key: null, Records: s3rverBody.Records }, '/Key'],
  ])('rejects %j at %s', (body, path) => {
    expect(pathsOf(validateObjectCreatedEvent(body))).toEqual([path]);
  });

  it('rejects non-object bodies', () => {
    expect(pathsOf(validateObjectCreatedEvent([s3rverBody]))).toEqual(['']);
    expect(pathsOf(validateObjectCreatedEvent('{}'))).toEqual(['']);
  });
});

describe('event helpers', () => {
  it.each([
    ['s3:ObjectCreated:Put', true],
    ['s3:ObjectCreated:CompleteMultipartUpload', true],
    ['ObjectCreated:Copy', true],
    ['s3:ObjectRemoved:Delete', false],
    ['ObjectRemoved:Delete', false],
    ['s3:ObjectAccessed:Get', false],
    ['xObjectCreated:Put', false],
  ])('%s is object-created: %s', (name, expected) => {
    expect(isObjectCreatedEventName(name)).toBe(expected);
  });

  it.each([
    ['sites%2F2f0c%2Fmedia%2F7d1e+photo.jpg', 'sites/2f0c/media/7d1e photo.jpg'],
    ['sites/2f0c/media/7d1e', 'sites/2f0c/media/7d1e'],
    ['caf%C3%A9.jpg', 'café.jpg'],
    ['100%25+sure', '100% sure'],
    ['bad%E0%A4%A', 'bad%E0%A4%A'],
  ])('decodes the record key %j', (key, decoded) => {
    expect(decodeEventObjectKey(key)).toBe(decoded);
  });

  it('agrees with the decoded Key of MinIO bodies', () => {
    const body = minioBody();
    expect(`${body.Records[0]!.s3.bucket.name}/${decodeEventObjectKey(body.Records[0]!.s3.object.key)}`).toBe(
      body.Key,
    );
  });
});
