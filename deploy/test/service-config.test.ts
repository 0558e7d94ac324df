// The environment that compose and Kubernetes give each service, checked against the service's own
// config schema: the services ignore variables they do not know, so a misspelt name would silently fall
// back to a default. Every name must be a property of the schema, and the whole set must load.
import { gatewayConfigSchema, loadGatewayConfig } from '@platform/device-gateway';
import { configSchema as workflowConfigSchema, loadWorkflowConfig } from '@platform/enterprise-workflow';
import { checkKustomization, isRecord, parseYamlDocuments } from '../src/validate/index.js';
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

  it('Kubernetes: ConfigMap keys and env names of both Deployments are known', async () => {
    const { objects } = await checkKustomization(repoRoot, 'dev');
    const names = (deployment: string, configMap: string): Record<string, string> => {
      const cm = objects.find((o) => o.object.kind === 'ConfigMap' && o.object.metadata.name === configMap)!;
      const dep = objects.find(
        (o) => o.object.kind === 'Deployment' && o.object.metadata.name === deployment,
      )!;
      const spec = dep.object.spec as { template: { spec: { containers: { env?: { name: string }[] }[] } } };
      const env = Object.fromEntries((spec.template.spec.containers[0]!.env ?? []).map((e) => [e.name, 'x']));
      return { ...(cm.object.data as Record<string, string>), ...env };
    };
    expect(unknownNames(names('device-gateway', 'device-gateway-config'), gatewayConfigSchema)).toEqual([]);
    expect(
      unknownNames(names('enterprise-workflow', 'enterprise-workflow-config'), workflowConfigSchema),
    ).toEqual([]);
  }, 60_000);

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
