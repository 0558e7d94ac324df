// Presigned URL lifetimes come from the configuration (UPLOAD_URL_TTL_S, DOWNLOAD_URL_TTL_S), not
// from the defaults (900 s and 300 s): non-default values are read from the environment the way
// main.ts does, and both the signed expiry and the announced expires_at must follow them.
import { demoRowId, demoSites } from '@platform/enterprise-db';
import request from 'supertest';
import { loadWorkflowConfig } from '../src/config.js';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';
import { verifyPresigned } from './support/sigv4.js';

const UPLOAD_TTL_S = 1234;
const DOWNLOAD_TTL_S = 77;

// A fixed clock (whole seconds, as X-Amz-Date) makes every expiry exact.
const now = new Date(Math.floor(Date.now() / 1000) * 1000);

let h: Harness;
let bob: string;

beforeAll(async () => {
  const config = loadWorkflowConfig({
    DATABASE_URL: 'postgres://unused@127.0.0.1:1/unused',
    OIDC_ISSUER_URL: 'https://id.example.com/realms/platform',
    S3_BUCKET: 'media',
    WEBHOOK_TOKENS: 'unused-webhook-token',
    UPLOAD_URL_TTL_S: String(UPLOAD_TTL_S),
    DOWNLOAD_URL_TTL_S: String(DOWNLOAD_TTL_S),
  });
  h = await startHarness({ media: config.media, now: () => now });
  bob = await h.issuer.demoToken('bob');
});
afterAll(async () => {
  await h.close();
});

const hq = demoSites.acmeHq.id;
const at = (offsetS: number) => new Date(now.getTime() + offsetS * 1000);
const amzDate = (date: Date) => date.toISOString().replace(/[-:]|\.\d{3}/g, '');

describe('configured presigned URL lifetimes', () => {
  it(`signs upload URLs for UPLOAD_URL_TTL_S (${UPLOAD_TTL_S} s) and announces that expiry`, async () => {
    const res = await request(h.app)
      .post(`/sites/${hq}/media/upload-intents`)
      .set('Authorization', `Bearer ${bob}`)
      .send({ filename: 'a.png', content_type: 'image/png', size_bytes: 10 });
    expect(res.status).toBe(201);
    const {
      url,
      headers,
      expires_at: expiresAt,
    } = res.body.upload as {
      url: string;
      headers: Record<string, string>;
      expires_at: string;
    };
    const params = new URL(url).searchParams;
    expect(params.get('X-Amz-Date')).toBe(amzDate(now));
    expect(params.get('X-Amz-Expires')).toBe(String(UPLOAD_TTL_S));
    expect(expiresAt).toBe(at(UPLOAD_TTL_S).toISOString());
    // The row's upload deadline is the URL's.
    const row = await h.admin
      .selectFrom('enterprise.media_items')
      .select('upload_expires_at')
      .where('id', '=', res.body.media_id as string)
      .executeTakeFirstOrThrow();
    expect(row.upload_expires_at?.toISOString()).toBe(expiresAt);

    const signed = { method: 'PUT', url, headers: { ...headers, 'content-length': '10' } };
    const credentials = { accessKeyId: h.s3.accessKeyId, secretAccessKey: h.s3.secretAccessKey };
    expect(verifyPresigned(signed, credentials, at(UPLOAD_TTL_S - 1)).ok).toBe(true);
    expect(verifyPresigned(signed, credentials, at(UPLOAD_TTL_S + 1))).toEqual({
      ok: false,
      reason: 'expired',
    });
  });

  it(`signs download URLs for DOWNLOAD_URL_TTL_S (${DOWNLOAD_TTL_S} s) and announces that expiry`, async () => {
    // A seeded item that has arrived.
    const mediaId = demoRowId('media_item', 'acmeHq', 1);
    const res = await request(h.app)
      .get(`/sites/${hq}/media/${mediaId}/download`)
      .set('Authorization', `Bearer ${bob}`);
    expect(res.status).toBe(200);
    const params = new URL(String(res.body.url)).searchParams;
    expect(params.get('X-Amz-Date')).toBe(amzDate(now));
    expect(params.get('X-Amz-Expires')).toBe(String(DOWNLOAD_TTL_S));
    expect(res.body.expires_at).toBe(at(DOWNLOAD_TTL_S).toISOString());

    const signed = { method: 'GET', url: String(res.body.url), headers: {} };
    const credentials = { accessKeyId: h.s3.accessKeyId, secretAccessKey: h.s3.secretAccessKey };
    expect(verifyPresigned(signed, credentials, at(DOWNLOAD_TTL_S - 1)).ok).toBe(true);
    expect(verifyPresigned(signed, credentials, at(DOWNLOAD_TTL_S + 1))).toEqual({
      ok: false,
      reason: 'expired',
    });
  });
});
