// Work-item decisions: state rules, audit in the same transaction, serialisation under concurrency,
// Idempotency-Key replay.
import { validateDecisionResponse } from '@platform/contracts';
import { demoRowId, demoSites, demoUserSubs } from '@platform/enterprise-db';
import request from 'supertest';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
let alice: string;
let bob: string;
let carol: string;

beforeAll(async () => {
  h = await startHarness();
  [alice, bob, carol] = await Promise.all([
    h.issuer.demoToken('alice'),
    h.issuer.demoToken('bob'),
    h.issuer.demoToken('carol'),
  ]);
});
afterAll(async () => {
  await h.close();
});

const hq = demoSites.acmeHq.id;
const lab = demoSites.acmeLab.id;
const item = (site: 'acmeHq' | 'acmeLab' | 'acmeWarehouse' | 'borealisTower', n: number) =>
  demoRowId('work_item', site, n);
const inAWeek = () => new Date(Date.now() + 7 * 86400_000).toISOString();

function decide(token: string, siteId: string, itemId: string, body: object, key?: string) {
  const req = request(h.app)
    .post(`/sites/${siteId}/work-items/${itemId}/decision`)
    .set('Authorization', `Bearer ${token}`);
  if (key !== undefined) req.set('Idempotency-Key', key);
  return req.send(body);
}

async function audit(itemId: string) {
  return h.admin
    .selectFrom('enterprise.work_item_decisions')
    .select(['decision', 'previous_state', 'new_state', 'decided_by', 'request_id', 'note', 'defer_until'])
    .where('work_item_id', '=', itemId)
    .orderBy('id')
    .execute();
}

async function state(itemId: string) {
  return h.admin
    .selectFrom('enterprise.work_items')
    .selectAll()
    .where('id', '=', itemId)
    .executeTakeFirstOrThrow();
}

