// The authentication matrix (design §4.4): every portal endpoint × every way a token can be wrong,
// with real tokens from the testkit issuer (RS256/ES256 keys, Keycloak-shaped JWKS).
import http from 'node:http';
import net from 'node:net';
import { PassThrough } from 'node:stream';
import type { AddressInfo } from 'node:net';
import { validateProblemDocument } from '@platform/contracts';
import { demoRowId, demoSites, demoUserSubs } from '@platform/enterprise-db';
import { createLogger } from '@platform/service-kit';
import { freePort } from '@platform/testkit';
import request from 'supertest';
import { buildApp } from '../src/app.js';
import { createTokenVerifier } from '../src/auth/token-verifier.js';
import type { TokenVerifier, TokenVerifierSettings } from '../src/auth/token-verifier.js';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';

let h: Harness;
beforeAll(async () => {
  h = await startHarness({ jwksCooldownMs: 1000 });
});
afterAll(async () => {
  await h.close();
});

const hq = demoSites.acmeHq.id;

/** The service on the harness's database and store, with a verifier of the test's own settings. */
function appWithVerifier(verifier: TokenVerifier): ReturnType<typeof buildApp> {
  return buildApp({
    config: {
      media: { maxImageBytes: 1000, maxVideoBytes: 1000, uploadUrlTtlS: 60, downloadUrlTtlS: 60 },
      idempotencyTtlS: 60,
      webhookTokens: ['t'],
    },
    logger: createLogger({ service: 'test', level: 'error' }),
    db: h.db,
    storage: h.storage,
    verifier,
  });
}

/** One representative request per portal endpoint, each valid for alice. */
const endpoints = [
  {
    name: 'upload intent',
    send: (auth: Record<string, string>) =>
      request(h.app)
        .post(`/sites/${hq}/media/upload-intents`)
        .set(auth)
        .send({ filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 10 }),
    ok: 201,
  },
  {
    name: 'download',
    send: (auth: Record<string, string>) =>
      request(h.app)
        .get(`/sites/${hq}/media/${demoRowId('media_item', 'acmeHq', 1)}/download`)
        .set(auth),
    ok: 200,
  },
  {
    name: 'decision',
    send: (auth: Record<string, string>) =>
      request(h.app)
        .post(`/sites/${hq}/work-items/${demoRowId('work_item', 'acmeHq', 4)}/decision`)
        .set(auth)
        .send({ decision: 'accept' }),
    ok: 200,
  },
] as const;

interface TokenCase {
  name: string;
  token: () => Promise<string | undefined>;
  status: number;
  code: string;
}

