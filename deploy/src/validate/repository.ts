// Every offline check of the repository's production-shape files, in one place for the tests and the
// `validate` command. `root` is the repository root.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { demoUserSubs } from '@platform/enterprise-db';
import { checkPlatformCompose, validateCompose } from './compose.js';
import type { DockerfileExpectations } from './dockerfile.js';
import { validateDockerfile } from './dockerfile.js';
import { checkPlatformKubernetes, validateKubernetes } from './kubernetes.js';
import { renderKustomization } from './kustomize.js';
import type { RenderedObject } from './kustomize.js';
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
};

/** Each image, the workspaces it may copy and what it must compile. */
export const dockerfiles: Record<string, DockerfileExpectations> = {
  'services/device-gateway/Dockerfile': {
    allowedSources: ['packages/contracts', 'packages/service-kit', 'services/device-gateway'],
    buildTargets: ['services/device-gateway'],
    healthcheck: true,
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

export const kustomizations = {
  base: { dir: 'deploy/k8s/base', externalSecrets: true },
  dev: { dir: 'deploy/k8s/overlays/dev', externalSecrets: false },
} as const;

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
  const { dir, externalSecrets } = kustomizations[which];
  const rendered = renderKustomization(join(root, dir), root);
  const problems = [
    ...rendered.problems,
    ...(await validateKubernetes(rendered.objects, {
      externalSecrets,
      // Only the dev overlay's generator may produce Secrets (placeholder values).
      allowSecretObjects: (source) => which === 'dev' && source.includes(':secretGenerator/'),
    })),
    ...checkPlatformKubernetes(rendered.objects),
  ];
  return { objects: rendered.objects, problems };
}