describe('POST /sites/{site_id}/work-items/{item_id}/decision', () => {
  it('accepts a proposed item, records who, when, note and request id, and answers the new state', async () => {
    const itemId = item('acmeHq', 1);
    const res = await decide(bob, hq, itemId, { decision: 'accept', note: 'Go ahead' }).set(
      'X-Request-Id',
      'req-accept-1',
    );
    expect(res.status).toBe(200);
    expect(validateDecisionResponse(res.body).ok).toBe(true);
    expect(res.body).toMatchObject({
      work_item_id: itemId,
      site_id: hq,
      status: 'accepted',
      defer_until: null,
      decided_by: demoUserSubs.bob,
      note: 'Go ahead',
    });
    expect(await audit(itemId)).toEqual([
      {
        decision: 'accept',
        previous_state: 'proposed',
        new_state: 'accepted',
        decided_by: demoUserSubs.bob,
        request_id: 'req-accept-1',
        note: 'Go ahead',
        defer_until: null,
      },
    ]);

    // The same final decision again: 200, unchanged, no audit row. A different one: 409.
    const again = await decide(alice, hq, itemId, { decision: 'accept' });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(res.body);
    const other = await decide(alice, hq, itemId, { decision: 'decline' });
    expect(other.status).toBe(409);
    expect(other.body.code).toBe('work_item_final');
    expect(await audit(itemId)).toHaveLength(1);
    expect((await state(itemId)).state).toBe('accepted');
  });

  it('defers (requiring a future date) and lets a deferred item be decided again', async () => {
    const itemId = item('acmeLab', 1);
    const missing = await decide(alice, lab, itemId, { decision: 'defer' });
    expect(missing.status).toBe(400);
    expect(missing.body.errors[0].path).toBe('/defer_until');
    const past = await decide(alice, lab, itemId, { decision: 'defer', defer_until: '2020-01-01T00:00:00Z' });
    expect(past.status).toBe(400);
    expect(past.body.errors).toEqual([{ path: '/defer_until', message: 'must be in the future' }]);
    const withDateOnAccept = await decide(alice, lab, itemId, { decision: 'accept', defer_until: inAWeek() });
    expect(withDateOnAccept.status).toBe(400);

    const until = inAWeek();
    const deferred = await decide(alice, lab, itemId, { decision: 'defer', defer_until: until });
    expect(deferred.status).toBe(200);
    expect(deferred.body.status).toBe('deferred');
    expect(deferred.body.defer_until).toBe(new Date(until).toISOString());
    const declined = await decide(alice, lab, itemId, { decision: 'decline', note: 'Budget' });
    expect(declined.status).toBe(200);
    expect(declined.body).toMatchObject({ status: 'declined', defer_until: null, note: 'Budget' });
    expect((await audit(itemId)).map((a) => `${a.previous_state}->${a.new_state}`)).toEqual([
      'proposed->deferred',
      'deferred->declined',
    ]);
  });

  it('refuses a defer_until that falls past year 9999 in UTC, which no RFC 3339 answer could write (issue 39 §4)', async () => {
    const { id: itemId } = await h.admin
      .insertInto('enterprise.work_items')
      .values({ site_id: lab, title: 'Repaint the year 9999', severity: 'low' })
      .returning('id')
      .executeTakeFirstOrThrow();
    // Both are valid RFC 3339 date-times: a leap second at the last minute of 9999 (read as the next minute's
    // first instant, design §4.4) and an offset west of UTC. Both were answered 200 as +010000-01-01T….
    for (const until of ['9999-12-31T23:59:60Z', '9999-12-31T23:00:00-05:00']) {
      for (const key of [undefined, `far-${until}`]) {
        const res = await decide(alice, lab, itemId, { decision: 'defer', defer_until: until }, key);
        expect({ until, key, status: res.status, body: res.body }).toMatchObject({
          until,
          key,
          status: 400,
          body: {
            code: 'invalid_body',
            errors: [
              {
                path: '/defer_until',
                message: expect.stringMatching(/^must be before 10000-01-01T00:00:00Z/),
              },
            ],
          },
        });
      }
    }
    expect(await audit(itemId)).toEqual([]);
    // The last instant RFC 3339 can write is still a valid deferral.
    const last = await decide(alice, lab, itemId, {
      decision: 'defer',
      defer_until: '9999-12-31T23:59:59.999Z',
    });
    expect({ status: last.status, until: last.body.defer_until }).toEqual({
      status: 200,
      until: '9999-12-31T23:59:59.999Z',
    });
  });

  it('answers 404 for items of other sites, other companies, unknown or malformed ids', async () => {
    const cases = [
      decide(bob, demoSites.acmeWarehouse.id, item('acmeWarehouse', 1), { decision: 'accept' }),
      decide(carol, hq, item('acmeHq', 2), { decision: 'accept' }),
      decide(alice, hq, item('acmeWarehouse', 1), { decision: 'accept' }),
      decide(alice, hq, '00000000-0000-4000-8000-000000000000', { decision: 'accept' }),
      decide(alice, hq, 'x', { decision: 'accept' }),
    ];
    for (const res of await Promise.all(cases)) {
      expect(res.status).toBe(404);
      expect(res.body.code).toBe('not_found');
      expect(res.body.detail).toBe('No such work item.');
    }
    expect(await audit(item('acmeWarehouse', 1))).toEqual([]);
    expect((await state(item('acmeHq', 2))).state).toBe('proposed');
  });

  it('validates the body', async () => {
    for (const body of [
      {},
      { decision: 'maybe' },
      { decision: 'accept', note: 'x'.repeat(2001) },
      { decision: 'accept', extra: 1 },
    ]) {
      const res = await decide(alice, hq, item('acmeHq', 3), body);
      expect(res.status).toBe(400);
      expect(res.body.code).toBe('invalid_body');
    }
  });

  it('serialises 50 concurrent decisions on one item: exactly one transition, a consistent audit', async () => {
    const itemId = item('acmeHq', 2);
    const decisions = Array.from({ length: 50 }, (_, i) => (i % 2 === 0 ? 'accept' : 'decline'));
    const answers = await Promise.all(
      decisions.map((decision, i) =>
        decide(i % 3 === 0 ? bob : alice, hq, itemId, { decision }).set('X-Request-Id', `race-${i}`),
      ),
    );
    const final = await state(itemId);
    const winner = final.state === 'accepted' ? 'accept' : 'decline';
    expect(['accepted', 'declined']).toContain(final.state);
    const rows = await audit(itemId);
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ decision: winner, previous_state: 'proposed', new_state: final.state });
    const expected = decisions.map((d) => (d === winner ? `200 ${final.state}` : '409 work_item_final'));
    expect(answers.map((res) => `${res.status} ${String(res.body.code ?? res.body.status)}`)).toEqual(
      expected,
    );
    // The audit row belongs to one of the winning requests.
    const winners = decisions.map((d, i) => (d === winner ? `race-${i}` : undefined)).filter(Boolean);
    expect(winners).toContain(rows[0]?.request_id);
  });

  describe('Idempotency-Key', () => {
    it('replays the stored answer to a retry, even after the item changed', async () => {
      const itemId = item('acmeHq', 3);
      const until = inAWeek();
      const first = await decide(bob, hq, itemId, { decision: 'defer', defer_until: until }, 'key-1');
      expect(first.status).toBe(200);
      expect(first.headers['idempotent-replayed']).toBeUndefined();
      const retry = await decide(bob, hq, itemId, { decision: 'defer', defer_until: until }, 'key-1');
      expect(retry.status).toBe(200);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body).toEqual(first.body);
      expect(await audit(itemId)).toHaveLength(1);

      // Same key, other request: conflict. Another caller's key space is separate.
      const misuse = await decide(bob, hq, itemId, { decision: 'accept' }, 'key-1');
      expect(misuse.status).toBe(409);
      const aliceSameKey = await decide(alice, hq, itemId, { decision: 'accept' }, 'key-1');
      expect(aliceSameKey.status).toBe(200);
      expect(aliceSameKey.body.status).toBe('accepted');
      const replayAfterChange = await decide(
        bob,
        hq,
        itemId,
        { decision: 'defer', defer_until: until },
        'key-1',
      );
      expect(replayAfterChange.body.status).toBe('deferred');
      expect(await audit(itemId)).toHaveLength(2);
    });

    it('serialises concurrent retries with one key into one decision', async () => {
      const itemId = item('acmeLab', 2);
      const until = inAWeek();
      const answers = await Promise.all(
        Array.from({ length: 10 }, () =>
          decide(alice, lab, itemId, { decision: 'defer', defer_until: until }, 'burst'),
        ),
      );
      for (const res of answers) {
        expect(res.status).toBe(200);
        expect(res.body).toEqual(answers[0]?.body);
      }
      expect(answers.filter((r) => r.headers['idempotent-replayed'] === 'true')).toHaveLength(9);
      expect(await audit(itemId)).toHaveLength(1);
    });

    /** A fresh proposed item at headquarters (the seeded ones are used by the tests above). */
    async function proposedItem(): Promise<string> {
      const row = await h.admin
        .insertInto('enterprise.work_items')
        .values({
          site_id: hq,
          title: 'Replace filter',
          severity: 'low',
        })
        .returning('id')
        .executeTakeFirstOrThrow();
      return row.id;
    }

    it('treats a key older than its lifetime (24 h) as new: no replay, no conflict for another body', async () => {
      const itemId = await proposedItem();
      const until = inAWeek();
      const first = await decide(bob, hq, itemId, { decision: 'defer', defer_until: until }, 'aged-key');
      expect(first.status).toBe(200);
      // The stored answer ages past idempotencyTtlS (86,400 s in the harness).
      await h.admin
        .updateTable('enterprise.decision_idempotency_keys')
        .set({ created_at: new Date(Date.now() - 86_401_000) })
        .where('idempotency_key', '=', 'aged-key')
        .execute();
      // Within the lifetime another body would be a 409; past it the key is free again.
      const reused = await decide(bob, hq, itemId, { decision: 'accept' }, 'aged-key');
      expect(reused.status).toBe(200);
      expect(reused.headers['idempotent-replayed']).toBeUndefined();
      expect(reused.body.status).toBe('accepted');
      // It now stands for the new request: its retry replays, the old body conflicts.
      const retry = await decide(bob, hq, itemId, { decision: 'accept' }, 'aged-key');
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body).toEqual(reused.body);
      const oldBody = await decide(bob, hq, itemId, { decision: 'defer', defer_until: until }, 'aged-key');
      expect(oldBody.status).toBe(409);
      expect((await audit(itemId)).map((a) => a.decision)).toEqual(['defer', 'accept']);
    });

    it('replays a defer to its retry even once defer_until has passed; a new request with it is refused', async () => {
      const itemId = await proposedItem();
      const soon = new Date(Date.now() + 1000).toISOString();
      const first = await decide(bob, hq, itemId, { decision: 'defer', defer_until: soon }, 'late-retry');
      expect(first.status).toBe(200);
      await new Promise((resolve) => setTimeout(resolve, 1100));
      const retry = await decide(bob, hq, itemId, { decision: 'defer', defer_until: soon }, 'late-retry');
      expect(retry.status).toBe(200);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(retry.body).toEqual(first.body);
      const fresh = await decide(bob, hq, itemId, { decision: 'defer', defer_until: soon }, 'another-key');
      expect(fresh.status).toBe(400);
      expect(fresh.body.errors).toEqual([{ path: '/defer_until', message: 'must be in the future' }]);
      expect(await audit(itemId)).toHaveLength(1);
    });

    it('refuses a malformed key', async () => {
      const res = await decide(alice, lab, item('acmeLab', 3), { decision: 'accept' }, 'a b');
      expect(res.status).toBe(400);
    });
  });

  it('counts decisions in /metrics', async () => {
    const res = await request(h.app).get('/metrics');
    expect(res.text).toMatch(
      /workflow_decisions_total\{[^}]*decision="accept"[^}]*outcome="transition"[^}]*\} \d+/,
    );
    expect(res.text).toMatch(/outcome="conflict"/);
  });
});
