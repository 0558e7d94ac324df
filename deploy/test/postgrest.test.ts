// PostgREST's configuration (compose, Kubernetes, enterprise-db's postgrest.conf) against a database the
// migrations built: the same roles, schema and functions PostgREST will meet in production.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { API_ROLE, AUTHENTICATOR, enterpriseMigrations } from '@platform/enterprise-db';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';
import {
  checkKustomization,
  findObject,
  objectValues,
  checkPostgrestAgainstDatabase,
  CLIENT_ID,
  isRecord,
  parseYamlDocuments,
  PORTAL_ROLE_CLAIM,
  settingsFromConfigFile,
  settingsFromEnvironment,
} from '../src/validate/index.js';
import type { PostgrestSettings } from '../src/validate/index.js';
import { readRepoFile, repoRoot } from './helpers.js';

const expectations = {
  defaultAuthenticator: AUTHENTICATOR,
  roleClaims: [PORTAL_ROLE_CLAIM],
  audience: CLIENT_ID,
};

function composeSettings(): PostgrestSettings {
  const doc = parseYamlDocuments(readRepoFile('docker-compose.yml'), { version: '1.2' })[0];
  const env =
    isRecord(doc) && isRecord(doc.services) && isRecord(doc.services.postgrest)
      ? doc.services.postgrest.environment
      : {};
  return settingsFromEnvironment(env as Record<string, string>);
}

async function kubernetesSettings(): Promise<PostgrestSettings> {
  const { objects } = await checkKustomization(repoRoot, 'dev');
  const configMap = objects.find(
    (o) => o.object.kind === 'ConfigMap' && o.object.metadata.name === 'postgrest-config',
  )!;
  // kustomize names the generated Secret postgrest-database-<hash> and stores its values base64-encoded.
  const secret = findObject(objects, 'Secret', 'postgrest-database')!;
  return {
    ...settingsFromEnvironment(configMap.object.data as Record<string, string>),
    'db-uri': objectValues(secret).url!,
  };
}

describe('PostgREST configuration against the migrated database', () => {
  let database: TestDatabase;
  beforeAll(async () => {
    database = await createTestDatabase({ migrations: [enterpriseMigrations] });
  });
  afterAll(async () => {
    await database.drop();
  });

  it('compose: schemas, roles, role switching and functions all exist and are granted', async () => {
    const settings = composeSettings();
    expect(settings['db-anon-role']).toBe('enterprise_portal_anon');
    expect(await checkPostgrestAgainstDatabase(settings, database.url, expectations)).toEqual([]);
  });

  it('Kubernetes: the ConfigMap and the overlay Secret agree with the database', async () => {
    expect(
      await checkPostgrestAgainstDatabase(await kubernetesSettings(), database.url, expectations),
    ).toEqual([]);
  }, 60_000);

  // The file belongs to enterprise-db (its local PostgREST setup); checked whenever it is in the tree.
  const confPath = join(repoRoot, 'packages/enterprise-db/postgrest/postgrest.conf');
  it('enterprise-db postgrest.conf agrees too (when present)', async () => {
    if (!existsSync(confPath)) return;
    const settings = settingsFromConfigFile(readRepoFile('packages/enterprise-db/postgrest/postgrest.conf'));
    expect(settings['db-anon-role']).toBe('enterprise_portal_anon');
    expect(await checkPostgrestAgainstDatabase(settings, database.url, expectations)).toEqual([]);
  });

  describe('fails on a broken configuration', () => {
    const cases: [string, (s: PostgrestSettings) => PostgrestSettings, RegExp][] = [
      [
        'unknown schema',
        (s) => ({ ...s, 'db-schemas': 'enterprise_ap' }),
        /schema enterprise_ap does not exist/,
      ],
      [
        'unknown anonymous role',
        (s) => ({ ...s, 'db-anon-role': 'web_anon' }),
        /role web_anon does not exist/,
      ],
      [
        'anonymous role with privileges',
        (s) => ({ ...s, 'db-anon-role': PORTAL_ROLE_CLAIM }),
        /has privileges on enterprise_api\./,
      ],
      [
        'misspelt pre-request function',
        (s) => ({ ...s, 'db-pre-request': 'postgrest.prerequest' }),
        /postgrest.prerequest\(\) does not exist/,
      ],
      [
        'unqualified pre-config function',
        (s) => ({ ...s, 'db-pre-config': 'pre_config' }),
        /must be schema-qualified/,
      ],
      [
        'audience other than the realm client',
        (s) => ({ ...s, 'jwt-aud': 'account' }),
        /jwt-aud must be platform-enterprise-web/,
      ],
      [
        'a login that is not NOINHERIT',
        (s) => ({ ...s, 'db-uri': 'postgres://enterprise_api_login:x@db/platform' }),
        /must be NOINHERIT/,
      ],
    ];
    it.each(cases)('%s', async (_name, mutate, expected) => {
      const problems = await checkPostgrestAgainstDatabase(
        mutate(composeSettings()),
        database.url,
        expectations,
      );
      expect(problems.map((p) => p.message).join('\n')).toMatch(expected);
    });

    it('a role claim the authenticator cannot switch to', async () => {
      const problems = await checkPostgrestAgainstDatabase(composeSettings(), database.url, {
        ...expectations,
        roleClaims: [API_ROLE],
      });
      expect(problems.map((p) => p.message).join('\n')).toMatch(
        /authenticator cannot switch to enterprise_api_role/,
      );
    });
  });
});
