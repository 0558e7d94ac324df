import { checkComposeFile, checkPlatformCompose, validateCompose } from '../src/validate/index.js';
import { breakText, readRepoFile, repoRoot } from './helpers.js';

const compose = readRepoFile('docker-compose.yml');
const envExample = readRepoFile('.env.example');
const messages = (text: string, env = envExample): string[] =>
  [...validateCompose(text, { envExample: env }), ...checkPlatformCompose(text)].map((p) => p.message);

describe('docker-compose.yml', () => {
  it('is valid against the Compose Specification schema and the platform rules', () => {
    expect(checkComposeFile(repoRoot)).toEqual([]);
  });

  it('fails on a misspelt service key (schema: additional property)', () => {
    const broken = breakText(
      compose,
      "    healthcheck:\n      test: ['CMD-SHELL'",
      "    healthchek:\n      test: ['CMD-SHELL'",
    );
    expect(messages(broken)).toContainEqual(
      expect.stringMatching(/services\/postgres must NOT have additional properties \(healthchek\)/),
    );
  });

  it('fails on a value of the wrong type', () => {
    const broken = breakText(
      compose,
      '      retries: 20\n    restart: unless-stopped',
      '      retries: 20\n    restart: [unless-stopped]',
    );
    expect(messages(broken)).toContainEqual('schema: /services/postgres/restart must be string');
  });

  it('fails when a dependency names an unknown service', () => {
    const broken = breakText(
      compose,
      /depends_on:\n {6}postgres:\n {8}condition: service_healthy\n {4}restart: 'no'/,
      "depends_on:\n      postgress:\n        condition: service_healthy\n    restart: 'no'",
    );
    expect(messages(broken)).toContainEqual(
      expect.stringContaining('depends_on names unknown service "postgress"'),
    );
  });

  it('fails on a literal secret', () => {
    const broken = breakText(compose, '${GATEWAY_API_KEYS:?set GATEWAY_API_KEYS in .env}', 'hunter2');
    expect(messages(broken)).toContainEqual(expect.stringContaining('GATEWAY_API_KEYS is a literal secret'));
  });

  it('fails when a variable is missing from .env.example', () => {
    const env = breakText(envExample, /^MINIO_WEBHOOK_TOKEN=.*$/m, '');
    expect(messages(compose, env)).toContainEqual('${MINIO_WEBHOOK_TOKEN} is not listed in .env.example');
  });

  it('fails when MinIO has no queue_dir for its webhook (events would be dropped)', () => {
    const broken = breakText(compose, /\n\s+MINIO_NOTIFY_WEBHOOK_QUEUE_DIR_WORKFLOW: .*/, '');
    expect(messages(broken)).toContainEqual('minio webhook WORKFLOW has no queue_dir');
  });

  it('fails when a service does not wait for the migration to complete', () => {
    const gateway = compose.slice(compose.indexOf('  device-gateway:'));
    const brokenGateway = breakText(
      gateway,
      'condition: service_completed_successfully',
      'condition: service_started',
    );
    const broken = compose.replace(gateway, brokenGateway);
    expect(messages(broken)).toContainEqual(
      'device-gateway must wait for migrate with condition service_completed_successfully',
    );
  });

  it('fails when the gateway has no GATEWAY_OIDC_ISSUER_URL (its /api would take API keys only)', () => {
    const broken = breakText(compose, /\n {6}GATEWAY_OIDC_ISSUER_URL: .*/, '');
    expect(messages(broken)).toContainEqual(
      'device-gateway.environment.GATEWAY_OIDC_ISSUER_URL is not set: its /api would take API keys only',
    );
  });

  it('fails when the gateway names another issuer or JWKS than the workflow (one realm)', () => {
    const broken = breakText(
      breakText(compose, /(GATEWAY_OIDC_ISSUER_URL: .*)\/realms\/platform/, '$1/realms/master'),
      /(GATEWAY_OIDC_JWKS_URL: http:\/\/)keycloak:8080/,
      '$1localhost:8180',
    );
    expect(messages(broken)).toEqual(
      expect.arrayContaining([
        "device-gateway's GATEWAY_OIDC_ISSUER_URL must be enterprise-workflow's OIDC_ISSUER_URL (one realm)",
        "device-gateway's GATEWAY_OIDC_JWKS_URL must be enterprise-workflow's OIDC_JWKS_URL",
      ]),
    );
  });

  it('fails on invalid YAML', () => {
    expect(messages(`${compose}\n  bad: [unclosed`).some((m) => m.startsWith('YAML:'))).toBe(true);
  });
});
