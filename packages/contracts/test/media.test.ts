import { createHash } from 'node:crypto';
import {
  mediaContentTypes,
  mediaKindOf,
  validateDownloadResponse,
  validateUploadIntentRequest,
  validateUploadIntentResponse,
} from '@platform/contracts';
import { errorsOf, pathsOf } from './helpers.js';

const checksum = createHash('sha256').update('hello').digest('base64');
const uuid = '0b9c6f3e-5d1a-4c8e-9f2b-7a6d5e4c3b2a';

describe('upload-intent request', () => {
  const minimal = { filename: 'boiler room.jpg', content_type: 'image/jpeg', size_bytes: 1 };

  it('accepts a minimal and a complete request', () => {
    expect(validateUploadIntentRequest(minimal)).toEqual({ ok: true, value: minimal });
    const complete = {
      ...minimal,
      size_bytes: 2 * 1024 ** 3,
      checksum_sha256: checksum,
      walkthrough_id: uuid,
      work_item_id: uuid.toUpperCase(),
      asset_id: uuid,
    };
    expect(validateUploadIntentRequest(complete).ok).toBe(true);
  });

  it.each(mediaContentTypes)('accepts the content type %s', (contentType) => {
    expect(validateUploadIntentRequest({ ...minimal, content_type: contentType }).ok).toBe(true);
  });

  it('classifies content types into kinds (per-kind limits are service config)', () => {
    expect(mediaKindOf('image/heic')).toBe('image');
    expect(mediaKindOf('video/quicktime')).toBe('video');
  });

  it.each(['image/gif', 'IMAGE/JPEG', 'image/jpeg; charset=binary', 'application/octet-stream', ''])(
    'rejects the content type %j',
    (contentType) => {
      expect(pathsOf(validateUploadIntentRequest({ ...minimal, content_type: contentType }))).toEqual([
        '/content_type',
      ]);
    },
  );

  it.each(['photo.jpg', 'Ünïcødé 写真.heic', '.hidden', '..jpg', 'a'.repeat(255), '😀'.repeat(255)])(
    'accepts the file name %j',
    (filename) => {
      expect(validateUploadIntentRequest({ ...minimal, filename }).ok).toBe(true);
    },
  );

  it.each([
    '',
    '.',
    '..',
    'dir/photo.jpg',
    '../../etc/passwd',
    'C:\\photo.jpg',
    'photo\u0000.jpg',
    'line\nbreak.jpg',
    'tab\t.jpg',
    'del\u007f.jpg',
    'c1\u0085.jpg',
    'gpj.exe\u202e',
    'a'.repeat(256),
    42,
  ])('rejects the file name %j at /filename', (filename) => {
    expect(pathsOf(validateUploadIntentRequest({ ...minimal, filename }))).toEqual(['/filename']);
  });

  it.each([0, -1, 1.5, '10', 2 ** 53, null])('rejects size_bytes %j', (size) => {
    expect(pathsOf(validateUploadIntentRequest({ ...minimal, size_bytes: size }))).toContain('/size_bytes');
  });

  it.each([
    createHash('sha256').update('x').digest('hex'),
    checksum.slice(0, -1),
    checksum.replace('=', ''),
    `${checksum}=`,
    createHash('sha1').update('x').digest('base64'),
    createHash('sha256').update('x').digest('base64url'),
    // 44 characters with "=" whose last data character has non-zero padding bits.
    `${'A'.repeat(42)}B=`,
  ])('rejects the checksum %j', (value) => {
    expect(errorsOf(validateUploadIntentRequest({ ...minimal, checksum_sha256: value }))).toEqual([
      { path: '/checksum_sha256', message: 'must be the base64 encoding of a 32-byte SHA-256 digest' },
    ]);
  });

  it('accepts the base64 of any 32-byte digest', () => {
    for (let i = 0; i < 200; i += 1) {
      const value = createHash('sha256').update(String(i)).digest('base64');
      expect(validateUploadIntentRequest({ ...minimal, checksum_sha256: value }).ok).toBe(true);
    }
  });

  it.each(['walkthrough_id', 'work_item_id', 'asset_id'])('requires %s to be a UUID', (field) => {
    for (const bad of ['not-a-uuid', `urn:uuid:${uuid}`, `{${uuid}}`, uuid.replace(/-/g, ''), null]) {
      expect(errorsOf(validateUploadIntentRequest({ ...minimal, [field]: bad }))[0]?.path).toBe(`/${field}`);
    }
  });

  it('names missing and unknown members', () => {
    expect(errorsOf(validateUploadIntentRequest({ key: 'sites/x/evil' }))).toEqual([
      { path: '/filename', message: 'is required' },
      { path: '/content_type', message: 'is required' },
      { path: '/size_bytes', message: 'is required' },
      { path: '/key', message: 'is not an allowed property' },
    ]);
  });
});