const cases: TokenCase[] = [
  { name: 'no token', token: () => Promise.resolve(undefined), status: 401, code: 'unauthorized' },
  { name: 'not a JWT', token: () => Promise.resolve('abc.def.ghi'), status: 401, code: 'unauthorized' },
  {
    name: 'expired',
    token: () => h.issuer.demoToken('alice', {}, { expiresInS: -60 }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'not yet valid',
    token: () => h.issuer.demoToken('alice', {}, { notBeforeS: 120 }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'alg none',
    token: () => h.issuer.signUnsafe('alg-none', { sub: aliceSub }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'HS256 signed with the public key',
    token: () => h.issuer.signUnsafe('hs256-public-key', { sub: aliceSub }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'unknown kid',
    token: () => h.issuer.signUnsafe('unknown-kid', { sub: aliceSub }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'forged signature under a known kid',
    token: () => h.issuer.signUnsafe('forged-kid', { sub: aliceSub }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'wrong iss',
    token: () => h.issuer.demoToken('alice', { iss: 'http://127.0.0.1:1/realms/other' }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'wrong azp and aud',
    token: () => h.issuer.demoToken('alice', { azp: 'other-client', aud: 'account' }),
    status: 401,
    code: 'unauthorized',
  },
  { name: 'no sub', token: () => h.issuer.sign({ sub: undefined }), status: 401, code: 'unauthorized' },
  {
    name: 'an ID token (typ ID) carrying the role',
    token: () => h.issuer.demoToken('alice', { typ: 'ID' }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'NUL character in a claim',
    token: () => h.issuer.demoToken('alice', { name: 'Alice\u0000Anders' }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'an unpaired surrogate in a claim',
    token: () => h.issuer.demoToken('alice', { name: 'a\ud800b' }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'an unpaired low surrogate in a nested claim',
    token: () => h.issuer.demoToken('alice', { realm_access: { roles: ['x\udc00'] } }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'issued in the future (iat two minutes ahead)',
    token: () => h.issuer.demoToken('alice', { iat: Math.floor(Date.now() / 1000) + 120 }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'claiming a lifetime of two hours',
    token: () => h.issuer.demoToken('alice', {}, { expiresInS: 7200 }),
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'claiming to live until exp 1e300',
    token: () => h.issuer.demoToken('alice', { exp: 1e300 }),
    status: 401,
    code: 'unauthorized',
  },
  {
    // RFC 7515 §2 and §7.1: each part is BASE64URL, which RFC 7515 §2 defines without padding; a lenient
    // decoder reads the same bytes, so the token would verify and be a second spelling of the same token.
    name: 'signature with "==" appended (not canonical base64url)',
    token: async () => `${await h.issuer.demoToken('alice')}==`,
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'signature whose unused last bits are not zero (RFC 4648 §3.5: not canonical)',
    token: async () => {
      const token = await h.issuer.demoToken('alice');
      // An RS256 signature is 256 bytes: 342 characters carrying 2,052 bits, the last 4 unused. Flipping the
      // lowest bit of the last character changes only those.
      const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
      const last = alphabet.indexOf(token.at(-1)!);
      return token.slice(0, -1) + alphabet[last ^ 1]!;
    },
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'a padded payload (not canonical base64url)',
    token: async () => {
      const [header, payload, signature] = (await h.issuer.demoToken('alice')).split('.');
      return `${header}.${payload}${'='.repeat((4 - (payload!.length % 4)) % 4 || 4)}.${signature}`;
    },
    status: 401,
    code: 'unauthorized',
  },
  {
    name: 'wrong role',
    token: () => h.issuer.demoToken('alice', { role: 'enterprise_portal_anon' }),
    status: 403,
    code: 'forbidden',
  },
  {
    name: 'no role',
    token: () => h.issuer.demoToken('alice', { role: undefined }),
    status: 403,
    code: 'forbidden',
  },
  { name: 'other tenant (carol)', token: () => h.issuer.demoToken('carol'), status: 404, code: 'not_found' },
  {
    name: 'signed in without access (dave)',
    token: () => h.issuer.demoToken('dave'),
    status: 404,
    code: 'not_found',
  },
];

const aliceSub = demoUserSubs.alice;

describe.each(endpoints)('$name', ({ send, ok }) => {
  it('succeeds for alice with RS256 and with ES256', async () => {
    expect((await send({ Authorization: `Bearer ${await h.issuer.demoToken('alice')}` })).status).toBe(ok);
    const es = await h.issuer.demoToken('alice', {}, { alg: 'ES256' });
    expect((await send({ Authorization: `Bearer ${es}` })).status).toBe(ok);
  });

  it.each(cases)('$name → $status $code, with no data in the body', async ({ token, status, code }) => {
    const value = await token();
    const res = await send(value === undefined ? {} : { Authorization: `Bearer ${value}` });
    expect(res.status).toBe(status);
    expect(res.body.code).toBe(code);
    expect(validateProblemDocument(res.body).ok).toBe(true);
    expect(Object.keys(res.body as object).sort()).toEqual([
      'code',
      'detail',
      'request_id',
      'status',
      'title',
      'type',
    ]);
    // Every 401 names the scheme (design §2); other statuses carry no challenge.
    expect(/^Bearer realm="platform"/.test(String(res.headers['www-authenticate']))).toBe(status === 401);
  });
});

describe('credentials before bodies', () => {
  it.each([
    ['the webhook without a token', '/internal/media/object-created', undefined],
    ['the webhook with a wrong token', '/internal/media/object-created', 'Bearer wrong-token'],
    ['the webhook path with a trailing slash', '/internal/media/object-created/', undefined],
    ['the webhook path in capitals', '/INTERNAL/media/object-created', 'Bearer wrong-token'],
    ['an upload intent path in capitals', `/SITES/${hq}/media/upload-intents`, undefined],
    ['an upload intent without a token', `/sites/${hq}/media/upload-intents`, undefined],
    ['an upload intent with a forged token', `/sites/${hq}/media/upload-intents`, 'Bearer abc.def.ghi'],
  ])('%s is 401 before its body is read, whatever the body', async (_name, path, authorization) => {
    for (const [type, body] of [
      ['application/json', '{"Records": ['],
      ['application/json', JSON.stringify({ p: 'x'.repeat(70 * 1024) })],
      ['text/plain', 'hello'],
    ]) {
      const req = request(h.app).post(path).set('Content-Type', type!);
      if (authorization !== undefined) req.set('Authorization', authorization);
      const res = await req.send(body);
      expect(res.status).toBe(401);
      expect(res.body.code).toBe('unauthorized');
      expect(res.headers['www-authenticate']).toMatch(/^Bearer /);
    }
  });

  it('an unknown path is 404 without its body being read (no route, so nothing to authenticate or parse)', async () => {
    for (const [type, body] of [
      ['application/json', '{"Records": ['],
      ['application/json', JSON.stringify({ p: 'x'.repeat(70 * 1024) })],
      ['text/plain', 'hello'],
    ]) {
      const res = await request(h.app).post('/no/such/route').set('Content-Type', type!).send(body);
      expect(res.status).toBe(404);
      expect(res.body.code).toBe('not_found');
    }
  });

  it('a valid caller still gets 400 for a malformed body', async () => {
    const token = await h.issuer.demoToken('alice');
    const res = await request(h.app)
      .post(`/sites/${hq}/media/upload-intents`)
      .set('Authorization', `Bearer ${token}`)
      .set('Content-Type', 'application/json')
      .send('{"filename": ');
    expect(res.status).toBe(400);
    expect(res.body.code).toBe('invalid_json');
  });
});

describe('a repeated Authorization header', () => {
  /** A POST with these header lines, written as they are over a raw socket (an HTTP client would merge them). */
  async function post(path: string, headerLines: string[]): Promise<{ status: number; text: string }> {
    const server = http.createServer(h.app).listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    try {
      const { port } = server.address() as AddressInfo;
      const body = JSON.stringify({ filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 10 });
      const raw = await new Promise<string>((resolve, reject) => {
        // Written, not ended: a half-closed socket would be closed by the server before an async route answers.
        const socket = net.connect(port, '127.0.0.1', () =>
          socket.write(
            [
              `POST ${path} HTTP/1.1`,
              'Host: 127.0.0.1',
              ...headerLines,
              'Content-Type: application/json',
              `Content-Length: ${Buffer.byteLength(body)}`,
              'Connection: close',
              '',
              body,
            ].join('\r\n'),
          ),
        );
        let text = '';
        socket.on('data', (c: Buffer) => (text += c.toString()));
        socket.on('end', () => resolve(text));
        socket.on('error', reject);
      });
      return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(raw)?.[1] ?? 0), text: raw };
    } finally {
      server.closeAllConnections();
      server.close();
    }
  }

  it('is 401 even when one copy carries a valid token, on portal and webhook routes', async () => {
    const token = await h.issuer.demoToken('alice');
    const intent = `/sites/${hq}/media/upload-intents`;
    for (const [path, good, detail] of [
      [intent, `Bearer ${token}`, 'more than one Authorization header'],
      [
        '/internal/media/object-created',
        `Bearer ${WEBHOOK_TOKENS[0]}`,
        'A valid webhook bearer token is required',
      ],
    ] as const) {
      for (const lines of [
        [`Authorization: ${good}`, 'Authorization: Bearer junk'],
        [`Authorization: ${good}`, `authorization: ${good}`],
      ]) {
        const res = await post(path, lines);
        expect(res.status).toBe(401);
        expect(res.text).toContain('"code":"unauthorized"');
        expect(res.text).toContain(detail);
        // RFC 6750 §3.1: a rejected credential is challenged with invalid_token (the webhook's was not).
        expect(res.text).toMatch(/^www-authenticate: Bearer realm="platform", error="invalid_token"\r$/im);
      }
    }
    // One copy of the same valid token is accepted: the refusal is the repetition.
    expect((await post(intent, [`Authorization: Bearer ${token}`])).status).toBe(201);
  });
});

describe('key handling', () => {
  it('refuses a token issued to another client even when its aud names ours (azp decides, as on the read surface)', async () => {
    const token = await h.issuer.demoToken('alice', {
      azp: 'another-frontend',
      aud: ['account', h.issuer.clientId],
    });
    const res = await endpoints[1].send({ Authorization: `Bearer ${token}` });
    expect(res.status).toBe(401);
    expect(res.body).toMatchObject({ detail: 'The access token was not issued for this client.' });
  });

  it('caches the JWKS and bounds refetches caused by unknown kids', async () => {
    await new Promise((resolve) => setTimeout(resolve, 1100)); // let the cooldown pass
    const before = h.issuer.jwksRequests;
    // Each unknown-kid token is signed by a fresh RSA key under a fresh kid (slow to make: 4 kids,
    // each presented 5 times).
    const forged = await Promise.all(
      Array.from({ length: 4 }, () => h.issuer.signUnsafe('unknown-kid', { sub: aliceSub })),
    );
    for (const token of forged.flatMap((t) => [t, t, t, t, t])) {
      expect((await endpoints[1].send({ Authorization: `Bearer ${token}` })).status).toBe(401);
    }
    // At most one refetch per cooldown (1 s here) however many unknown kids arrive.
    expect(h.issuer.jwksRequests - before).toBeLessThanOrEqual(1);
    const valid = await h.issuer.demoToken('alice');
    for (let i = 0; i < 5; i++)
      expect((await endpoints[1].send({ Authorization: `Bearer ${valid}` })).status).toBe(200);
    expect(h.issuer.jwksRequests - before).toBeLessThanOrEqual(1);
  });

  it('picks up a rotated key after the cooldown', async () => {
    const kid = await h.issuer.addKey('RS256');
    const token = await h.issuer.demoToken('alice', {}, { kid });
    await new Promise((resolve) => setTimeout(resolve, 1100));
    expect((await endpoints[1].send({ Authorization: `Bearer ${token}` })).status).toBe(200);
  });
});

describe('signing keys unreachable', () => {
  async function deadVerifierSettings(): Promise<TokenVerifierSettings> {
    const port = await freePort('tcp');
    return {
      issuerUrl: h.issuer.issuerUrl,
      jwksUrl: `http://127.0.0.1:${port}/certs`,
      clientId: h.issuer.clientId,
      requiredRole: 'enterprise_portal_role',
      clockToleranceS: 5,
      jwksCooldownMs: 1000,
      jwksCacheMaxAgeMs: 60_000,
      jwksTimeoutMs: 500,
      tokenCacheTtlMs: 60_000,
      tokenCacheMaxEntries: 100,
    };
  }

  it('/ready fetches the key set at most once per cooldown while the issuer fails', async () => {
    let fetches = 0;
    const failing = http.createServer((_req, res) => {
      fetches++;
      res.statusCode = 503;
      res.end();
    });
    await new Promise<void>((resolve) => failing.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = failing.address() as AddressInfo;
      const verifier = createTokenVerifier({
        ...(await deadVerifierSettings()),
        jwksUrl: `http://127.0.0.1:${port}/certs`,
      });
      const answers: boolean[] = [];
      for (let i = 0; i < 10; i++) answers.push(await verifier.keysLoaded());
      expect(answers).toEqual(answers.map(() => false));
      expect(fetches).toBe(1); // the cooldown is 1 s; ten probes in a row
    } finally {
      await new Promise((resolve) => failing.close(resolve));
    }
  });

  it('answers 503 with Retry-After (not 401) and /ready reports not ready', async () => {
    const verifier = createTokenVerifier(await deadVerifierSettings());
    const app = appWithVerifier(verifier);
    const token = await h.issuer.demoToken('alice');
    const res = await request(app)
      .get(`/sites/${hq}/media/${demoRowId('media_item', 'acmeHq', 1)}/download`)
      .set('Authorization', `Bearer ${token}`);
    expect(res.status).toBe(503);
    expect(res.body.code).toBe('backend_unavailable');
    expect(res.headers['retry-after']).toBe('5');
    const ready = await request(app).get('/ready');
    expect(ready.status).toBe(503);
    expect(ready.body.code).toBe('not_ready');
    expect(ready.body.detail).toContain('signing_keys');
    // Liveness stays independent of dependencies.
    expect((await request(app).get('/health')).status).toBe(200);
  });

  it('/ready is 200 with the real issuer and database', async () => {
    const res = await request(h.app).get('/ready');
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ status: 'ready', checks: { database: 'ok', signing_keys: 'ok' } });
  });
});

describe('clock skew on a full verification', () => {
  // Its own tolerance (not the harness's 5 s) and no token cache, so every request is checked in
  // full by jose: signature, iss, exp and nbf against the configured skew.
  const TOLERANCE_S = 30;
  let app: ReturnType<typeof buildApp>;

  beforeAll(() => {
    app = appWithVerifier(
      createTokenVerifier({
        issuerUrl: h.issuer.issuerUrl,
        clientId: h.issuer.clientId,
        requiredRole: 'enterprise_portal_role',
        clockToleranceS: TOLERANCE_S,
        jwksCooldownMs: 1000,
        jwksCacheMaxAgeMs: 60_000,
        jwksTimeoutMs: 2000,
        tokenCacheTtlMs: 0,
        tokenCacheMaxEntries: 0,
      }),
    );
  });

  const download = (token: string) =>
    request(app)
      .get(`/sites/${hq}/media/${demoRowId('media_item', 'acmeHq', 1)}/download`)
      .set('Authorization', `Bearer ${token}`);

  // Margins of 20 s or more either side of the tolerance keep a slow run from changing the answer.
  it.each([
    ['expired 10 s ago', { expiresInS: -10 }],
    ['not valid until 10 s from now', { notBeforeS: 10 }],
  ])('accepts a token %s (inside the tolerance)', async (_name, signOptions) => {
    const res = await download(await h.issuer.demoToken('alice', {}, signOptions));
    expect(res.status).toBe(200);
  });

  it.each([
    ['expired 60 s ago', { expiresInS: -60 }, 'The access token has expired.'],
    ['not valid until 60 s from now', { notBeforeS: 60 }, 'The access token is not valid yet.'],
  ])('refuses a token %s (beyond the tolerance) with 401', async (_name, signOptions, detail) => {
    const res = await download(await h.issuer.demoToken('alice', {}, signOptions));
    expect(res.status).toBe(401);
    expect(res.body).toMatchObject({ code: 'unauthorized', detail });
    expect(res.headers['www-authenticate']).toMatch(/^Bearer realm="platform"/);
  });
});

describe('verified-token cache', () => {
  /** A verifier on the harness issuer whose clock the test moves. */
  function cachingVerifier(options: { ttlMs?: number; maxEntries?: number } = {}) {
    let nowMs = Date.now();
    const verifier = createTokenVerifier({
      issuerUrl: h.issuer.issuerUrl,
      clientId: h.issuer.clientId,
      requiredRole: 'enterprise_portal_role',
      clockToleranceS: 5,
      jwksCooldownMs: 1000,
      jwksCacheMaxAgeMs: 60_000,
      jwksTimeoutMs: 2000,
      tokenCacheTtlMs: options.ttlMs ?? 60_000,
      tokenCacheMaxEntries: options.maxEntries ?? 100,
      now: () => nowMs,
    });
    return { verifier, advance: (ms: number) => (nowMs += ms) };
  }

  it('answers a repeated token from the cache with the same user', async () => {
    const { verifier } = cachingVerifier();
    const token = await h.issuer.demoToken('alice');
    const first = await verifier.verify(token);
    const second = await verifier.verify(token);
    expect(first.ok).toBe(true);
    expect(second).toEqual(first);
    expect(verifier.cacheStats()).toEqual({ hits: 1, misses: 1, entries: 1 });
  });

  it('still refuses a cached token once it expires (same tolerance as a full check)', async () => {
    const { verifier, advance } = cachingVerifier({ ttlMs: 300_000 });
    const token = await h.issuer.demoToken('alice', {}, { expiresInS: 60 });
    expect((await verifier.verify(token)).ok).toBe(true);
    advance(60_000); // at exp, but within the 5 s tolerance
    expect((await verifier.verify(token)).ok).toBe(true);
    advance(6_000); // past exp + tolerance
    expect(await verifier.verify(token)).toEqual({
      ok: false,
      reason: 'invalid_token',
      detail: 'The access token has expired.',
    });
    expect(verifier.cacheStats().entries).toBe(0);
    // The entry is gone: a full check gives the same answer at the same moment.
    expect(await verifier.verify(token)).toMatchObject({
      ok: false,
      detail: 'The access token has expired.',
    });
  });

  it('forgets an entry after its TTL and checks the token in full again', async () => {
    const { verifier, advance } = cachingVerifier({ ttlMs: 1000 });
    const token = await h.issuer.demoToken('alice');
    await verifier.verify(token);
    advance(1000);
    expect((await verifier.verify(token)).ok).toBe(true);
    expect(verifier.cacheStats()).toMatchObject({ hits: 0, misses: 2 });
  });

  it('never caches a refused token', async () => {
    const { verifier } = cachingVerifier();
    const wrongClient = await h.issuer.demoToken('alice', { azp: 'other-client', aud: 'account' });
    const noRole = await h.issuer.demoToken('alice', { role: 'enterprise_portal_anon' });
    for (const token of [wrongClient, wrongClient, noRole, noRole]) {
      expect((await verifier.verify(token)).ok).toBe(false);
    }
    expect(verifier.cacheStats()).toEqual({ hits: 0, misses: 4, entries: 0 });
  });

  it('holds at most the configured number of tokens, forgetting the oldest', async () => {
    const { verifier } = cachingVerifier({ maxEntries: 2 });
    const tokens = await Promise.all(['alice', 'bob', 'carol'].map((u) => h.issuer.demoToken(u as 'alice')));
    for (const token of tokens) await verifier.verify(token);
    expect(verifier.cacheStats().entries).toBe(2);
    await verifier.verify(tokens[2]!); // newest: still cached
    await verifier.verify(tokens[0]!); // oldest: forgotten, checked in full
    expect(verifier.cacheStats()).toMatchObject({ hits: 1, misses: 4 });
  });

  it('caches nothing when the TTL is 0', async () => {
    const { verifier } = cachingVerifier({ ttlMs: 0 });
    const token = await h.issuer.demoToken('alice');
    await verifier.verify(token);
    await verifier.verify(token);
    expect(verifier.cacheStats()).toEqual({ hits: 0, misses: 2, entries: 0 });
  });
});

describe('the client address in the request log', () => {
  /** The app as main.ts builds it behind the Ingress (TRUST_PROXY=1), logging into `lines`. */
  function appBehindIngress(lines: Array<Record<string, unknown>>) {
    const stream = new PassThrough();
    stream.on('data', (chunk: Buffer) => {
      for (const line of chunk.toString('utf8').split('\n'))
        if (line.trim() !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
    });
    return buildApp({
      config: {
        media: { maxImageBytes: 1000, maxVideoBytes: 1000, uploadUrlTtlS: 60, downloadUrlTtlS: 60 },
        idempotencyTtlS: 60,
        webhookTokens: ['webhook-token'],
        http: { trustProxy: 1 },
      },
      logger: createLogger({ service: 'test', level: 'info', stream }),
      db: h.db,
      storage: h.storage,
      verifier: h.verifier,
    });
  }

  it('is the peer on the internal webhook route (no Ingress in front of it), X-Forwarded-For on portal routes', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const app = appBehindIngress(lines);
    const forged = '203.0.113.77';
    const event = { Records: [{ eventName: 's3:TestEvent' }] };
    for (const token of ['webhook-token', 'wrong-token']) {
      await request(app)
        .post('/internal/media/object-created')
        .set('Authorization', `Bearer ${token}`)
        .set('X-Forwarded-For', forged)
        .send(event);
    }
    await request(app).put('/internal/media/object-created').set('X-Forwarded-For', forged);
    await request(app)
      .get('/sites/5e000000-0000-4000-8000-000000000a01/media/5e000000-0000-4000-8000-000000000b01/download')
      .set('X-Forwarded-For', forged);
    await new Promise((resolve) => setImmediate(resolve));
    const requests = lines.filter((l) => l.message === 'http request');
    const webhookLines = requests.filter((l) => l.route === '/internal/media/object-created');
    expect(webhookLines.map((l) => l.status)).toEqual([expect.any(Number), 401, 405]);
    for (const line of webhookLines) expect(line.ip).toMatch(/^(::ffff:)?127\.0\.0\.1$|^::1$/);
    expect(JSON.stringify(webhookLines)).not.toContain(forged);
    // Portal routes come through the Ingress, the one trusted hop: its X-Forwarded-For names the client.
    expect(requests.find((l) => String(l.route).startsWith('/sites/'))?.ip).toBe(forged);
  });
});
