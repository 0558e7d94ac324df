import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { jest } from '@jest/globals';
import {
  checkKustomization,
  describeEgress,
  findObject,
  KUBERNETES_SCHEMA_VERSION,
  podLabels,
  workloadEnvironment,
} from '../src/validate/index.js';
import { kubectlKustomize, visitContainers } from '../src/validate/kubectl.js';
import { copyK8sTree, readRepoFile, repoRoot } from './helpers.js';

// Each render type-checks every object with the TypeScript compiler (a few seconds on 2 cores).
jest.setTimeout(120_000);

type Which = 'base' | 'dev' | 'production';

const messagesOf = async (root: string, which: Which): Promise<string[]> =>
  (await checkKustomization(root, which)).problems.map((p) => `${p.file}: ${p.message}`);

describe(`Kubernetes manifests (schemas ${KUBERNETES_SCHEMA_VERSION})`, () => {
  it('the base renders and validates with no problem', async () => {
    const { objects, problems } = await checkKustomization(repoRoot, 'base');
    expect(problems).toEqual([]);
    const kinds = new Set(objects.map((o) => o.object.kind));
    for (const kind of [
      'Deployment',
      'Service',
      'PodDisruptionBudget',
      'HorizontalPodAutoscaler',
      'NetworkPolicy',
      'ConfigMap',
      'Job',
      'CronJob',
      'Ingress',
      'PrometheusRule',
      'PodMonitor',
    ])
      expect(kinds).toContain(kind);
    expect(kinds).not.toContain('Secret');
  });

  it('every command a container runs names an entry point this repository builds', async () => {
    // The migration Job once ran scripts/dist/migrate.js after the ops image had stopped shipping it; the
    // Dockerfile test cannot see a command that a manifest overrides.
    const { objects } = await checkKustomization(repoRoot, 'base');
    const commands: string[][] = [];
    for (const { object } of objects)
      visitContainers(object, (c) => {
        if (Array.isArray(c.command)) commands.push(c.command.map(String));
      });
    expect(commands.length).toBeGreaterThan(0);
    for (const command of commands) {
      const script = command.find((part) => /\/dist\/.+\.js$/.test(part));
      expect(script).toBeDefined();
      const source = script!.replace(/\/dist\/(.+)\.js$/, '/src/$1.ts');
      expect({ command, exists: existsSync(join(repoRoot, source)) }).toEqual({ command, exists: true });
    }
  });

  it('the dev overlay renders (namespace, images, patches, placeholder secrets) and validates', async () => {
    const { objects, problems } = await checkKustomization(repoRoot, 'dev');
    expect(problems).toEqual([]);
    const gateway = objects.find(
      (o) => o.object.kind === 'Deployment' && o.object.metadata.name === 'device-gateway',
    )!.object;
    expect(gateway.metadata.namespace).toBe('platform-dev');
    expect((gateway.spec as { replicas: number }).replicas).toBe(1);
    expect(JSON.stringify(gateway)).toContain('platform/device-gateway:dev');
    const coap = objects.find((o) => o.object.metadata.name === 'device-gateway-coap')!.object.spec as Record<
      string,
      unknown
    >;
    expect(coap.sessionAffinity).toBe('ClientIP');
    expect(objects.filter((o) => o.object.kind === 'Secret').length).toBeGreaterThan(0);
  });

  it('`kubectl kustomize deploy/k8s` renders the dev overlay, and the READMEs name that command', () => {
    // The README named an overlay but no command, and the obvious one failed: deploy/k8s had no kustomization.
    const top = kubectlKustomize(join(repoRoot, 'deploy/k8s'), repoRoot);
    expect(top.problems).toEqual([]);
    const dev = kubectlKustomize(join(repoRoot, 'deploy/k8s/overlays/dev'), repoRoot);
    expect(top.objects.length).toBeGreaterThan(0);
    expect(top.objects.map((o) => o.object)).toEqual(dev.objects.map((o) => o.object));
    for (const readme of ['README.md', 'deploy/README.md'])
      expect({ readme, names: /kubectl kustomize deploy\/k8s[`\s]/.test(readRepoFile(readme)) }).toEqual({
        readme,
        names: true,
      });
  });

  it('the production overlay example renders and validates: no Secret, every image from a registry, pinned', async () => {
    const { objects, problems } = await checkKustomization(repoRoot, 'production');
    expect(problems).toEqual([]);
    // Its Secrets come from the cluster's secret manager (docs/operations.md "Secrets").
    expect(objects.filter((o) => o.object.kind === 'Secret')).toEqual([]);
    const images = new Set<string>();
    for (const { object } of objects) visitContainers(object, (c) => images.add(String(c.image)));
    const namespaces = new Set(
      objects.filter((o) => o.object.kind !== 'Namespace').map((o) => o.object.metadata.namespace),
    );
    expect([...namespaces]).toEqual(['platform']);
    const ours = [...images].filter((image) => !image.startsWith('postgrest/'));
    expect(ours.sort()).toEqual([
      'registry.example.com/platform/device-gateway:1.0.0',
      'registry.example.com/platform/enterprise-workflow:1.0.0',
      'registry.example.com/platform/ops:1.0.0',
    ]);
  });

  describe.each(['dev', 'production'] as const)(
    'the gateway takes the realm’s tokens in overlay %s',
    (which) => {
      it('with the workflow’s issuer and JWKS, and its pods may open exactly DNS, PostgreSQL and Keycloak', async () => {
        const { objects, problems } = await checkKustomization(repoRoot, which);
        expect(problems).toEqual([]);
        const gateway = findObject(objects, 'Deployment', 'device-gateway')!;
        const gw = workloadEnvironment(objects, gateway);
        const wf = workloadEnvironment(objects, findObject(objects, 'Deployment', 'enterprise-workflow')!);
        expect(gw.GATEWAY_OIDC_ISSUER_URL).toMatch(/\/realms\/platform$/);
        expect([gw.GATEWAY_OIDC_ISSUER_URL, gw.GATEWAY_OIDC_JWKS_URL]).toEqual([
          wf.OIDC_ISSUER_URL,
          wf.OIDC_JWKS_URL,
        ]);
        // Keycloak's JWKS over plain HTTP on 8080 inside the cluster, or 8443 for an overlay that fetches over TLS.
        expect(describeEgress(objects, podLabels(gateway))).toEqual([
          'anywhere TCP 5432',
          'namespace identity TCP 8080',
          'namespace identity TCP 8443',
          'namespace kube-system pods k8s-app=kube-dns TCP 53',
          'namespace kube-system pods k8s-app=kube-dns UDP 53',
        ]);
      });

      it('fails without GATEWAY_OIDC_ISSUER_URL (the gateway would take API keys only)', async () => {
        const copy = copyK8sTree();
        try {
          copy.edit('deploy/k8s/base/device-gateway.yaml', /\n {2}GATEWAY_OIDC_ISSUER_URL: .*/, '');
          const overlay = `deploy/k8s/overlays/${which === 'dev' ? 'dev' : 'production-example'}/config.yaml`;
          copy.edit(overlay, /(name: device-gateway-config\n[^]*?)\n {2}GATEWAY_OIDC_ISSUER_URL: .*/, '$1');
          expect((await messagesOf(copy.root, which)).join('\n')).toContain(
            'device-gateway sets no GATEWAY_OIDC_ISSUER_URL: its /api would take API keys only, no access token',
          );
        } finally {
          copy.remove();
        }
      });

      it('fails when the overlay gives the workflow another issuer than the gateway', async () => {
        const copy = copyK8sTree();
        try {
          const overlay = `deploy/k8s/overlays/${which === 'dev' ? 'dev' : 'production-example'}/config.yaml`;
          copy.edit(
            overlay,
            /(name: enterprise-workflow-config\ndata:\n[^]*? {2}OIDC_ISSUER_URL: ).*/,
            '$1https://sso.example.org/realms/platform',
          );
          expect((await messagesOf(copy.root, which)).join('\n')).toMatch(
            /device-gateway's GATEWAY_OIDC_ISSUER_URL \S+ is not enterprise-workflow's OIDC_ISSUER_URL https:\/\/sso\.example\.org\/realms\/platform/,
          );
        } finally {
          copy.remove();
        }
      });
    },
  );

  describe('fails on a broken copy', () => {
    const cases: [string, Which, string, string | RegExp, string, RegExp][] = [
      [
        'a misspelt field',
        'base',
        'deploy/k8s/base/device-gateway.yaml',
        'readinessProbe:',
        'readinesProbe:',
        /'"readinesProbe"' does not exist in type 'IContainer'/,
      ],
      [
        'a wrong enum value',
        'base',
        'deploy/k8s/base/device-gateway.yaml',
        'protocol: UDP\n---',
        'protocol: UPD\n---',
        /protocol must be equal to one of the allowed values/,
      ],
      [
        'a value of the wrong type',
        'base',
        'deploy/k8s/base/enterprise-workflow.yaml',
        'minReplicas: 2',
        'minReplicas: two',
        /minReplicas must be integer/,
      ],
      [
        'a missing required field',
        'base',
        'deploy/k8s/base/postgrest.yaml',
        / {2}selector:\n {4}matchLabels:\n {6}app.kubernetes.io\/name: postgrest\n {2}template:/,
        '  template:',
        /must have required property selector/,
      ],
      [
        'a lost sessionAffinity',
        'base',
        'deploy/k8s/base/device-gateway.yaml',
        'sessionAffinity: ClientIP\n',
        'sessionAffinity: None\n',
        /must use sessionAffinity ClientIP/,
      ],
      [
        'a writable root filesystem',
        'base',
        'deploy/k8s/base/enterprise-workflow.yaml',
        'readOnlyRootFilesystem: true',
        'readOnlyRootFilesystem: false',
        /readOnlyRootFilesystem must be true/,
      ],
      [
        'an inlined secret',
        'base',
        'deploy/k8s/base/device-gateway.yaml',
        /- name: DATABASE_URL\n\s+valueFrom:\n\s+secretKeyRef:\n\s+name: device-gateway-database\n\s+key: url/,
        '- name: DATABASE_URL\n              value: postgres://u:p@db/x',
        /inlines a secret/,
      ],
      [
        'a wrong readiness path',
        'base',
        'deploy/k8s/base/device-gateway.yaml',
        'path: /api/ready',
        'path: /api/health',
        /readiness must probe \/api\/ready/,
      ],
      [
        'a resource file that does not exist',
        'base',
        'deploy/k8s/base/kustomization.yaml',
        '  - ingress.yaml',
        '  - ingres.yaml',
        /kubectl kustomize failed: .*ingres\.yaml: no such file or directory/,
      ],
      [
        'a misspelt PrometheusRule field',
        'base',
        'deploy/k8s/base/monitoring.yaml',
        '          for: 2m',
        '          fro: 2m',
        /PrometheusRule\/facility-platform: .*'"fro"' does not exist in type 'IRule'/,
      ],
      [
        'a PodMonitor removed',
        'base',
        'deploy/k8s/base/monitoring.yaml',
        /---\napiVersion: monitoring.coreos.com\/v1\nkind: PodMonitor\nmetadata:\n {2}name: enterprise-workflow\n[^]*$/,
        '',
        /PodMonitor\/enterprise-workflow is missing/,
      ],
      [
        'a gateway whose pods may not open Keycloak (no oidc-client label)',
        'base',
        'deploy/k8s/base/device-gateway.yaml',
        /(platform.example\/database-client: 'true'\n)\s+platform.example\/oidc-client: 'true'\n/,
        '$1',
        /Deployment\/device-gateway cannot fetch the realm's keys from http:\/\/keycloak\.identity\.svc:8080\/realms\/platform\/protocol\/openid-connect\/certs: no NetworkPolicy lets its pods open namespace identity TCP 8080/,
      ],
      [
        'a gateway fetching its keys elsewhere than the workflow',
        'base',
        'deploy/k8s/base/device-gateway.yaml',
        'realms/platform/protocol/openid-connect/certs',
        'realms/master/protocol/openid-connect/certs',
        /device-gateway's GATEWAY_OIDC_JWKS_URL \S+\/realms\/master\/\S+ is not enterprise-workflow's OIDC_JWKS_URL/,
      ],
      [
        'a JWKS in a namespace no policy opens',
        'production',
        'deploy/k8s/overlays/production-example/config.yaml',
        /(name: jwks-sync-config\n[^]*?)keycloak\.identity\.svc:8080/,
        '$1keycloak.auth.svc:8080',
        /CronJob\/jwks-sync cannot fetch the realm's keys from .*: no NetworkPolicy lets its pods open namespace auth TCP 8080/,
      ],
      [
        'a misspelt kustomization field',
        'dev',
        'deploy/k8s/overlays/dev/kustomization.yaml',
        'namespace: platform-dev',
        'namespac: platform-dev',
        /invalid Kustomization: json: unknown field \\?"namespac\\?"/,
      ],
      [
        'an overlay image left at latest',
        'dev',
        'deploy/k8s/overlays/dev/kustomization.yaml',
        '  - name: platform/ops\n    newTag: dev\n',
        '',
        /image "platform\/ops:latest" must carry a tag other than latest/,
      ],
      [
        'a dev Secret whose value is not a placeholder',
        'dev',
        'deploy/k8s/overlays/dev/kustomization.yaml',
        'keys=dev-only-gateway-key',
        'keys=a-real-looking-key',
        /Secret\/device-gateway-api-keys-[a-z0-9]{10}: Secret values must not be committed/,
      ],

      [
        'a patch whose target is gone',
        'dev',
        'deploy/k8s/overlays/dev/hpa.yaml',
        'name: enterprise-workflow',
        'name: enterprise-workflows',
        /no resource matches strategic merge patch "HorizontalPodAutoscaler.*\/enterprise-workflows/,
      ],
      [
        'a Secret the overlay no longer generates',
        'dev',
        'deploy/k8s/overlays/dev/kustomization.yaml',
        / {2}- name: postgrest-database\n {4}literals:\n {6}- url=.*\n/,
        '',
        /references missing Secret postgrest-database/,
      ],
    ];
    it.each(cases)('%s', async (_name, which, file, from, to, expected) => {
      const copy = copyK8sTree();
      try {
        copy.edit(file, from, to);
        expect((await messagesOf(copy.root, which)).join('\n')).toMatch(expected);
      } finally {
        copy.remove();
      }
    });

    it('a Secret committed in the base', async () => {
      const copy = copyK8sTree();
      try {
        writeFileSync(
          join(copy.root, 'deploy/k8s/base/secret.yaml'),
          'apiVersion: v1\nkind: Secret\nmetadata:\n  name: committed\nstringData:\n  url: postgres://u:p@db/x\n',
        );
        copy.edit('deploy/k8s/base/kustomization.yaml', 'resources:\n', 'resources:\n  - secret.yaml\n');
        expect((await messagesOf(copy.root, 'base')).join('\n')).toMatch(
          /Secret\/committed: Secret values must not be committed/,
        );
      } finally {
        copy.remove();
      }
    });
  });

  it('fails, naming kubectl, when kubectl is not on PATH (never skips)', async () => {
    const path = process.env.PATH;
    process.env.PATH = '/nonexistent';
    try {
      await expect(checkKustomization(repoRoot, 'base')).rejects.toThrow(
        /kubectl is not installed or not on PATH/,
      );
    } finally {
      process.env.PATH = path;
    }
  });
});
