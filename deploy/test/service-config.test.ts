// The environment that compose and Kubernetes give each service, checked against the service's own
// config schema: the services ignore variables they do not know, so a misspelt name would silently fall
// back to a default. Every name must be a property of the schema, and the whole set must load.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gatewayConfigSchema, loadGatewayConfig } from '@platform/device-gateway';
import { configSchema as workflowConfigSchema, loadWorkflowConfig } from '@platform/enterprise-workflow';
import {
  checkKustomization,
  findObject,
  isRecord,
  parseYamlDocuments,
  realmExpectations,
  workloadEnvironment,
} from '../src/validate/index.js';
import { breakText, readRepoFile, repoRoot } from './helpers.js';

/** Compose interpolation with placeholder values: ${A:?msg} → "placeholder-A", ${A:-d} → d. */
function interpolate(value: string): string {
  return value.replace(
    /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([?-])([^}]*))?\}/g,
    (_m, name: string, op?: string, arg?: string) =>
      op === '-' ? (arg ?? '') : `placeholder-${name.toLowerCase()}`,
  );
}

function composeEnvironment(text: string, service: string): Record<string, string> {
  const doc = parseYamlDocuments(text, { version: '1.2' })[0];
  const s = isRecord(doc) && isRecord(doc.services) ? doc.services[service] : undefined;
  const env = isRecord(s) && isRecord(s.environment) ? s.environment : {};
  return Object.fromEntries(Object.entries(env).map(([k, v]) => [k, interpolate(String(v as string))]));
}

const unknownNames = (env: Record<string, string>, schema: { properties: object }): string[] =>
  Object.keys(env).filter((name) => !(name in schema.properties));

describe('service environment in compose and Kubernetes matches the services’ config schemas', () => {
  const compose = readRepoFile('docker-compose.yml');

  it('compose: every gateway and workflow variable is known, and the set loads', () => {
    const gateway = composeEnvironment(compose, 'device-gateway');
    const workflow = composeEnvironment(compose, 'enterprise-workflow');
    expect(unknownNames(gateway, gatewayConfigSchema)).toEqual([]);
    expect(unknownNames(workflow, workflowConfigSchema)).toEqual([]);
    expect(() => loadGatewayConfig(gateway)).not.toThrow();
    expect(loadWorkflowConfig(workflow).s3.forcePathStyle).toBe(true);
  });

  it('compose: the gateway takes the realm’s tokens from the workflow’s issuer and JWKS, for the operations client', () => {
    const workflow = loadWorkflowConfig(composeEnvironment(compose, 'enterprise-workflow')).oidc;
    expect(loadGatewayConfig(composeEnvironment(compose, 'device-gateway')).oidc).toMatchObject({
      issuerUrl: workflow.issuerUrl,
      jwksUrl: workflow.jwksUrl,
      clientId: realmExpectations.operations.clientId,
    });
    expect(workflow.issuerUrl).toBe('http://localhost:8180/realms/platform');
    expect(workflow.jwksUrl).toBe('http://keycloak:8080/realms/platform/protocol/openid-connect/certs');
  });

  describe.each(['dev', 'production'] as const)('Kubernetes, overlay %s', (which) => {
    // A file a Secret volume mounts (API keys, webhook tokens) is read at load: a placeholder file stands in.
    let dir: string;
    beforeAll(() => {
      dir = mkdtempSync(join(tmpdir(), 'service-config-'));
      writeFileSync(join(dir, 'secret'), 'placeholder-token\n');
    });
    afterAll(() => {
      rmSync(dir, { recursive: true, force: true });
    });

    /** A Deployment's environment, a value held in a Secret replaced by a placeholder of the right shape. */
    const environment = async (deployment: string): Promise<Record<string, string>> => {
      const { objects } = await checkKustomization(repoRoot, which);
      const env = workloadEnvironment(objects, findObject(objects, 'Deployment', deployment)!);
      return Object.fromEntries(
        Object.entries(env).map(([name, value]) => [
          name,
          name.endsWith('_FILE')
            ? join(dir, 'secret')
            : (value ??
              (name === 'DATABASE_URL' ? 'postgres://login:placeholder@db/platform' : 'placeholder')),
        ]),
      );
    };

    it('ConfigMap keys and env names of both Deployments are known, and each set loads', async () => {
      const gateway = await environment('device-gateway');
      const workflow = await environment('enterprise-workflow');
      expect(unknownNames(gateway, gatewayConfigSchema)).toEqual([]);
      expect(unknownNames(workflow, workflowConfigSchema)).toEqual([]);
      expect(() => loadGatewayConfig(gateway)).not.toThrow();
      expect(() => loadWorkflowConfig(workflow)).not.toThrow();
    }, 60_000);

    it('the gateway takes the realm’s tokens from the workflow’s issuer and JWKS, for the operations client', async () => {
      const workflow = loadWorkflowConfig(await environment('enterprise-workflow')).oidc;
      expect(loadGatewayConfig(await environment('device-gateway')).oidc).toMatchObject({
        issuerUrl: workflow.issuerUrl,
        jwksUrl: workflow.jwksUrl,
        clientId: realmExpectations.operations.clientId,
      });
      // The in-cluster Keycloak (docs/operations.md "What an overlay expects from the cluster").
      expect(workflow.jwksUrl).toBe(
        'http://keycloak.identity.svc:8080/realms/platform/protocol/openid-connect/certs',
      );
    }, 60_000);
  });

  it('fails on a misspelt variable name', () => {
    const broken = breakText(
      compose,
      "      S3_FORCE_PATH_STYLE: 'true'",
      "      S3_FORCE_PATHSTYLE: 'true'",
    );
    expect(unknownNames(composeEnvironment(broken, 'enterprise-workflow'), workflowConfigSchema)).toEqual([
      'S3_FORCE_PATHSTYLE',
    ]);
  });
});
