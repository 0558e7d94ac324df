// Every offline check of the repository's production-shape files, in one place for the tests and the
// `validate` command. `root` is the repository root.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { demoUserSubs } from '@platform/enterprise-db';
import { checkPlatformCompose, validateCompose } from './compose.js';
import type { DockerfileExpectations } from './dockerfile.js';
import { validateDockerfile } from './dockerfile.js';
import { checkImageTags, checkPlatformKubernetes, validateKubernetes } from './kubernetes.js';
import { findObject, hasGeneratedName, kubectlKustomize, objectValues } from './kubectl.js';
import type { K8sObject, RenderedObject } from './kubectl.js';
import {
  checkAlertRules,
  checkDashboard,
  checkPrometheusRuleEqualsFile,
  dashboardExpressions,
  ruleExpressions,
} from './monitoring.js';
import type { ExpressionUse } from './monitoring.js';
import type { Problem } from './problems.js';
import type { RealmExpectations } from './realm.js';
import { validateRealm } from './realm.js';

export const CLIENT_ID = 'platform-enterprise-web';
export const PORTAL_ROLE_CLAIM = 'enterprise_portal_role';

export const realmExpectations: RealmExpectations = {
  realm: 'platform',
  clientId: CLIENT_ID,
  roleClaim: PORTAL_ROLE_CLAIM,
  users: { ...demoUserSubs },
  operations: {
    clientId: 'platform-operations',
    roles: ['viewer', 'operator', 'admin'],
    scopeClaims: ['fleet_sites', 'fleet_companies'],
  },
};

/** Each image, the workspaces it may copy and what it must compile. */
export const dockerfiles: Record<string, DockerfileExpectations> = {
  'services/device-gateway/Dockerfile': {
    allowedSources: ['packages/contracts', 'packages/service-kit', 'services/device-gateway'],
    buildTargets: ['services/device-gateway'],
    healthcheck: true,
    holdsHangups: true,
  },
  'services/enterprise-workflow/Dockerfile': {
    allowedSources: [
      'packages/contracts',
      'packages/service-kit',
      'packages/enterprise-db',
      'services/enterprise-workflow',
    ],
    buildTargets: ['services/enterprise-workflow'],
    healthcheck: true,
    holdsHangups: true,
  },
  'deploy/Dockerfile': {
    allowedSources: [
      'packages/contracts',
      'packages/service-kit',
      'packages/enterprise-db',
      'services/device-gateway',
      'deploy/src',
      'deploy/tsconfig.json',
    ],
    buildTargets: ['deploy'],
    healthcheck: false,
  },
};

/** `overlay`: what a cluster receives (its images must be pinned); the base only feeds the overlays. */
export const kustomizations = {
  base: { dir: 'deploy/k8s/base', externalSecrets: true, overlay: false },
  dev: { dir: 'deploy/k8s/overlays/dev', externalSecrets: false, overlay: true },
  /** The example a production overlay is copied from: Secrets from the cluster, images from a registry. */
  production: { dir: 'deploy/k8s/overlays/production-example', externalSecrets: true, overlay: true },
} as const;

/** The Secrets the dev overlay's secretGenerator makes, each of whose values is a `dev-only-*` placeholder. */
const DEV_SECRETS = [
  'platform-db-owner',
  'platform-db-logins',
  'device-gateway-database',
  'enterprise-workflow-database',
  'postgrest-database',
  'device-gateway-api-keys',
  'enterprise-workflow-webhook-tokens',
  'enterprise-workflow-s3',
];

function isDevPlaceholderSecret(object: K8sObject): boolean {
  const generated = DEV_SECRETS.some(
    (name) => hasGeneratedName(object, name) && object.metadata.name !== name,
  );
  const values = Object.values(objectValues(object));
  return generated && values.length > 0 && values.every((v) => v.includes('dev-only'));
}

const read = (root: string, path: string): string => readFileSync(join(root, path), 'utf8');

export function checkComposeFile(root: string): Problem[] {
  const text = read(root, 'docker-compose.yml');
  return [
    ...validateCompose(text, { envExample: read(root, '.env.example') }),
    ...checkPlatformCompose(text),
  ];
}

export function checkRealmFile(root: string): Problem[] {
  const path = 'deploy/keycloak/platform-realm.json';
  return validateRealm(read(root, path), realmExpectations, path);
}

export function checkDockerfiles(root: string): Problem[] {
  return Object.entries(dockerfiles).flatMap(([path, expect]) =>
    validateDockerfile(read(root, path), expect, path),
  );
}

export async function checkKustomization(
  root: string,
  which: keyof typeof kustomizations,
): Promise<{ objects: RenderedObject[]; problems: Problem[] }> {
  const { dir, externalSecrets, overlay } = kustomizations[which];
  const rendered = kubectlKustomize(join(root, dir), root);
  if (rendered.objects.length === 0) return rendered;
  const problems = [
    ...rendered.problems,
    ...(await validateKubernetes(rendered.objects, {
      externalSecrets,
      // Only the dev overlay's generator may produce Secrets, and only with placeholder values.
      allowSecretObjects: (object) => which === 'dev' && isDevPlaceholderSecret(object),
    })),
    ...checkPlatformKubernetes(rendered.objects),
    ...(overlay ? checkImageTags(rendered.objects) : []),
  ];
  return { objects: rendered.objects, problems };
}

/** The operators' monitoring files: rules, their promtool unit tests, dashboards, runbook. */
export const monitoringFiles = {
  rules: 'deploy/monitoring/alerts.yaml',
  ruleTests: 'deploy/monitoring/alerts.test.yaml',
  runbook: 'docs/operations.md',
  dashboards: {
    'device-gateway': 'deploy/monitoring/dashboards/device-gateway.json',
    'enterprise-workflow': 'deploy/monitoring/dashboards/enterprise-workflow.json',
  },
} as const;

/** Every PromQL expression of the rules and the dashboards, with where it is. */
export function monitoringExpressions(root: string): ExpressionUse[] {
  return [
    ...ruleExpressions(read(root, monitoringFiles.rules)).map((u) => ({
      ...u,
      where: `${monitoringFiles.rules} ${u.where}`,
    })),
    ...Object.values(monitoringFiles.dashboards).flatMap((path) =>
      dashboardExpressions(read(root, path), path),
    ),
  ];
}

/**
 * The offline checks of the monitoring files: rule conventions and runbook links, the base's
 * PrometheusRule (as `kubectl kustomize` renders it) equal to the rules file, the dashboards' structure
 * and PromQL. promtool's own checks run in the tests (deploy/test/monitoring.test.ts).
 */
export function checkMonitoringFiles(root: string): Problem[] {
  const rules = read(root, monitoringFiles.rules);
  const base = kubectlKustomize(join(root, kustomizations.base.dir), root);
  return [
    ...checkAlertRules(
      rules,
      read(root, monitoringFiles.runbook),
      monitoringFiles.runbook,
      monitoringFiles.rules,
    ),
    ...base.problems,
    ...checkPrometheusRuleEqualsFile(findObject(base.objects, 'PrometheusRule', 'facility-platform'), rules),
    ...Object.entries(monitoringFiles.dashboards).flatMap(([service, path]) =>
      checkDashboard(read(root, path), path, service),
    ),
  ];
}
