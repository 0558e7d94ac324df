// Text PostgreSQL cannot store (U+0000, an unpaired surrogate) in any text field of any body: 400 naming the
// field's JSON Pointer, nothing written — never a 500 from inside a transaction (design §6).
import { demoRowId, demoSites } from '@platform/enterprise-db';
import request from 'supertest';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
let bob: string;

beforeAll(async () => {
  h = await startHarness();
  bob = await h.issuer.demoToken('bob');
});
afterAll(async () => {
  await h.close();
});

const hq = demoSites.acmeHq.id;
const BAD = [
  ['NUL', 'a\u0000b'],
  ['a lone high surrogate', 'a\ud800b'],
  ['a lone low surrogate', 'a\udc00b'],
  ['a high surrogate at the end', 'ab\udbff'],
] as const;

const intentBody = {
  filename: 'boiler room.jpg',
  content_type: 'image/jpeg',
  size_bytes: 900,
  checksum_sha256: 'n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=',
  walkthrough_id: demoRowId('walkthrough', 'acmeHq', 1),
  work_item_id: demoRowId('work_item', 'acmeHq', 1),
  asset_id: demoRowId('asset', 'acmeHq', 1),
};
const decisionBody = { decision: 'defer', note: 'next quarter', defer_until: '2030-01-01T00:00:00Z' };
const webhookBody = {
  EventName: 's3:ObjectCreated:Put',
  Key: `media/sites/${hq}/media/${demoRowId('media_item', 'acmeHq', 1)}.jpg`,
  Records: [{ eventName: 'ObjectCreated:Put', s3: { object: { key: 'x', size: 1 } } }],
};

type Send = (body: object) => request.Test;
const endpoints: Array<[string, Send, object, string[]]> = [
  [
    'upload intent',
    (body) =>
      request(h.app)
        .post(`/sites/${hq}/media/upload-intents`)
        .set('Authorization', `Bearer ${bob}`)
        .send(body),
    intentBody,
    ['filename', 'content_type', 'checksum_sha256', 'walkthrough_id', 'work_item_id', 'asset_id'],
  ],
  [
    'decision',
    (body) =>
      request(h.app)
        .post(`/sites/${hq}/work-items/${demoRowId('work_item', 'acmeHq', 2)}/decision`)
        .set('Authorization', `Bearer ${bob}`)
        .send(body),
    decisionBody,
    ['decision', 'note', 'defer_until'],
  ],
  [
    'object-created webhook',
    (body) =>
      request(h.app)
        .post('/internal/media/object-created')
        .set('Authorization', `Bearer ${WEBHOOK_TOKENS[0]!}`)
        .send(body),
    webhookBody,
    ['EventName', 'Key'],
  ],
];

describe.each(endpoints)('%s', (_name, send, body, fields) => {
  const cases = fields.flatMap((field) => BAD.map(([what, value]) => [field, what, value] as const));
  it.each(cases)('%s with %s → 400 naming the field', async (field, _what, value) => {
    const res = await send({ ...body, [field]: value });
    expect(res.status).toBe(400);
    expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(res.body).toMatchObject({ code: 'invalid_body', errors: [{ path: `/${field}` }] });
  });

  it('a nested string and a key are named by their JSON Pointer (RFC 6901 escaping)', async () => {
    const res = await send({ ...body, 'x/y~\u0000': { list: ['ok', 'bad\ud800'] } });
    expect(res.status).toBe(400);
    expect(res.body.errors).toEqual([
      { path: '/x~1y~0\u0000', message: expect.any(String) },
      { path: '/x~1y~0\u0000/list/1', message: expect.any(String) },
    ]);
  });
});

it('the webhook record fields are checked too (a key inside Records)', async () => {
  const res = await request(h.app)
    .post('/internal/media/object-created')
    .set('Authorization', `Bearer ${WEBHOOK_TOKENS[0]!}`)
    .send({ Records: [{ eventName: 'ObjectCreated:Put', s3: { object: { key: 'a\u0000', size: 1 } } }] });
  expect(res.status).toBe(400);
  expect(res.body.errors).toEqual([{ path: '/Records/0/s3/object/key', message: expect.any(String) }]);
});

it('nothing is written: the decision note with NUL leaves the item and its audit untouched', async () => {
  const itemId = demoRowId('work_item', 'acmeHq', 3);
  const before = await h.admin
    .selectFrom('enterprise.work_item_decisions')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .where('work_item_id', '=', itemId)
    .executeTakeFirstOrThrow();
  const res = await request(h.app)
    .post(`/sites/${hq}/work-items/${itemId}/decision`)
    .set('Authorization', `Bearer ${bob}`)
    .send({ decision: 'accept', note: 'fine\u0000' });
  expect(res.status).toBe(400);
  const after = await h.admin
    .selectFrom('enterprise.work_item_decisions')
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .where('work_item_id', '=', itemId)
    .executeTakeFirstOrThrow();
  expect(after.n).toBe(before.n);
});
