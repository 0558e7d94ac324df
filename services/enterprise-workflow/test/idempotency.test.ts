// Idempotency-Key on decisions (design §4.4): what counts as the same request, where the replay window
// ends, and a key's first use racing on two items. The app's clock is the harness's `now`, so the
// lifetime boundary is hit to the millisecond without sleeping; JWTs are still checked on real time.
import { demoSites } from '@platform/enterprise-db';
import { sql } from 'kysely';
import request from 'supertest';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

/** The harness's idempotencyTtlS (86,400 s), in milliseconds. */
const LIFETIME_MS = 86_400_000;
const DAY_MS = 86_400_000;

let h: Harness;
let bob: string;
/** The app's clock, in ms since the epoch; tests move it forward. */
let clockMs = Date.now();

beforeAll(async () => {
  h = await startHarness({ now: () => new Date(clockMs) });
  bob = await h.issuer.demoToken('bob');
});
afterAll(async () => {
  await h.close();
});
beforeEach(() => {
  clockMs = Date.now();
});

const hq = demoSites.acmeHq.id;

function decide(itemId: string, body: object, key: string) {
  return request(h.app)
    .post(`/sites/${hq}/work-items/${itemId}/decision`)
    .set('Authorization', `Bearer ${bob}`)
    .set('Idempotency-Key', key)
    .send(body);
}

/** A fresh proposed item at headquarters, so no test depends on another's decisions. */
async function proposedItem(): Promise<string> {
  const row = await h.admin
    .insertInto('enterprise.work_items')
    .values({ site_id: hq, title: 'Check pump', severity: 'low' })
    .returning('id')
    .executeTakeFirstOrThrow();
  return row.id;
}

async function auditOf(itemId: string) {
  return h.admin
    .selectFrom('enterprise.work_item_decisions')
    .select(['decision', 'new_state'])
    .where('work_item_id', '=', itemId)
    .orderBy('id')
    .execute();
}

async function stateOf(itemId: string): Promise<string> {
  const row = await h.admin
    .selectFrom('enterprise.work_items')
    .select('state')
    .where('id', '=', itemId)
    .executeTakeFirstOrThrow();
  return row.state;
}

