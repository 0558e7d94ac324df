// Issue 39 §4, the workflow's probe: there was no cap on open uploads in parts, so any user could open a hundred
// in about a second (each holds parts in the store and an entry in the listing the sweep reads). Now a user and a
// site may each have only so many open (pending, intent not expired; design §4.4): a further intent in parts is
// 409 `too_many_open_uploads` as problem+json, documented in the API document. Real PostgreSQL and s3rver.
import { demoSites, devRolePasswords } from '@platform/enterprise-db';
import { decodeJwt } from 'jose';
import { sql } from 'kysely';
import pg from 'pg';
import request from 'supertest';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';

const MiB = 1024 * 1024;
const hq = demoSites.acmeHq.id;
const tower = demoSites.borealisTower.id;

let h: Harness;
let alice: string;
let bob: string;
let carol: string;

beforeAll(async () => {
  h = await startHarness({
    multipart: {
      thresholdBytes: 6 * MiB,
      partSizeBytes: 5 * MiB,
      uploadTtlS: 3600,
      maxOpenPerUser: 3,
      maxOpenPerSite: 5,
    },
  });
  [alice, bob, carol] = await Promise.all([
    h.issuer.demoToken('alice'),
    h.issuer.demoToken('bob'),
    h.issuer.demoToken('carol'),
  ]);
});
afterAll(async () => {
  await h.close();
});

function intent(token: string, siteId: string, sizeBytes = 7 * MiB) {
  return request(h.app)
    .post(`/sites/${siteId}/media/upload-intents`)
    .set('Authorization', `Bearer ${token}`)
    .send({ filename: 'walk.mp4', content_type: 'video/mp4', size_bytes: sizeBytes });
}

it('caps the uploads in parts one user has open, and frees a place when one is aborted or expires', async () => {
  const opened: string[] = [];
  for (let i = 0; i < 3; i++) {
    const res = await intent(alice, hq);
    expect(res.status).toBe(201);
    opened.push(res.body.media_id as string);
  }
  const refused = await intent(alice, hq);
  expect(refused.status).toBe(409);
  expect(refused.headers['content-type']).toMatch(/^application\/problem\+json/);
  expect(refused.body).toMatchObject({
    status: 409,
    code: 'too_many_open_uploads',
    title: 'Too many open uploads',
    detail:
      'You have 3 uploads in parts open, the most one user may have; complete or abort one, or wait until one expires.',
  });
  // At another of her sites too: the cap is the user's.
  expect((await intent(alice, demoSites.acmeLab.id)).body.code).toBe('too_many_open_uploads');
  // A file sent in one PUT holds no upload in the store: not counted, not refused.
  expect((await intent(alice, hq, 1 * MiB)).status).toBe(201);
  // Aborting one frees its place.
  const aborted = await request(h.app)
    .delete(`/sites/${hq}/media/${opened[0]}/multipart`)
    .set('Authorization', `Bearer ${alice}`);
  expect(aborted.status).toBe(204);
  expect((await intent(alice, hq)).status).toBe(201);
  // So does an intent that expired (the sweep aborts its upload later).
  await sql`UPDATE enterprise.media_items SET upload_expires_at = now() - interval '1 second'
    WHERE id = ${opened[1]}::uuid`.execute(h.admin);
  expect((await intent(alice, hq)).status).toBe(201);
  expect((await intent(alice, hq)).status).toBe(409);
});

it("caps a site's open uploads in parts, whoever started them", async () => {
  // alice has 3 open at headquarters (the test above); bob, who also works there, adds two.
  for (let i = 0; i < 2; i++) expect((await intent(bob, hq)).status).toBe(201);
  const refused = await intent(bob, hq);
  expect(refused.status).toBe(409);
  expect(refused.body).toMatchObject({
    code: 'too_many_open_uploads',
    detail:
      'This site has 5 uploads in parts open, the most one site may have; complete or abort one, or wait until one expires.',
  });
});

it('holds the cap against concurrent intents', async () => {
  const answers = await Promise.all(Array.from({ length: 8 }, () => intent(carol, tower)));
  const statuses = answers.map((a) => a.status).sort();
  expect(statuses).toEqual([201, 201, 201, 409, 409, 409, 409, 409]);
  const { rows } = await sql<{ n: number }>`
    SELECT count(*)::int AS n FROM enterprise.media_items
    WHERE site_id = ${tower}::uuid AND status = 'pending_upload' AND part_count IS NOT NULL`.execute(h.admin);
  expect(rows[0]?.n).toBe(3);
});

it('serialises intents on rows no other login can lock (it used advisory keys any login could hold)', async () => {
  // PostgREST's login has CONNECT on the platform's database. Before enterprise migration 0016 it could hold the
  // advisory key an intent in parts of Bob waited for, and every such intent of his waited for the deadline.
  // The tests above left the caps full: their intents expire.
  await sql`UPDATE enterprise.media_items SET upload_expires_at = now() - interval '1 second'
    WHERE status = 'pending_upload'`.execute(h.admin);
  const { sub } = decodeJwt(bob) as { sub: string };
  const url = new URL(h.database.url);
  url.username = 'authenticator';
  url.password = devRolePasswords.authenticator;
  const stranger = new pg.Client({ connectionString: url.toString() });
  await stranger.connect();
  try {
    await stranger.query(`SELECT pg_advisory_lock(hashtextextended($1, 0))`, [
      `multipart-open-uploader:${sub}`,
    ]);
    await stranger.query(`SELECT pg_advisory_lock(hashtextextended($1, 0))`, [
      `multipart-open-site:${tower}`,
    ]);
    let timer: NodeJS.Timeout | undefined;
    const stalled = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error('the intent waited for the stranger')), 5000);
    });
    try {
      const res = await Promise.race([intent(bob, hq), stalled]);
      expect(res.status).toBe(201);
    } finally {
      clearTimeout(timer);
    }
    // And the rows themselves are out of its reach.
    await stranger.query('BEGIN');
    await expect(
      stranger.query(`SELECT gate FROM enterprise.multipart_gates WHERE gate = $1 FOR UPDATE`, [
        `uploader:${sub}`,
      ]),
    ).rejects.toThrow(/permission denied/);
    await stranger.query('ROLLBACK');
  } finally {
    await stranger.end();
  }
});
