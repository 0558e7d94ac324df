// GET /api/config's answer (design §3.1): the anonymous keys, the named keys of the key file and the operations
// tokens' issuer, never a secret. A key file may hold only named keys (issue 42 §2), so no anonymous key is valid.
import { compileValidator, gatewayPublicConfigSchema } from '@platform/contracts';
import { pathsOf } from './helpers.js';

const validate = compileValidator<Record<string, unknown>>(gatewayPublicConfigSchema);

const FINGERPRINT = 'hmac-sha256:0123456789ab';
const HQ = '5e000000-0000-4000-8000-000000000a01';
const ACME = 'c0000000-0000-4000-8000-00000000ac3e';

const namedKey = {
  name: 'hq-tool',
  role: 'operator',
  sites: [HQ],
  companies: null,
  fingerprint: 'hmac-sha256:ba9876543210',
};

const config = {
  http_port: 8080,
  coap_port: 5683,
  database_url: 'postgres://gateway:***@db/platform',
  api_keys: { count: 1, fingerprints: [FINGERPRINT] },
  named_api_keys: [namedKey],
  api_keys_file: '/run/secrets/gateway-keys',
  oidc: { issuer_url: 'http://localhost:8081/realms/platform', client_id: 'platform-operations' },
  coap: {},
};

describe('GET /api/config', () => {
  it('accepts anonymous and named keys with the operations issuer', () => {
    expect(validate(config).ok).toBe(true);
  });

  it('accepts a key file of named keys only (no anonymous key) and no issuer', () => {
    const namedOnly = { ...config, api_keys: { count: 0, fingerprints: [] }, oidc: null };
    expect(validate(namedOnly).ok).toBe(true);
  });

  it('accepts a key limited to companies, and an unscoped one', () => {
    const keys = [
      { ...namedKey, name: 'acme-admin', role: 'admin', sites: null, companies: [ACME] },
      { ...namedKey, name: 'dashboard', role: 'viewer', sites: null },
    ];
    expect(validate({ ...config, named_api_keys: keys }).ok).toBe(true);
  });

  it.each([
    ['no role of the fleet', { role: 'owner' }, '/named_api_keys/0/role'],
    ['a name audit rows could not carry', { name: 'Has Space' }, '/named_api_keys/0/name'],
    [
      'an empty site list (a scope of nothing is written as no key)',
      { sites: [] },
      '/named_api_keys/0/sites',
    ],
    ['a site that is no uuid', { sites: ['hq'] }, '/named_api_keys/0/sites'],
    ['an unkeyed fingerprint', { fingerprint: 'sha256:0123456789ab' }, '/named_api_keys/0/fingerprint'],
    ['the key itself', { key: 'secret-key-0123456789' }, '/named_api_keys/0/key'],
  ])('refuses a named key with %s', (_what, change, path) => {
    const result = validate({ ...config, named_api_keys: [{ ...namedKey, ...change }] });
    expect(pathsOf(result)).toContain(path);
  });

  it('refuses an answer without the named keys or the issuer, and an issuer with more than its two fields', () => {
    const { named_api_keys: _named, oidc: _oidc, ...older } = config;
    expect(pathsOf(validate(older)).sort()).toEqual(['/named_api_keys', '/oidc']);
    const leaky = { ...config, oidc: { ...config.oidc, client_secret: 'x' } };
    expect(pathsOf(validate(leaky))).toContain('/oidc/client_secret');
  });

  it('refuses a negative count of anonymous keys', () => {
    expect(pathsOf(validate({ ...config, api_keys: { count: -1, fingerprints: [] } }))).toEqual([
      '/api_keys/count',
    ]);
  });
});
