// End to end over real sockets, against each test store (s3rver and Ceph's RADOS Gateway; both check
// presigned URLs as S3 does): the portal asks for an upload intent, uploads through the presigned URL, the
// store's ObjectCreated event reaches the webhook, and the file becomes downloadable.
import { createServer } from 'node:http';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { demoSites } from '@platform/enterprise-db';
import { OBJECT_STORE_KINDS } from '@platform/testkit';
import { startHarness } from './support/harness.js';
import type { Harness } from './support/harness.js';
import { waitFor } from './support/wait.js';

const hq = demoSites.acmeHq.id;

/** The S3 error code of a refusal. */
async function errorCode(res: Response): Promise<string | undefined> {
  return /<Code>([^<]+)<\/Code>/.exec(await res.text())?.[1];
}

describe.each(OBJECT_STORE_KINDS)('against %s', (store) => {
  let h: Harness;
  let server: Server;
  let base: string;

  beforeAll(async () => {
    h = await startHarness({ store, forwardEvents: true });
    server = createServer(h.app);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    h.setEventTarget(`${base}/internal/media/object-created`);
  }, 60_000);
  afterAll(async () => {
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
    await h?.close();
  });

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
      body: JSON.stringify({
        filename: 'roof leak.png',
        content_type: 'image/png',
        size_bytes: photo.length,
      }),
    });
    expect(created.status).toBe(201);
    const mediaId = created.body.media_id as string;
    const upload = created.body.upload as Upload;

    // Tampering is refused by the store: another type, another length, a longer expiry.
    const refusals = [
      await fetch(upload.url, { method: 'PUT', headers: { 'Content-Type': 'text/html' }, body: photo }),
      await fetch(upload.url, {
        method: 'PUT',
        headers: upload.headers,
        body: Buffer.concat([photo, photo]),
      }),
      await fetch(upload.url.replace('X-Amz-Expires=900', 'X-Amz-Expires=604800'), {
        method: 'PUT',
        headers: upload.headers,
        body: photo,
      }),
    ];
    for (const refused of refusals) {
      expect(refused.status).toBe(403);
      expect(await errorCode(refused)).toBe('SignatureDoesNotMatch');
    }
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

  it('an expired upload URL is refused by the store', async () => {
    const signed = await h.storage.presignUpload({
      key: `sites/${hq}/media/expired.png`,
      contentType: 'image/png',
      sizeBytes: 3,
      expiresInS: 60,
      now: new Date(Date.now() - 120_000),
    });
    const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body: Buffer.from('abc') });
    expect(res.status).toBe(403);
    expect(await errorCode(res)).toBe('AccessDenied');
  });
});
