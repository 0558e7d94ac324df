// End to end over real sockets: the portal asks for an upload intent, uploads through the presigned
// URL to a store that verifies SigV4 (a verifying proxy in front of s3rver, which itself accepts any
// signature), the store's ObjectCreated event reaches the webhook, and the file becomes downloadable.
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { demoSites } from '@platform/enterprise-db';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';
import { startVerifyingProxy } from './support/sigv4.js';
import { waitFor } from './support/wait.js';

let h: Harness;
let proxy: Awaited<ReturnType<typeof startVerifyingProxy>>;
let server: Server;
let base: string;

beforeAll(async () => {
  // The proxy must exist before the app signs URLs for it; it learns s3rver's address afterwards.
  const target = { endpoint: '' };
  proxy = await startVerifyingProxy(() => target.endpoint, {
    accessKeyId: 'S3RVER',
    secretAccessKey: 'S3RVER',
  });
  h = await startHarness({ publicEndpoint: proxy.endpoint, forwardEvents: true });
  target.endpoint = h.s3.endpoint;
  server = createServer(h.app);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  h.setEventTarget(`${base}/internal/media/object-created`);
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await proxy.stop();
  await h.close();
});

const hq = demoSites.acmeHq.id;

async function api(path: string, init: RequestInit & { token: string }) {
  const res = await fetch(`${base}${path}`, {
    ...init,
    headers: {
      ...(init.headers as Record<string, string>),
      Authorization: `Bearer ${init.token}`,
      'Content-Type': 'application/json',
    },
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

interface Upload {
  method: string;
  url: string;
  headers: Record<string, string>;
  expires_at: string;
}

it('uploads through the presigned URL, the event arrives, and the media downloads', async () => {
  const token = await h.issuer.demoToken('bob');
  const photo = Buffer.from('\x89PNG\r\n\x1a\n fake image bytes for the test');
  const created = await api(`/sites/${hq}/media/upload-intents`, {
    method: 'POST',
    token,
    body: JSON.stringify({ filename: 'roof leak.png', content_type: 'image/png', size_bytes: photo.length }),
  });
  expect(created.status).toBe(201);
  const mediaId = created.body.media_id as string;
  const upload = created.body.upload as Upload;

  // Tampering is refused by the verifying store: another type, another length, a longer expiry.
  const wrongType = await fetch(upload.url, {
    method: 'PUT',
    headers: { 'Content-Type': 'text/html' },
    body: photo,
  });
  expect(wrongType.status).toBe(403);
  const wrongLength = await fetch(upload.url, {
    method: 'PUT',
    headers: upload.headers,
    body: Buffer.concat([photo, photo]),
  });
  expect(wrongLength.status).toBe(403);
  const longer = upload.url.replace('X-Amz-Expires=900', 'X-Amz-Expires=604800');
  expect((await fetch(longer, { method: 'PUT', headers: upload.headers, body: photo })).status).toBe(403);
  expect(proxy.refused).toEqual(['signature mismatch', 'signature mismatch', 'signature mismatch']);
  expect((await api(`/sites/${hq}/media/${mediaId}/download`, { token })).status).toBe(409);

  const put = await fetch(upload.url, { method: upload.method, headers: upload.headers, body: photo });
  expect(put.status).toBe(200);

  const ready = await waitFor(async () => {
    const res = await api(`/sites/${hq}/media/${mediaId}/download`, { token });
    return res.status === 200 ? res.body : undefined;
  });
  // The item is available once recorded; the webhook answers the store after its housekeeping, a moment later.
  await waitFor(() => Promise.resolve(h.forwarded.length > 0 ? true : undefined));
  expect(h.forwarded).toEqual([200]);
  expect(ready).toMatchObject({
    media_id: mediaId,
    content_type: 'image/png',
    size_bytes: photo.length,
    filename: 'roof leak.png',
  });
  const got = await fetch(ready.url as string);
  expect(got.status).toBe(200);
  expect(Buffer.from(await got.arrayBuffer()).equals(photo)).toBe(true);
  expect(got.headers.get('content-disposition')).toBe(
    `attachment; filename="roof leak.png"; filename*=UTF-8''roof%20leak.png`,
  );
  expect(got.headers.get('content-type')).toBe('image/png');
});

it('an expired upload URL is refused by a verifying store', async () => {
  const signed = await h.storage.presignUpload({
    key: `sites/${hq}/media/expired.png`,
    contentType: 'image/png',
    sizeBytes: 3,
    expiresInS: 60,
    now: new Date(Date.now() - 120_000),
  });
  const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body: Buffer.from('abc') });
  expect(res.status).toBe(403);
  expect(proxy.refused.at(-1)).toBe('expired');
});