describe('Idempotency-Key on decisions', () => {
  it('replays up to exactly its lifetime (24 h) and treats the key as new one millisecond later', async () => {
    const itemId = await proposedItem();
    const body = { decision: 'defer', defer_until: new Date(clockMs + 7 * DAY_MS).toISOString() };
    const start = clockMs;
    const first = await decide(itemId, body, 'window');
    expect(first.status).toBe(200);

    clockMs = start + LIFETIME_MS;
    const last = await decide(itemId, body, 'window');
    expect(last.status).toBe(200);
    expect(last.headers['idempotent-replayed']).toBe('true');
    expect(last.body).toEqual(first.body);
    expect(await auditOf(itemId)).toHaveLength(1);

    // Past the window the same body is a new request: a deferred item may be deferred again, so it is
    // decided a second time and stored under the key with the new time.
    clockMs = start + LIFETIME_MS + 1;
    const renewed = await decide(itemId, body, 'window');
    expect(renewed.status).toBe(200);
    expect(renewed.headers['idempotent-replayed']).toBeUndefined();
    expect(renewed.body.decided_at).toBe(new Date(clockMs).toISOString());
    expect(await auditOf(itemId)).toEqual([
      { decision: 'defer', new_state: 'deferred' },
      { decision: 'defer', new_state: 'deferred' },
    ]);
    const stored = await h.admin
      .selectFrom('enterprise.decision_idempotency_keys')
      .select('created_at')
      .where('idempotency_key', '=', 'window')
      .executeTakeFirstOrThrow();
    expect(stored.created_at.getTime()).toBe(clockMs);
  });

  it('refuses a key reused for another item with 409 and leaves that item untouched', async () => {
    const [first, other] = [await proposedItem(), await proposedItem()];
    const accepted = await decide(first, { decision: 'accept' }, 'one-item-only');
    expect(accepted.status).toBe(200);

    const reused = await decide(other, { decision: 'accept' }, 'one-item-only');
    expect(reused.status).toBe(409);
    expect(reused.headers['content-type']).toMatch(/^application\/problem\+json/);
    expect(reused.body).toMatchObject({ status: 409, code: 'idempotency_key_reused' });
    expect(await stateOf(other)).toBe('proposed');
    expect(await auditOf(other)).toEqual([]);

    // The key still belongs to its first item, and an unknown item is 404 before any key is looked at.
    const retry = await decide(first, { decision: 'accept' }, 'one-item-only');
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body).toEqual(accepted.body);
    const unknown = await decide(
      '00000000-0000-4000-8000-000000000000',
      { decision: 'accept' },
      'one-item-only',
    );
    expect(unknown.status).toBe(404);
  });

  it('compares the meaning of the body: another note conflicts, field order and date notation do not', async () => {
    const itemId = await proposedItem();
    // One instant, written in UTC and at +02:00 with milliseconds.
    const utc = new Date(clockMs + 3 * DAY_MS);
    utc.setUTCMilliseconds(0);
    const inUtc = utc.toISOString().replace('.000Z', 'Z');
    const local = new Date(utc.getTime() + 2 * 3600_000).toISOString().replace('Z', '+02:00');
    const first = await decide(
      itemId,
      { decision: 'defer', note: 'After the audit', defer_until: inUtc },
      'meaning',
    );
    expect(first.status).toBe(200);

    const reordered = await decide(
      itemId,
      { defer_until: local, note: 'After the audit', decision: 'defer' },
      'meaning',
    );
    expect(reordered.status).toBe(200);
    expect(reordered.headers['idempotent-replayed']).toBe('true');
    expect(reordered.body).toEqual(first.body);

    const otherNote = await decide(
      itemId,
      { decision: 'defer', note: 'After audit', defer_until: inUtc },
      'meaning',
    );
    expect(otherNote.status).toBe(409);
    const noNote = await decide(itemId, { decision: 'defer', defer_until: inUtc }, 'meaning');
    expect(noNote.status).toBe(409);
    const otherInstant = await decide(
      itemId,
      {
        decision: 'defer',
        note: 'After the audit',
        defer_until: new Date(utc.getTime() + 1000).toISOString(),
      },
      'meaning',
    );
    expect(otherInstant.status).toBe(409);
    expect(await auditOf(itemId)).toHaveLength(1);
  });

  it('reads a leap second (RFC 3339 second 60) as PostgreSQL does, with and without a key, never a 500', async () => {
    // 2030-06-30T23:59:60Z is a valid RFC 3339 date-time (§5.6, §5.7). JavaScript and PostgreSQL time have no
    // leap seconds; PostgreSQL reads second 60 as the start of the next minute, and so does the service.
    const leap = '2030-06-30T23:59:60Z';
    const next = '2030-07-01T00:00:00.000Z';
    const { rows } = await sql<{ t: Date }>`SELECT ${leap}::timestamptz AS t`.execute(h.admin);
    expect(rows[0]!.t.toISOString()).toBe(next);

    const plain = await request(h.app)
      .post(`/sites/${hq}/work-items/${await proposedItem()}/decision`)
      .set('Authorization', `Bearer ${bob}`)
      .send({ decision: 'defer', defer_until: leap });
    expect(plain.status).toBe(200);
    expect(plain.body.defer_until).toBe(next);

    const itemId = await proposedItem();
    const keyed = await decide(itemId, { decision: 'defer', defer_until: leap }, 'leap');
    expect(keyed.status).toBe(200);
    expect(keyed.body.defer_until).toBe(next);
    // The same instant at +02:00 and without the leap second is the same request for the key.
    for (const same of ['2030-07-01T01:59:60+02:00', '2030-07-01T00:00:00Z']) {
      const again = await decide(itemId, { decision: 'defer', defer_until: same }, 'leap');
      expect(again.status).toBe(200);
      expect(again.headers['idempotent-replayed']).toBe('true');
    }
    // A leap second in the past is refused alike, with and without a key.
    for (const key of [undefined, 'old-leap']) {
      const call = request(h.app)
        .post(`/sites/${hq}/work-items/${await proposedItem()}/decision`)
        .set('Authorization', `Bearer ${bob}`);
      if (key !== undefined) void call.set('Idempotency-Key', key);
      const past = await call.send({ decision: 'defer', defer_until: '2016-12-31T23:59:60Z' });
      expect({ key, status: past.status, errors: past.body.errors }).toEqual({
        key,
        status: 400,
        errors: [{ path: '/defer_until', message: 'must be in the future' }],
      });
    }
  });

  it('lets exactly one of two racing first uses of a key on two items win; the other is a 409 with no trace', async () => {
    // Each request locks only its own item, so the two meet at the key's primary key instead.
    for (let round = 0; round < 5; round += 1) {
      const items = [await proposedItem(), await proposedItem()];
      const key = `race-${round}`;
      const answers = await Promise.all(items.map((itemId) => decide(itemId, { decision: 'decline' }, key)));
      expect(answers.map((a) => a.status).sort()).toEqual([200, 409]);
      const winner = answers[0]?.status === 200 ? 0 : 1;
      const [won, lost] = winner === 0 ? [items[0], items[1]] : [items[1], items[0]];
      if (won === undefined || lost === undefined) throw new Error('two items expected');
      expect(await stateOf(won)).toBe('declined');
      expect(await stateOf(lost)).toBe('proposed');
      expect(await auditOf(lost)).toEqual([]);
      const stored = await h.admin
        .selectFrom('enterprise.decision_idempotency_keys')
        .select('work_item_id')
        .where('idempotency_key', '=', key)
        .execute();
      expect(stored).toEqual([{ work_item_id: won }]);
    }
  });
});
