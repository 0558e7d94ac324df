// Review of issue 29 item 6, the database side: does row-level security itself hold the rule "an upload in
// parts is its intent's creator's alone", and do the sweep's definer functions stay inside a caller's tenant?
// Each test asserts the secure behaviour; a failing test is a finding.
import { randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { demoSites, withRequestClaims } from '@platform/enterprise-db';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import type { WorkflowDb } from '../src/db/database.js';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

const MiB = 1024 * 1024;
let h: Harness;
let server: Server;
let base: string;
const tokens: Record<string, string> = {};
const claims: Record<string, { sub: string } & Record<string, unknown>> = {};

beforeAll(async () => {
  h = await startHarness({
    multipart: { thresholdBytes: 6 * MiB, partSizeBytes: 5 * MiB, uploadTtlS: 3600 },
  });
  server = createServer(h.app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  for (const name of ['alice', 'bob', 'carol'] as const) {
    tokens[name] = await h.issuer.demoToken(name);
    const v = await h.verifier.verify(tokens[name]);
    if (!v.ok) throw new Error(`no claims for ${name}`);
    claims[name] = v.user.claims;
  }
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await h.close();
});

const hq = demoSites.acmeHq.id;
const tower = demoSites.borealisTower.id;

async function newUpload(token: string, site: string): Promise<string> {
  const res = await fetch(`${base}/sites/${site}/media/upload-intents`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ filename: 'walkthrough.mp4', content_type: 'video/mp4', size_bytes: 7 * MiB }),
  });
  expect(res.status).toBe(201);
  const body = (await res.json()) as { media_id: string; multipart?: { upload_id: string } };
  expect(body.multipart?.upload_id).toBeDefined();
  return body.media_id;
}

async function row(mediaId: string) {
  const { rows } = await sql<{ status: string; multipart_upload_id: string | null; uploaded_by: string }>`
    SELECT status, multipart_upload_id, uploaded_by FROM enterprise.media_items WHERE id = ${mediaId}::uuid`.execute(
    h.admin,
  );
  return rows[0];
}

/** As the workflow's database login under `who`'s verified claims (what inUserTransaction does). */
function as<T>(who: string, fn: (trx: Kysely<WorkflowDb>) => Promise<T>): Promise<T> {
  return withRequestClaims(h.db, claims[who]!, fn);
}

it("RLS: another user of the same site cannot abandon someone else's started upload", async () => {
  const mediaId = await newUpload(tokens.alice!, hq);
  const changed = await as('bob', async (trx) => {
    const r = await trx
      .updateTable('enterprise.media_items')
      .set({ status: 'abandoned', rejection_reason: 'bob was here' })
      .where('id', '=', mediaId)
      .executeTakeFirst();
    return Number(r.numUpdatedRows);
  });
  expect({ changed, status: (await row(mediaId))?.status }).toEqual({ changed: 0, status: 'pending_upload' });
});

it("RLS: another user of the same site cannot repoint someone else's upload id (abandoning it with a new id)", async () => {
  const mediaId = await newUpload(tokens.alice!, hq);
  const before = await row(mediaId);
  const changed = await as('bob', async (trx) => {
    const r = await trx
      .updateTable('enterprise.media_items')
      .set({ status: 'abandoned', rejection_reason: 'bob', multipart_upload_id: 'bobs-upload-id' })
      .where('id', '=', mediaId)
      .executeTakeFirst();
    return Number(r.numUpdatedRows);
  });
  expect({ changed, upload: (await row(mediaId))?.multipart_upload_id }).toEqual({
    changed: 0,
    upload: before?.multipart_upload_id,
  });
});

it('RLS: the upload id is set once (migration 0010 says "only while it is NULL"), even by the owner', async () => {
  const mediaId = await newUpload(tokens.alice!, hq);
  const before = await row(mediaId);
  // Refused (migration 0011's trigger raises) or a no-op: either way the id stays.
  const changed = await as('alice', async (trx) => {
    const r = await trx
      .updateTable('enterprise.media_items')
      .set({ multipart_upload_id: 'another-upload-id' })
      .where('id', '=', mediaId)
      .executeTakeFirst();
    return Number(r.numUpdatedRows);
  }).catch((err: unknown) => (/once set, does not change/.test(String(err)) ? 0 : -1));
  expect({ changed, upload: (await row(mediaId))?.multipart_upload_id }).toEqual({
    changed: 0,
    upload: before?.multipart_upload_id,
  });
});

it("RLS: a user's transaction cannot abandon another company's fresh planned (not yet started) intents", async () => {
  // carol (Borealis) has an intent recorded an instant ago whose store upload is still being started.
  const mediaId = randomUUID();
  await sql`
    INSERT INTO enterprise.media_items (id, site_id, object_key, filename, declared_content_type,
      declared_size_bytes, uploaded_by, upload_expires_at, part_size_bytes, part_count, created_at)
    VALUES (${mediaId}::uuid, ${tower}::uuid, ${`sites/${tower}/media/${mediaId}`}, 'x.mp4', 'video/mp4',
      ${7 * MiB}, ${claims.carol!.sub}, now() + interval '1 hour', ${5 * MiB}, 2, now() - interval '1 second')`.execute(
    h.admin,
  );
  // bob (Acme, one site), through the workflow's role and his own claims, calls the sweep's definer function.
  const n = await as('bob', async (trx) => {
    const { rows } = await sql<{ n: number }>`
      SELECT enterprise_api.abandon_unstarted_multipart_uploads(now(), 1000) AS n`.execute(trx);
    return rows[0]?.n;
  });
  expect({ n, status: (await row(mediaId))?.status }).toEqual({ n: 0, status: 'pending_upload' });
});

it("RLS: a user's transaction reads no other company's rows through the sweep's definer functions", async () => {
  const carolsItem = await newUpload(tokens.carol!, tower);
  // Expire carol's intent (the sweep's listing only names expired ones).
  await sql`UPDATE enterprise.media_items SET upload_expires_at = now() - interval '1 minute'
    WHERE id = ${carolsItem}::uuid`.execute(h.admin);
  const seen = await as('bob', async (trx) => {
    const { rows } = await sql<{ media_id: string; site_id: string; object_key: string; upload_id: string }>`
      SELECT * FROM enterprise_api.expired_multipart_uploads(now(), NULL, NULL, 1000)`.execute(trx);
    return rows;
  });
  expect(seen.filter((r) => r.site_id === tower)).toEqual([]);
  // Nor marks one as assembled (migration 0013's note_upload_assembled): nothing with a caller's claims.
  const noted = await as('bob', async (trx) => {
    const { rows } = await sql<{ seen: Date | null }>`
      SELECT enterprise_api.note_upload_assembled(${carolsItem}::uuid) AS seen`.execute(trx);
    return rows[0]?.seen;
  });
  const { rows } = await sql<{ assembled_seen_at: Date | null }>`
    SELECT assembled_seen_at FROM enterprise.media_items WHERE id = ${carolsItem}::uuid`.execute(h.admin);
  expect({ noted, stored: rows[0]?.assembled_seen_at }).toEqual({ noted: null, stored: null });
});