describe('upload-intent response', () => {
  const response = {
    media_id: uuid,
    status: 'pending_upload',
    upload: {
      method: 'PUT',
      url: 'http://localhost:9000/media/sites/x/media/y?X-Amz-Signature=abc',
      headers: { 'content-type': 'image/jpeg' },
      expires_at: '2025-06-01T12:15:00.000Z',
    },
  };

  it('accepts the documented shape', () => {
    expect(validateUploadIntentResponse(response).ok).toBe(true);
  });

  it.each([
    [{ status: 'available' }, '/status'],
    [{ media_id: 'm1' }, '/media_id'],
    [{ upload: { ...response.upload, method: 'POST' } }, '/upload/method'],
    [{ upload: { ...response.upload, url: 'not a url' } }, '/upload/url'],
    [{ upload: { ...response.upload, headers: { 'content-length': 5 } } }, '/upload/headers/content-length'],
    [{ upload: { ...response.upload, expires_at: 'tomorrow' } }, '/upload/expires_at'],
  ])('rejects %j at %s', (change, path) => {
    expect(pathsOf(validateUploadIntentResponse({ ...response, ...change }))).toEqual([path]);
  });

  const plan = {
    upload_id: 'VXBsb2Fk',
    part_size_bytes: 16777216,
    part_count: 10,
    expires_at: '2025-06-02T12:00:00.000Z',
  };

  it('accepts a plan of parts instead of the upload URL (design §4.4)', () => {
    const { upload: _upload, ...rest } = response;
    expect(validateUploadIntentResponse({ ...rest, multipart: plan }).ok).toBe(true);
    expect(
      pathsOf(validateUploadIntentResponse({ ...rest, multipart: { ...plan, part_count: 10001 } })),
    ).toEqual(['/multipart/part_count']);
  });

  it('wants exactly one of upload and multipart', () => {
    const { upload: _upload, ...neither } = response;
    expect(validateUploadIntentResponse(neither).ok).toBe(false);
    expect(validateUploadIntentResponse({ ...response, multipart: plan }).ok).toBe(false);
  });
});

describe('download response', () => {
  const response = {
    media_id: uuid,
    url: 'https://s3.example.com/media/k?X-Amz-Signature=abc',
    expires_at: '2025-06-01T12:15:00+02:00',
    content_type: 'video/mp4',
    size_bytes: 1048576,
    filename: 'walkthrough.mp4',
  };

  it('accepts the documented shape', () => {
    expect(validateDownloadResponse(response).ok).toBe(true);
  });

  it('requires every member and nothing else', () => {
    expect(pathsOf(validateDownloadResponse({})).sort()).toEqual(
      ['/content_type', '/expires_at', '/filename', '/media_id', '/size_bytes', '/url'].sort(),
    );
    expect(pathsOf(validateDownloadResponse({ ...response, key: 'sites/x' }))).toEqual(['/key']);
  });
});
