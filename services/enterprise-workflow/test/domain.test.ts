// Transport-free rules: decisions, intents and event records.
import { validateDecisionRequest, validateUploadIntentRequest } from '@platform/contracts';
import { checkDecisionRequest, decide } from '../src/domain/decision-rules.js';
import { checkIntent, contentDisposition, newObjectKey, normaliseEtag } from '../src/domain/media-rules.js';
import { readRecord } from '../src/domain/object-event-records.js';

describe('decide', () => {
  it.each([
    ['proposed', 'accept', { kind: 'transition', state: 'accepted' }],
    ['proposed', 'defer', { kind: 'transition', state: 'deferred' }],
    ['proposed', 'decline', { kind: 'transition', state: 'declined' }],
    ['deferred', 'defer', { kind: 'transition', state: 'deferred' }],
    ['deferred', 'accept', { kind: 'transition', state: 'accepted' }],
    ['deferred', 'decline', { kind: 'transition', state: 'declined' }],
    ['accepted', 'accept', { kind: 'unchanged' }],
    ['declined', 'decline', { kind: 'unchanged' }],
  ] as const)('%s + %s', (state, decision, outcome) => {
    expect(decide(state, decision)).toEqual(outcome);
  });

  it.each([
    ['accepted', 'decline'],
    ['accepted', 'defer'],
    ['declined', 'accept'],
    ['declined', 'defer'],
  ] as const)('%s + %s is a conflict', (state, decision) => {
    expect(decide(state, decision).kind).toBe('conflict');
  });
});

describe('checkDecisionRequest', () => {
  const now = new Date('2026-11-22T10:00:00Z');
  it('requires defer_until to lie in the future', () => {
    expect(checkDecisionRequest({ defer_until: '2026-12-01T00:00:00Z' }, now)).toEqual([]);
    expect(checkDecisionRequest({ defer_until: '2026-11-22T09:59:59Z' }, now)).toEqual([
      { path: '/defer_until', message: 'must be in the future' },
    ]);
    expect(checkDecisionRequest({ defer_until: '2026-11-22T10:00:00Z' }, now)).toHaveLength(1);
    expect(checkDecisionRequest({}, now)).toEqual([]);
  });

  it('leaves presence to the schema: required for defer, refused with the other decisions', () => {
    const paths = (body: unknown) => {
      const result = validateDecisionRequest(body);
      return result.ok ? [] : result.errors.map((e) => e.path);
    };
    expect(paths({ decision: 'defer' })).toContain('/defer_until');
    expect(paths({ decision: 'accept', defer_until: '2026-12-01T00:00:00Z' })).toContain('/defer_until');
    expect(paths({ decision: 'defer', defer_until: 'next week' })).toContain('/defer_until');
    expect(paths({ decision: 'decline' })).toEqual([]);
  });
});

describe('media rules', () => {
  const limits = { maxImageBytes: 100, maxVideoBytes: 1000 };

  it('allows listed types within the kind limit', () => {
    expect(checkIntent({ content_type: 'image/png', size_bytes: 100 }, limits)).toEqual([]);
    expect(checkIntent({ content_type: 'video/mp4', size_bytes: 1000 }, limits)).toEqual([]);
    expect(checkIntent({ content_type: 'image/png', size_bytes: 101 }, limits)).toEqual([
      { path: '/size_bytes', message: 'must be at most 100 bytes for an image' },
    ]);
    expect(checkIntent({ content_type: 'video/quicktime', size_bytes: 1001 }, limits)).toEqual([
      { path: '/size_bytes', message: 'must be at most 1000 bytes for a video' },
    ]);
  });

  it('leaves the allowed list to the schema: exact lower-case types only', () => {
    for (const content_type of ['text/html', 'IMAGE/PNG', 'toString', 'image/gif']) {
      const result = validateUploadIntentRequest({ filename: 'a', content_type, size_bytes: 1 });
      expect(result.ok ? [] : result.errors.map((e) => e.path)).toEqual(['/content_type']);
    }
  });

  it('generates keys from ids only', () => {
    const key = newObjectKey('11111111-1111-4111-8111-111111111111', 'video/quicktime');
    expect(key).toMatch(/^sites\/11111111-1111-4111-8111-111111111111\/media\/[0-9a-f-]{36}\.mov$/);
    expect(newObjectKey('s', 'image/png')).not.toBe(newObjectKey('s', 'image/png'));
  });

  it('makes filenames safe for Content-Disposition', () => {
    expect(contentDisposition('report.pdf')).toBe(
      `attachment; filename="report.pdf"; filename*=UTF-8''report.pdf`,
    );
    expect(contentDisposition('a\r\nSet-Cookie: x=1.png')).toBe(
      `attachment; filename="aSet-Cookie: x=1.png"; filename*=UTF-8''aSet-Cookie%3A%20x%3D1.png`,
    );
    expect(contentDisposition('C:\\temp\\')).toBe(
      `attachment; filename="download"; filename*=UTF-8''download`,
    );
  });

  it('normalises ETags', () => {
    expect(normaliseEtag('"abc"')).toBe('abc');
    expect(normaliseEtag('W/"abc"')).toBe('abc');
    expect(normaliseEtag('abc-3')).toBe('abc-3');
    expect(normaliseEtag('""')).toBeUndefined();
  });
});

describe('object-created records', () => {
  it('decodes keys the way S3 encodes them', () => {
    const keyed = (key: string) => ({
      eventName: 'ObjectCreated:Put',
      s3: { bucket: { name: 'b' }, object: { key } },
    });
    const keyOf = (key: string) => {
      const reading = readRecord(keyed(key));
      return reading.kind === 'created' ? reading.event.key : undefined;
    };
    expect(keyOf('sites%2Fa%2Fmy+photo%2B1.jpg')).toBe('sites/a/my photo+1.jpg');
    expect(keyOf('plain/key.png')).toBe('plain/key.png');
  });

  it('reads MinIO and S3 event names alike and ignores other events', () => {
    const record = (eventName: string) => ({
      eventName,
      s3: { bucket: { name: 'media' }, object: { key: 'a+b', size: 3, eTag: 'e', contentType: '' } },
    });
    expect(readRecord(record('s3:ObjectCreated:Put'))).toEqual({
      kind: 'created',
      event: { bucket: 'media', key: 'a b', sizeBytes: 3, etag: 'e', contentType: undefined },
    });
    expect(readRecord(record('ObjectCreated:CompleteMultipartUpload')).kind).toBe('created');
    expect(readRecord(record('s3:ObjectRemoved:Delete')).kind).toBe('ignored');
  });
});
