// The workflow service's identity (enterprise_api_login -> enterprise_api_role + request claims):
// the same access function limits its reads and writes; the webhook identity may only complete
// pending media.
import { randomUUID } from 'node:crypto';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import {
  demoRowId,
  demoSites,
  demoUserSubs,
  dollarQuote,
  recordObjectCreated,
  withRequestClaims,
} from '@platform/enterprise-db';
import type { DemoUser, EnterpriseDatabase } from '@platform/enterprise-db';
import { claimsOf, setUp, sqlState } from './helpers.js';
import type { Fixture } from './helpers.js';

let f: Fixture;
let api: Kysely<EnterpriseDatabase>;
beforeAll(async () => {
  f = await setUp();
  api = f.api as unknown as Kysely<EnterpriseDatabase>;
});
afterAll(async () => {
  await f.close();
});

const as = (user: DemoUser) => claimsOf(user) as { sub: string };

async function decide(user: DemoUser, itemId: string, siteId: string): Promise<number> {
  return withRequestClaims(api, as(user), async (trx) => {
    const r = await trx
      .updateTable('enterprise.work_items')
      .set({
        state: 'accepted',
        decided_at: new Date(),
        decided_by: demoUserSubs[user],
        updated_at: new Date(),
      })
      .where('id', '=', itemId)
      .where('site_id', '=', siteId)
      .where('state', '=', 'proposed')
      .executeTakeFirst();
    return Number(r.numUpdatedRows);
  });
}

