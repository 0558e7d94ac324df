import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { chmod, mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { exportJWK, exportSPKI, generateKeyPair, importJWK, SignJWT, UnsecuredJWT } from 'jose';
import type { CryptoKey, JWK } from 'jose';
import { demoCompanies, demoSites, demoUserSubs } from '@platform/enterprise-db';
import type { DemoUser } from '@platform/enterprise-db';

export type { DemoUser } from '@platform/enterprise-db';

export type SigningAlg = 'RS256' | 'ES256';

export interface DemoUserProfile {
  sub: string;
  username: string;
  email: string;
  name: string;
}

/** The seeded demo users; their `sub` UUIDs are the enterprise seed's (`demoUserSubs`). */
export const demoUsers: Readonly<Record<DemoUser, DemoUserProfile>> = Object.freeze({
  alice: { sub: demoUserSubs.alice, username: 'alice', email: 'alice@acme.example', name: 'Alice Anders' },
  bob: { sub: demoUserSubs.bob, username: 'bob', email: 'bob@acme.example', name: 'Bob Brandt' },
  carol: { sub: demoUserSubs.carol, username: 'carol', email: 'carol@borealis.example', name: 'Carol Chen' },
  dave: { sub: demoUserSubs.dave, username: 'dave', email: 'dave@example.com', name: 'Dave Doe' },
});

/** The operations client of the platform realm: the device gateway accepts its tokens on /api (issue 42 §2). */
export const OPERATIONS_CLIENT = 'platform-operations';

export interface OpsUserProfile {
  sub: string;
  username: string;
  name: string;
  /** The operations client's role (`resource_access.platform-operations.roles`). */
  role: 'viewer' | 'operator' | 'admin';
  /** `fleet_sites` (null: not limited by site). */
  sites: readonly string[] | null;
  /** `fleet_companies` (null: not limited by company). */
  companies: readonly string[] | null;
}

/**
 * The realm's demo operations people (deploy/keycloak/platform-realm.json has the same): an unscoped admin, an
 * operator of Acme HQ only (a contractor), and a viewer of Borealis Estates' sites.
 */
export const opsUsers = Object.freeze({
  olga: {
    sub: '0b0a11ce-0000-4000-8000-0000000001a0',
    username: 'olga',
    name: 'Olga Ops',
    role: 'admin',
    sites: null,
    companies: null,
  },
  oscar: {
    sub: '0b0a11ce-0000-4000-8000-0000000005ca',
    username: 'oscar',
    name: 'Oscar Contractor',
    role: 'operator',
    sites: [demoSites.acmeHq.id],
    companies: null,
  },
  vera: {
    sub: '0b0a11ce-0000-4000-8000-00000000fe4a',
    username: 'vera',
    name: 'Vera Viewer',
    role: 'viewer',
    sites: null,
    companies: [demoCompanies.borealis.id],
  },
} as const satisfies Record<string, OpsUserProfile>);

export type OpsUser = keyof typeof opsUsers;

/** The claims of an operations token: the client's role and the fleet scope, as the realm's mappers write them. */
export function opsClaims(profile: OpsUserProfile): Claims {
  return {
    sub: profile.sub,
    preferred_username: profile.username,
    name: profile.name,
    aud: OPERATIONS_CLIENT,
    azp: OPERATIONS_CLIENT,
    role: undefined,
    resource_access: { [OPERATIONS_CLIENT]: { roles: [profile.role] } },
    ...(profile.sites === null ? {} : { fleet_sites: [...profile.sites] }),
    ...(profile.companies === null ? {} : { fleet_companies: [...profile.companies] }),
  };
}

export interface StartIssuerOptions {
  /** TCP port on `host`. Default: any free port. */
  port?: number;
  /** Default `127.0.0.1`. */
  host?: string;
  /** Keycloak realm in the paths and `iss`. Default `platform`. */
  realm?: string;
  /** Keycloak client the tokens are issued to (`azp`, `aud`). Default `platform-enterprise-web`. */
  clientId?: string;
  /**
   * JSON file holding the signing keys (private JWKs, mode 0600), created when absent. The local stack
   * keeps its keys there so `npm run token` can sign for the running issuer, and tokens survive restarts.
   * Default: fresh keys in memory.
   */
  keyStore?: string;
}

export interface SignOptions {
  /** Default RS256. */
  alg?: SigningAlg;
  /** A kid from `addKey()`; default: the issuer's first key of `alg`. */
  kid?: string;
  /** Lifetime in seconds from now (negative: already expired). Default 300. */
  expiresInS?: number;
  /** Sets `nbf` this many seconds from now (positive: not yet valid). Default: no `nbf`. */
  notBeforeS?: number;
}

/** Claims to add or override; a claim set to `undefined` is removed from the defaults. */
export type Claims = Record<string, unknown>;

/**
 * Tokens a correct verifier must reject:
 * - `alg-none`: unsigned (`alg: none`);
 * - `hs256-public-key`: HS256 with the issuer's RSA public key (PEM) as the HMAC secret, the
 *   algorithm-confusion attack, carrying the RSA key's `kid`;
 * - `unknown-kid`: RS256 by a key the JWKS does not publish, under a kid it does not know;
 * - `forged-kid`: RS256 by a foreign key under the kid of a published key (bad signature).
 */
export type UnsafeKind = 'alg-none' | 'hs256-public-key' | 'unknown-kid' | 'forged-kid';

export interface Issuer {
  /** e.g. `http://127.0.0.1:41234/realms/platform` (the `iss` claim). */
  issuerUrl: string;
  /** `{issuerUrl}/protocol/openid-connect/certs`. */
  jwksUrl: string;
  /** `{issuerUrl}/.well-known/openid-configuration`. */
  discoveryUrl: string;
  clientId: string;
  /** How many times the JWKS was fetched (to test verifier caching). */
  readonly jwksRequests: number;
  /** A Keycloak-shaped access token with `claims` merged over the defaults. */
  sign(claims?: Claims, options?: SignOptions): Promise<string>;
  signUnsafe(kind: UnsafeKind, claims?: Claims): Promise<string>;
  /** A token for a seeded demo user (sub, preferred_username, email, name) plus `extra` claims. */
  demoToken(user: DemoUser, extra?: Claims, options?: SignOptions): Promise<string>;
  /** An operations token (client platform-operations) for a demo operations user, plus `extra` claims. */
  opsToken(user: OpsUser, extra?: Claims, options?: SignOptions): Promise<string>;
  /** Publishes a new key (key rotation); returns its kid. */
  addKey(alg?: SigningAlg): Promise<string>;
  /** Withdraws a key from the JWKS; tokens it signed no longer verify after a refresh. */
  removeKey(kid: string): void;
  stop(): Promise<void>;
}

interface SigningKey {
  kid: string;
  alg: SigningAlg;
  privateKey: CryptoKey;
  publicJwk: JWK;
  publicPem: string;
}

async function createSigningKey(
  alg: SigningAlg,
  kid = `${alg.toLowerCase()}-${randomBytes(6).toString('hex')}`,
) {
  const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
  const publicJwk = { ...(await exportJWK(publicKey)), kid, alg, use: 'sig' };
  const key: SigningKey = { kid, alg, privateKey, publicJwk, publicPem: await exportSPKI(publicKey) };
  return key;
}

function base64url(data: string | Buffer): string {
  return Buffer.from(data).toString('base64url');
}

/** Signing keys from `keyStore` when it exists, else new RS256 and ES256 keys (saved there if given). */
async function initialKeys(keyStore: string | undefined): Promise<SigningKey[]> {
  if (keyStore !== undefined) {
    let text: string | undefined;
    try {
      text = await readFile(keyStore, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    if (text !== undefined) {
      const stored = JSON.parse(text) as { keys: Array<{ kid: string; alg: SigningAlg; privateJwk: JWK }> };
      return Promise.all(
        stored.keys.map(async ({ kid, alg, privateJwk }) => {
          const privateKey = (await importJWK(privateJwk, alg, { extractable: true })) as CryptoKey;
          const { d: _d, p: _p, q: _q, dp: _dp, dq: _dq, qi: _qi, ...publicOnly } = privateJwk;
          const publicKey = (await importJWK(publicOnly, alg, { extractable: true })) as CryptoKey;
          const publicJwk = { ...publicOnly, kid, alg, use: 'sig' };
          return { kid, alg, privateKey, publicJwk, publicPem: await exportSPKI(publicKey) };
        }),
      );
    }
  }
  const keys = [await createSigningKey('RS256'), await createSigningKey('ES256')];
  if (keyStore !== undefined) {
    const stored = await Promise.all(
      keys.map(async (k) => ({ kid: k.kid, alg: k.alg, privateJwk: await exportJWK(k.privateKey) })),
    );
    await mkdir(dirname(keyStore), { recursive: true });
    await writeFile(keyStore, JSON.stringify({ keys: stored }, null, 2), { mode: 0o600 });
    await chmod(keyStore, 0o600);
  }
  return keys;
}

/** Signs Keycloak-shaped access tokens with `keys` for `issuerUrl` (shared by the issuer and the dev signer). */
function tokenSigner(keys: SigningKey[], issuerUrl: string, clientId: string) {
  const payloadFor = (claims: Claims, expiresInS: number, notBeforeS?: number): Claims => {
    const now = Math.floor(Date.now() / 1000);
    const merged: Claims = {
      exp: now + expiresInS,
      iat: now,
      ...(notBeforeS === undefined ? {} : { nbf: now + notBeforeS }),
      jti: randomUUID(),
      iss: issuerUrl,
      aud: clientId,
      sub: demoUsers.dave.sub,
      typ: 'Bearer',
      azp: clientId,
      scope: 'openid profile email',
      role: 'enterprise_portal_role',
      ...claims,
    };
    for (const [name, value] of Object.entries(merged)) if (value === undefined) delete merged[name];
    return merged;
  };

  const keyFor = (alg: SigningAlg, kid?: string): SigningKey => {
    const key = kid === undefined ? keys.find((k) => k.alg === alg) : keys.find((k) => k.kid === kid);
    if (key === undefined) throw new Error(`issuer has no ${kid === undefined ? alg : `key "${kid}"`}`);
    return key;
  };

  const signWith = (key: SigningKey, kid: string, payload: Claims): Promise<string> =>
    new SignJWT(payload).setProtectedHeader({ alg: key.alg, kid, typ: 'JWT' }).sign(key.privateKey);

  const sign = async (claims: Claims = {}, signOptions: SignOptions = {}): Promise<string> => {
    const key = keyFor(signOptions.alg ?? 'RS256', signOptions.kid);
    return signWith(key, key.kid, payloadFor(claims, signOptions.expiresInS ?? 300, signOptions.notBeforeS));
  };

  const demoToken = (user: DemoUser, extra: Claims = {}, signOptions: SignOptions = {}): Promise<string> => {
    const profile = demoUsers[user];
    return sign(
      {
        sub: profile.sub,
        preferred_username: profile.username,
        email: profile.email,
        email_verified: true,
        name: profile.name,
        ...extra,
      },
      signOptions,
    );
  };
  const opsToken = (user: OpsUser, extra: Claims = {}, signOptions: SignOptions = {}): Promise<string> =>
    sign({ ...opsClaims(opsUsers[user]), ...extra }, signOptions);
  return { payloadFor, keyFor, signWith, sign, demoToken, opsToken };
}

export interface DevSigner {
  sign(claims?: Claims, options?: SignOptions): Promise<string>;
  demoToken(user: DemoUser, extra?: Claims, options?: SignOptions): Promise<string>;
  opsToken(user: OpsUser, extra?: Claims, options?: SignOptions): Promise<string>;
}

/**
 * Signs tokens with a key store's keys without serving anything: `npm run token` uses it to mint a
 * token that the running local stack's issuer (same key store, same issuer URL) vouches for.
 */
export async function openDevSigner(options: {
  keyStore: string;
  issuerUrl: string;
  clientId?: string;
}): Promise<DevSigner> {
  const { sign, demoToken, opsToken } = tokenSigner(
    await initialKeys(options.keyStore),
    options.issuerUrl,
    options.clientId ?? 'platform-enterprise-web',
  );
  return { sign, demoToken, opsToken };
}

/**
 * An in-process OpenID provider that looks like Keycloak to a verifier: the realm's discovery
 * document and JWKS at Keycloak's paths, RS256 and ES256 keys with kids, and access tokens with
 * Keycloak's claim shape (iss, sub, aud, azp, typ `Bearer`, preferred_username, ...) plus the
 * `role` claim PostgREST switches to.
 */
export async function startIssuer(options: StartIssuerOptions = {}): Promise<Issuer> {
  const realm = options.realm ?? 'platform';
  const clientId = options.clientId ?? 'platform-enterprise-web';
  const host = options.host ?? '127.0.0.1';
  const keys: SigningKey[] = await initialKeys(options.keyStore);
  let jwksRequests = 0;

  const paths = {
    jwks: `/realms/${realm}/protocol/openid-connect/certs`,
    discovery: `/realms/${realm}/.well-known/openid-configuration`,
  };
  let issuerUrl = '';

  const server = createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://issuer').pathname;
    const send = (status: number, body: unknown): void => {
      res.writeHead(status, { 'Content-Type': 'application/json', 'Cache-Control': 'no-cache' });
      res.end(JSON.stringify(body));
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      send(405, { error: 'method_not_allowed' });
    } else if (path === paths.jwks) {
      jwksRequests++;
      send(200, { keys: keys.map((k) => k.publicJwk) });
    } else if (path === paths.discovery) {
      send(200, {
        issuer: issuerUrl,
        authorization_endpoint: `${issuerUrl}/protocol/openid-connect/auth`,
        token_endpoint: `${issuerUrl}/protocol/openid-connect/token`,
        userinfo_endpoint: `${issuerUrl}/protocol/openid-connect/userinfo`,
        jwks_uri: `${issuerUrl}/protocol/openid-connect/certs`,
        response_types_supported: ['code'],
        subject_types_supported: ['public'],
        id_token_signing_alg_values_supported: ['RS256', 'ES256'],
        grant_types_supported: ['authorization_code', 'refresh_token'],
      });
    } else {
      send(404, { error: 'not_found' });
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, host, () => {
      server.removeListener('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  issuerUrl = `http://${host}:${port}/realms/${realm}`;

  const { payloadFor, keyFor, signWith, sign, demoToken, opsToken } = tokenSigner(keys, issuerUrl, clientId);

  return {
    issuerUrl,
    jwksUrl: `${issuerUrl}/protocol/openid-connect/certs`,
    discoveryUrl: `${issuerUrl}/.well-known/openid-configuration`,
    clientId,
    get jwksRequests() {
      return jwksRequests;
    },
    sign,
    async signUnsafe(kind, claims = {}) {
      const payload = payloadFor(claims, 300);
      const rsa = keyFor('RS256');
      switch (kind) {
        case 'alg-none':
          return new UnsecuredJWT(payload).encode();
        case 'hs256-public-key': {
          const signingInput = `${base64url(JSON.stringify({ alg: 'HS256', kid: rsa.kid, typ: 'JWT' }))}.${base64url(JSON.stringify(payload))}`;
          const signature = createHmac('sha256', rsa.publicPem).update(signingInput).digest('base64url');
          return `${signingInput}.${signature}`;
        }
        case 'unknown-kid':
          return signWith(
            await createSigningKey('RS256'),
            `unknown-${randomBytes(4).toString('hex')}`,
            payload,
          );
        case 'forged-kid':
          return signWith(await createSigningKey('RS256'), rsa.kid, payload);
      }
    },
    demoToken,
    opsToken,
    async addKey(alg = 'RS256') {
      const key = await createSigningKey(alg);
      keys.push(key);
      return key.kid;
    },
    removeKey(kid) {
      const index = keys.findIndex((k) => k.kid === kid);
      if (index >= 0) keys.splice(index, 1);
    },
    async stop() {
      const closing = new Promise<void>((resolve, reject) => {
        server.close((err) => {
          if (err === undefined) resolve();
          else reject(err);
        });
      });
      server.closeAllConnections();
      await closing;
    },
  };
}
