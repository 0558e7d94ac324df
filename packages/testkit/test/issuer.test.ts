import { createRemoteJWKSet, decodeProtectedHeader, exportSPKI, importJWK, jwtVerify } from 'jose';
import type { CryptoKey, JWK } from 'jose';
import { demoUserSubs } from '@platform/enterprise-db';
import { demoUsers, startIssuer } from '@platform/testkit';
import type { Issuer } from '@platform/testkit';

describe('startIssuer', () => {
  let issuer: Issuer;

  beforeAll(async () => {
    issuer = await startIssuer();
  });
  afterAll(async () => {
    await issuer.stop();
  });

  const verify = (token: string) =>
    jwtVerify(token, createRemoteJWKSet(new URL(issuer.jwksUrl)), {
      issuer: issuer.issuerUrl,
      audience: 'platform-enterprise-web',
      algorithms: ['RS256', 'ES256'],
    });

  it('serves a Keycloak-style discovery document pointing at its JWKS', async () => {
    expect(issuer.issuerUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/realms\/platform$/);
    const response = await fetch(`${issuer.issuerUrl}/.well-known/openid-configuration`);
    expect(response.status).toBe(200);
    const discovery = (await response.json()) as { issuer: string; jwks_uri: string };
    expect(discovery.issuer).toBe(issuer.issuerUrl);
    expect(discovery.jwks_uri).toBe(`${issuer.issuerUrl}/protocol/openid-connect/certs`);
    expect(discovery.jwks_uri).toBe(issuer.jwksUrl);

    const jwks = (await (await fetch(discovery.jwks_uri)).json()) as {
      keys: { kid: string; alg: string; d?: string }[];
    };
    expect(jwks.keys.map((k) => k.alg).sort()).toEqual(['ES256', 'RS256']);
    // Public halves only.
    expect(jwks.keys.every((k) => k.d === undefined)).toBe(true);
    expect(new Set(jwks.keys.map((k) => k.kid)).size).toBe(2);
  });

  it.each(['RS256', 'ES256'] as const)('issues %s tokens that verify against its JWKS', async (alg) => {
    const token = await issuer.demoToken('alice', {}, { alg });
    expect(decodeProtectedHeader(token)).toMatchObject({ alg, typ: 'JWT' });
    const { payload } = await verify(token);
    expect(payload).toMatchObject({
      iss: issuer.issuerUrl,
      sub: demoUsers.alice.sub,
      aud: 'platform-enterprise-web',
      azp: 'platform-enterprise-web',
      typ: 'Bearer',
      preferred_username: 'alice',
      role: 'enterprise_portal_role',
    });
    expect(payload.exp! - payload.iat!).toBe(300);
  });

  it('lets a test override or remove claims', async () => {
    const token = await issuer.sign({ role: 'something_else', azp: undefined, sub: 'x' });
    const { payload } = await verify(token);
    expect(payload.role).toBe('something_else');
    expect(payload).not.toHaveProperty('azp');
    expect(payload.sub).toBe('x');
  });

  it('produces expired and not-yet-valid tokens that jose rejects', async () => {
    await expect(verify(await issuer.sign({}, { expiresInS: -60 }))).rejects.toMatchObject({
      code: 'ERR_JWT_EXPIRED',
    });
    await expect(verify(await issuer.sign({}, { notBeforeS: 120 }))).rejects.toMatchObject({
      code: 'ERR_JWT_CLAIM_VALIDATION_FAILED',
      claim: 'nbf',
    });
  });

  it('produces unsafe tokens that a correct verifier rejects', async () => {
    await expect(verify(await issuer.signUnsafe('alg-none'))).rejects.toThrow();
    await expect(verify(await issuer.signUnsafe('unknown-kid'))).rejects.toMatchObject({
      code: 'ERR_JWKS_NO_MATCHING_KEY',
    });
    await expect(verify(await issuer.signUnsafe('forged-kid'))).rejects.toMatchObject({
      code: 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED',
    });

    const confused = await issuer.signUnsafe('hs256-public-key');
    await expect(verify(confused)).rejects.toThrow();
    // It is a real confusion token: a verifier using the RSA public key PEM as an HMAC secret accepts it.
    const jwks = (await (await fetch(issuer.jwksUrl)).json()) as { keys: JWK[] };
    const rsa = jwks.keys.find((k) => k.alg === 'RS256');
    expect(decodeProtectedHeader(confused)).toEqual({ alg: 'HS256', kid: rsa?.kid, typ: 'JWT' });
    const publicPem = await exportSPKI((await importJWK(rsa!, 'RS256', { extractable: true })) as CryptoKey);
    await expect(
      jwtVerify(confused, new TextEncoder().encode(publicPem), { algorithms: ['HS256'] }),
    ).resolves.toBeDefined();
  });

  it('rotates keys: a new kid is published, a removed one no longer verifies', async () => {
    const kid = await issuer.addKey('ES256');
    const token = await issuer.sign({}, { kid });
    expect(decodeProtectedHeader(token).kid).toBe(kid);
    await expect(verify(token)).resolves.toBeDefined();
    const before = issuer.jwksRequests;
    issuer.removeKey(kid);
    await expect(verify(token)).rejects.toMatchObject({ code: 'ERR_JWKS_NO_MATCHING_KEY' });
    expect(issuer.jwksRequests).toBeGreaterThan(before);
  });

  it('uses the seed’s fixed subjects for the demo users', () => {
    expect(Object.keys(demoUsers).sort()).toEqual(['alice', 'bob', 'carol', 'dave']);
    for (const [user, profile] of Object.entries(demoUsers)) {
      expect(profile.sub).toBe(demoUserSubs[user as keyof typeof demoUserSubs]);
    }
  });
});