describe('withRequestClaims', () => {
  it('dollar-quotes any text it sends (the claims travel as a literal in the one-round-trip opening)', async () => {
    for (const text of ["it's", '$$', '$c$', 'a\\b', '\u00fc\n\t', '', '{"sub":"x$c0$"}']) {
      const { rows } = await sql.raw<{ v: string }>(`SELECT ${dollarQuote(text)} AS v`).execute(api);
      expect(rows[0]?.v).toBe(text);
    }
  });

  it('opens the transaction at the isolation level asked for (read committed by default)', async () => {
    const level = (options?: { isolationLevel: 'serializable' }) =>
      withRequestClaims(
        api,
        as('bob'),
        async (trx) =>
          (await sql<{ l: string }>`SELECT current_setting('transaction_isolation') AS l`.execute(trx))
            .rows[0]?.l,
        options,
      );
    expect(await level()).toBe('read committed');
    expect(await level({ isolationLevel: 'serializable' })).toBe('serializable');
  });

  it('rolls back when fn throws and leaves no identity on the pooled connection', async () => {
    await expect(
      withRequestClaims(api, as('bob'), async (trx) => {
        const r = await sql`UPDATE enterprise.work_items SET decision_note = 'rolled-back-note'
                            WHERE site_id = ${demoSites.acmeHq.id}::uuid AND state = 'proposed'`.execute(trx);
        expect(Number(r.numAffectedRows)).toBeGreaterThan(0);
        throw new Error('boom');
      }),
    ).rejects.toThrow('boom');
    const { rows } = await sql<{ who: string; claims: string | null }>`
      SELECT current_user AS who, current_setting('request.jwt.claims', true) AS claims`.execute(api);
    expect(rows[0]?.who).not.toBe('enterprise_api_role');
    expect(rows[0]?.claims ?? '').toBe('');
    const changed = await f.adminPool.query(
      `SELECT count(*)::int AS n FROM enterprise.work_items WHERE decision_note = 'rolled-back-note'`,
    );
    expect(changed.rows[0]?.n).toBe(0);
  });

  it('runs as enterprise_api_role with the caller claims', async () => {
    const row = await withRequestClaims(api, as('bob'), async (trx) => {
      const { rows } = await sql<{
        who: string;
        sub: string;
      }>`SELECT current_user AS who, enterprise_api.request_sub() AS sub`.execute(trx);
      return rows[0];
    });
    expect(row).toEqual({ who: 'enterprise_api_role', sub: demoUserSubs.bob });
  });

  it("reads only the caller's sites", async () => {
    const sites = await withRequestClaims(api, as('bob'), (trx) =>
      trx.selectFrom('enterprise.sites').select('id').execute(),
    );
    expect(sites.map((s) => s.id)).toEqual([demoSites.acmeHq.id]);
  });

  it.each([
    ['bob', 'another site of his company', 'acmeWarehouse'],
    ['bob', 'another company', 'borealisTower'],
    ['dave', 'any site', 'acmeHq'],
    ['carol', 'another company', 'acmeHq'],
  ] as const)('%s deciding a work item at %s updates zero rows', async (user, _what, site) => {
    const item = demoRowId('work_item', site, 1);
    expect(await decide(user, item, demoSites[site].id)).toBe(0);
    const { rows } = await f.adminPool.query<{ state: string }>(
      'SELECT state FROM enterprise.work_items WHERE id = $1',
      [item],
    );
    expect(rows[0]?.state).toBe('proposed');
  });

  it('a decision inside the caller site updates the row', async () => {
    expect(await decide('bob', demoRowId('work_item', 'acmeHq', 2), demoSites.acmeHq.id)).toBe(1);
  });

  it('cannot record a decision in the name of someone else', async () => {
    const code = await sqlState(
      withRequestClaims(api, as('bob'), (trx) =>
        trx
          .updateTable('enterprise.work_items')
          .set({ state: 'declined', decided_at: new Date(), decided_by: demoUserSubs.alice })
          .where('id', '=', demoRowId('work_item', 'acmeHq', 3))
          .execute(),
      ),
    );
    expect(code).toBe('42501');
  });

  it('audit rows and media intents outside the caller sites are refused (42501)', async () => {
    const audit = sqlState(
      withRequestClaims(api, as('bob'), (trx) =>
        trx
          .insertInto('enterprise.work_item_decisions')
          .values({
            work_item_id: demoRowId('work_item', 'borealisTower', 1),
            site_id: demoSites.borealisTower.id,
            decision: 'accept',
            previous_state: 'proposed',
            new_state: 'accepted',
            decided_by: demoUserSubs.bob,
            request_id: 'req-1',
          })
          .execute(),
      ),
    );
    expect(await audit).toBe('42501');
    const media = sqlState(
      withRequestClaims(api, as('carol'), (trx) =>
        trx
          .insertInto('enterprise.media_items')
          .values({
            site_id: demoSites.acmeHq.id,
            object_key: `sites/${demoSites.acmeHq.id}/media/${randomUUID()}`,
            filename: 'x.jpg',
            declared_content_type: 'image/jpeg',
            declared_size_bytes: 10,
            uploaded_by: demoUserSubs.carol,
          })
          .execute(),
      ),
    );
    expect(await media).toBe('42501');
  });

  it('links to a record of another site are refused by the foreign keys', async () => {
    const code = await sqlState(
      withRequestClaims(api, as('alice'), (trx) =>
        trx
          .insertInto('enterprise.media_items')
          .values({
            site_id: demoSites.acmeHq.id,
            object_key: `sites/${demoSites.acmeHq.id}/media/${randomUUID()}`,
            filename: 'x.jpg',
            declared_content_type: 'image/jpeg',
            declared_size_bytes: 10,
            uploaded_by: demoUserSubs.alice,
            work_item_id: demoRowId('work_item', 'acmeLab', 1),
          })
          .execute(),
      ),
    );
    expect(code).toBe('23503');
  });

  it('the workflow cannot change media status itself, nor touch schedules or service records', async () => {
    for (const statement of [
      sql`UPDATE enterprise.media_items SET etag = 'x'`,
      sql`SELECT * FROM enterprise.maintenance_schedules`,
      sql`DELETE FROM enterprise.work_items`,
      sql`SELECT * FROM enterprise.principals`,
    ]) {
      expect(await sqlState(withRequestClaims(api, as('alice'), (trx) => statement.execute(trx)))).toBe(
        '42501',
      );
    }
  });

  it("a pending multipart item may only become abandoned, and only within the caller's sites", async () => {
    const multipart = async (uploadId: string | null) =>
      withRequestClaims(api, as('alice'), (trx) =>
        trx
          .insertInto('enterprise.media_items')
          .values({
            site_id: demoSites.acmeHq.id,
            object_key: `sites/${demoSites.acmeHq.id}/media/${randomUUID()}`,
            filename: 'walk.mp4',
            declared_content_type: 'video/mp4',
            declared_size_bytes: 100 * 1024 * 1024,
            uploaded_by: demoUserSubs.alice,
            multipart_upload_id: uploadId,
            part_size_bytes: uploadId === null ? null : 16 * 1024 * 1024,
            part_count: uploadId === null ? null : 7,
          })
          .returning('id')
          .executeTakeFirstOrThrow(),
      );
    const item = await multipart('upload-1');
    const single = await multipart(null);
    const abandon = (user: DemoUser, id: string, status: 'abandoned' | 'available') =>
      withRequestClaims(api, as(user), (trx) =>
        sql`UPDATE enterprise.media_items SET status = ${status}, rejection_reason = 'aborted', updated_at = now()
            WHERE id = ${id}::uuid`.execute(trx),
      );
    // Another tenant's item is invisible: nothing is updated.
    expect((await abandon('carol', item.id, 'abandoned')).numAffectedRows).toBe(0n);
    // A single-PUT item is not the workflow's to change.
    expect((await abandon('alice', single.id, 'abandoned')).numAffectedRows).toBe(0n);
    // Any state but abandoned fails the policy's check.
    expect(await sqlState(abandon('alice', item.id, 'available'))).toBe('42501');
    expect((await abandon('alice', item.id, 'abandoned')).numAffectedRows).toBe(1n);
    // Final: an abandoned item is no longer pending, so it cannot be changed again.
    expect((await abandon('alice', item.id, 'abandoned')).numAffectedRows).toBe(0n);
  });

  it('idempotency keys are private to their caller', async () => {
    const key = `key-${randomUUID()}`;
    await withRequestClaims(api, as('alice'), (trx) =>
      trx
        .insertInto('enterprise.decision_idempotency_keys')
        .values({
          caller_sub: demoUserSubs.alice,
          idempotency_key: key,
          work_item_id: demoRowId('work_item', 'acmeHq', 1),
          site_id: demoSites.acmeHq.id,
          request_fingerprint: 'f',
          response_status: 200,
          response_body: JSON.stringify({ ok: true }),
        })
        .execute(),
    );
    const seenByBob = await withRequestClaims(api, as('bob'), (trx) =>
      trx
        .selectFrom('enterprise.decision_idempotency_keys')
        .selectAll()
        .where('idempotency_key', '=', key)
        .execute(),
    );
    expect(seenByBob).toEqual([]);
    const seenByAlice = await withRequestClaims(api, as('alice'), (trx) =>
      trx
        .selectFrom('enterprise.decision_idempotency_keys')
        .select('response_body')
        .where('idempotency_key', '=', key)
        .execute(),
    );
    expect(seenByAlice).toEqual([{ response_body: { ok: true } }]);
  });
});

describe('recordObjectCreated (webhook service identity)', () => {
  async function newIntent(size: number, type: string): Promise<{ id: string; key: string }> {
    const key = `sites/${demoSites.borealisMall.id}/media/${randomUUID()}`;
    const row = await withRequestClaims(api, as('carol'), (trx) =>
      trx
        .insertInto('enterprise.media_items')
        .values({
          site_id: demoSites.borealisMall.id,
          object_key: key,
          filename: 'leak.jpg',
          declared_content_type: type,
          declared_size_bytes: size,
          uploaded_by: demoUserSubs.carol,
        })
        .returning(['id', 'company_id', 'status'])
        .executeTakeFirstOrThrow(),
    );
    expect(row.status).toBe('pending_upload');
    expect(row.company_id).toBe(demoSites.borealisMall.companyId);
    return { id: row.id, key };
  }

  it('marks a matching upload available, then treats redelivery as already recorded', async () => {
    const { id, key } = await newIntent(1234, 'image/jpeg');
    expect(
      await recordObjectCreated(api, {
        objectKey: key,
        sizeBytes: 1234,
        etag: '"abc"',
        contentType: 'image/jpeg',
      }),
    ).toEqual({
      outcome: 'recorded',
      mediaId: id,
      siteId: demoSites.borealisMall.id,
      status: 'available',
    });
    expect(
      (
        await recordObjectCreated(api, {
          objectKey: key,
          sizeBytes: 1,
          etag: 'zzz',
          contentType: 'video/mp4',
        })
      ).outcome,
    ).toBe('already_recorded');
    const { rows } = await f.adminPool.query(
      'SELECT status, etag, actual_size_bytes FROM enterprise.media_items WHERE id = $1',
      [id],
    );
    expect(rows).toEqual([{ status: 'available', etag: 'abc', actual_size_bytes: '1234' }]);
  });

  it('rejects a size or type that breaks the intent', async () => {
    const a = await newIntent(1000, 'image/png');
    expect(
      (
        await recordObjectCreated(api, {
          objectKey: a.key,
          sizeBytes: 999,
          etag: 'e',
          contentType: 'image/png',
        })
      ).status,
    ).toBe('rejected');
    const b = await newIntent(1000, 'image/png');
    expect(
      (
        await recordObjectCreated(api, {
          objectKey: b.key,
          sizeBytes: 1000,
          etag: 'e',
          contentType: 'text/html',
        })
      ).status,
    ).toBe('rejected');
  });

  it('acknowledges an unknown key without changing anything', async () => {
    expect(
      await recordObjectCreated(api, { objectKey: 'nope', sizeBytes: 1, etag: null, contentType: null }),
    ).toEqual({
      outcome: 'unknown_key',
      mediaId: null,
      siteId: null,
      status: null,
    });
  });
});
