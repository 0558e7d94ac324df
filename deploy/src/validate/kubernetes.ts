// Kubernetes objects against the Kubernetes OpenAPI schemas of the npm package `kubernetes-models`
// (5.x: Kubernetes v1.36.0, pinned by package-lock.json; no network), in two passes:
//  1. the package's compiled JSON-schema validators (types, required fields, formats, enums);
//  2. unknown fields: those validators allow additional properties, so every object is also type-checked
//     by the TypeScript compiler against the package's interfaces, whose excess-property check rejects a
//     misspelt or misplaced field at any depth (what `kubeconform -strict` would report).
// Then the platform's own rules (securityContext, probes, resources, references).
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { keycloakJwksUrl } from '@platform/service-kit';
import ts from 'typescript';
import type { K8sObject, RenderedObject } from './kubectl.js';
import { visitContainers } from './kubectl.js';
import { egressAllowedBy, podLabels, urlDestination, workloadEnvironment } from './network-policy.js';
import type { Problem } from './problems.js';
import { isRecord } from './yaml.js';

export const KUBERNETES_SCHEMA_VERSION =
  'v1.36.0 (kubernetes-models 5.x), monitoring.coreos.com (@kubernetes-models/prometheus-operator 6.x)';

const require = createRequire(import.meta.url);

/**
 * Module of the model for an apiVersion/kind ("apps/v1" → "kubernetes-models/apps/v1/Deployment"); the
 * Prometheus Operator's custom resources (PrometheusRule) come from its own models package.
 */
function modelPath(apiVersion: string, kind: string): string {
  if (apiVersion.startsWith('monitoring.coreos.com/'))
    return `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`;
  return `kubernetes-models/${apiVersion}/${kind}`;
}

interface ModelClass {
  new (data: unknown): { validate(): void };
}

async function loadModel(apiVersion: string, kind: string): Promise<ModelClass | undefined> {
  if (!/^[a-z0-9.]+\/v[0-9a-z]+$|^v1$/.test(apiVersion) || !/^[A-Z][A-Za-z]+$/.test(kind)) return undefined;
  try {
    const mod = (await import(modelPath(apiVersion, kind))) as Record<string, unknown>;
    const cls = mod[kind];
    return typeof cls === 'function' ? (cls as ModelClass) : undefined;
  } catch {
    return undefined;
  }
}

/** Pass 1: the compiled OpenAPI validators. */
export async function validateAgainstSchemas(objects: readonly RenderedObject[]): Promise<Problem[]> {
  const problems: Problem[] = [];
  for (const { object, source } of objects) {
    const Model = await loadModel(object.apiVersion, object.kind);
    if (Model === undefined) {
      problems.push({ file: source, message: `unknown apiVersion/kind ${object.apiVersion} ${object.kind}` });
      continue;
    }
    try {
      new Model(structuredClone(object)).validate();
    } catch (err) {
      problems.push({
        file: source,
        message: `${object.kind}/${object.metadata.name}: ${(err as Error).message}`,
      });
    }
  }
  return problems;
}

/** Pass 2: unknown or misplaced fields, through TypeScript's excess-property check. */
export function validateNoUnknownFields(objects: readonly RenderedObject[]): Problem[] {
  const problems: Problem[] = [];
  const packageDir = dirname(require.resolve('kubernetes-models/package.json'));
  // The virtual file sits next to the package's node_modules so bare imports resolve as in a project.
  const virtualFile = join(dirname(packageDir), '..', '__platform_manifest_check__.ts');
  const lines: string[] = [];
  const lineOwner: { line: number; source: string }[] = [];
  objects.forEach(({ object }, i) => {
    if (!/^[A-Z][A-Za-z]+$/.test(object.kind)) return;
    lines.push(
      `import type { I${object.kind} as T${i} } from '${modelPath(object.apiVersion, object.kind)}';`,
    );
  });
  objects.forEach(({ object, source }, i) => {
    if (!/^[A-Z][A-Za-z]+$/.test(object.kind)) return;
    lineOwner.push({ line: lines.length, source: `${source} ${object.kind}/${object.metadata.name}` });
    lines.push(`export const m${i}: T${i} = ${JSON.stringify(object, null, 1)};`.replace(/\n/g, ' '));
  });
  const text = lines.join('\n');
  const options: ts.CompilerOptions = {
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const readFile = host.readFile.bind(host);
  const getSourceFile = host.getSourceFile.bind(host);
  host.readFile = (f) => (f === virtualFile ? text : readFile(f));
  host.fileExists = (f) => f === virtualFile || ts.sys.fileExists(f);
  host.getSourceFile = (f, lang, onError, create) =>
    f === virtualFile ? ts.createSourceFile(f, text, lang, true) : getSourceFile(f, lang, onError, create);
  const program = ts.createProgram({ rootNames: [virtualFile], options, host });
  for (const d of ts.getPreEmitDiagnostics(program)) {
    if (d.file?.fileName !== virtualFile || d.start === undefined) {
      problems.push({
        file: 'manifest type check',
        message: ts.flattenDiagnosticMessageText(d.messageText, '\n'),
      });
      continue;
    }
    const { line } = d.file.getLineAndCharacterOfPosition(d.start);
    const owner = lineOwner.find((o) => o.line === line);
    const message = ts.flattenDiagnosticMessageText(d.messageText, ' ').replace(/\s+/g, ' ');
    problems.push({ file: owner?.source ?? `line ${line}`, message: message.slice(0, 400) });
  }
  return problems;
}

function podSpecs(object: K8sObject): Record<string, unknown>[] {
  const spec = object.spec;
  const out: Record<string, unknown>[] = [];
  if (!isRecord(spec)) return out;
  if (isRecord(spec.template) && isRecord(spec.template.spec)) out.push(spec.template.spec);
  const jt = spec.jobTemplate;
  if (isRecord(jt) && isRecord(jt.spec) && isRecord(jt.spec.template) && isRecord(jt.spec.template.spec))
    out.push(jt.spec.template.spec);
  return out;
}

const SECRET_ENV = /(PASSWORD|SECRET|TOKENS?|API_KEYS?|DATABASE_URL|DB_URI|ACCESS_KEY(_ID)?)$/;

/**
 * The platform's rules for every workload: non-root, read-only root filesystem, no privilege escalation,
 * all capabilities dropped, memory limit and requests; long-running containers have liveness and
 * readiness probes; secrets are referenced (valueFrom / volumes), never inlined; no Secret objects
 * except those `allowSecretObjects` accepts (the dev overlay's generated placeholders).
 */
export function checkWorkloadPolicy(
  objects: readonly RenderedObject[],
  options: { allowSecretObjects?: (object: K8sObject) => boolean } = {},
): Problem[] {
  const problems: Problem[] = [];
  for (const { object, source } of objects) {
    const where = `${source} ${object.kind}/${object.metadata.name}`;
    const add = (message: string): void => {
      problems.push({ file: where, message });
    };
    if (object.kind === 'Secret' && !(options.allowSecretObjects?.(object) ?? false))
      add('Secret values must not be committed: reference Secrets provided by the cluster');
    const longRunning =
      object.kind === 'Deployment' || object.kind === 'StatefulSet' || object.kind === 'DaemonSet';
    for (const ps of podSpecs(object)) {
      const psc = isRecord(ps.securityContext) ? ps.securityContext : {};
      if (psc.runAsNonRoot !== true) add('pod securityContext.runAsNonRoot must be true');
      if (ps.automountServiceAccountToken !== false) add('automountServiceAccountToken must be false');
    }
    visitContainers(object, (c) => {
      const name = String(c.name);
      const sc = isRecord(c.securityContext) ? c.securityContext : {};
      if (sc.allowPrivilegeEscalation !== false)
        add(`container ${name}: allowPrivilegeEscalation must be false`);
      if (sc.readOnlyRootFilesystem !== true) add(`container ${name}: readOnlyRootFilesystem must be true`);
      const caps = isRecord(sc.capabilities) ? sc.capabilities : {};
      if (!Array.isArray(caps.drop) || !caps.drop.includes('ALL'))
        add(`container ${name}: capabilities.drop must include ALL`);
      const res = isRecord(c.resources) ? c.resources : {};
      if (!isRecord(res.requests)) add(`container ${name}: resources.requests missing`);
      if (!isRecord(res.limits) || res.limits.memory === undefined)
        add(`container ${name}: resources.limits.memory missing`);
      for (const e of (c.env as unknown[] | undefined) ?? []) {
        if (isRecord(e) && typeof e.name === 'string' && SECRET_ENV.test(e.name) && e.value !== undefined)
          add(`container ${name}: env ${e.name} inlines a secret; use valueFrom.secretKeyRef`);
      }
      if (longRunning && (!isRecord(c.livenessProbe) || !isRecord(c.readinessProbe)))
        add(`container ${name}: liveness and readiness probes are required`);
    });
  }
  return problems;
}

/** Every ConfigMap/Secret a workload names exists among `objects`, except Secrets listed as external. */
export function checkReferences(
  objects: readonly RenderedObject[],
  options: { externalSecrets: boolean },
): Problem[] {
  const problems: Problem[] = [];
  const have = new Set(objects.map((o) => `${o.object.kind}/${o.object.metadata.name}`));
  for (const { object, source } of objects) {
    const refs: [string, string][] = [];
    const walk = (v: unknown): void => {
      if (Array.isArray(v)) v.forEach(walk);
      else if (isRecord(v)) {
        if (isRecord(v.secretKeyRef) && typeof v.secretKeyRef.name === 'string')
          refs.push(['Secret', v.secretKeyRef.name]);
        if (isRecord(v.configMapKeyRef) && typeof v.configMapKeyRef.name === 'string')
          refs.push(['ConfigMap', v.configMapKeyRef.name]);
        if (isRecord(v.configMapRef) && typeof v.configMapRef.name === 'string')
          refs.push(['ConfigMap', v.configMapRef.name]);
        if (isRecord(v.secretRef) && typeof v.secretRef.name === 'string')
          refs.push(['Secret', v.secretRef.name]);
        if (isRecord(v.secret) && typeof v.secret.secretName === 'string')
          refs.push(['Secret', v.secret.secretName]);
        if (isRecord(v.configMap) && typeof v.configMap.name === 'string')
          refs.push(['ConfigMap', v.configMap.name]);
        Object.values(v).forEach(walk);
      }
    };
    walk(object.spec);
    for (const [kind, name] of refs) {
      if (kind === 'Secret' && options.externalSecrets) continue;
      if (!have.has(`${kind}/${name}`))
        problems.push({
          file: `${source} ${object.kind}/${object.metadata.name}`,
          message: `references missing ${kind} ${name}`,
        });
    }
  }
  return problems;
}

/** Everything above for one rendered set of objects. */
export async function validateKubernetes(
  objects: readonly RenderedObject[],
  options: { externalSecrets: boolean; allowSecretObjects?: (object: K8sObject) => boolean },
): Promise<Problem[]> {
  return [
    ...(await validateAgainstSchemas(objects)),
    ...validateNoUnknownFields(objects),
    ...checkWorkloadPolicy(objects, { allowSecretObjects: options.allowSecretObjects }),
    ...checkReferences(objects, { externalSecrets: options.externalSecrets }),
  ];
}

/**
 * What an overlay deploys is pinned: every container image carries a tag other than `latest` or a digest
 * (the base's `:latest` placeholders are for the overlay's `images:` to replace).
 */
export function checkImageTags(objects: readonly RenderedObject[]): Problem[] {
  const problems: Problem[] = [];
  for (const { object, source } of objects)
    visitContainers(object, (c) => {
      const image = typeof c.image === 'string' ? c.image : '';
      const digest = /@sha256:[0-9a-f]{64}$/.test(image);
      // The tag is what follows the last ':' after the last '/' (a registry host may carry a port).
      const last = image.slice(image.lastIndexOf('/') + 1);
      const tag = last.includes(':') ? last.slice(last.lastIndexOf(':') + 1) : '';
      if (!digest && (tag === '' || tag === 'latest'))
        problems.push({
          file: `${source} ${object.kind}/${object.metadata.name}`,
          message: `container ${String(c.name)}: image "${image}" must carry a tag other than latest, or a digest`,
        });
    });
  return problems;
}

function find(objects: readonly RenderedObject[], kind: string, name: string): K8sObject | undefined {
  return objects.find((o) => o.object.kind === kind && o.object.metadata.name === name)?.object;
}

function container(object: K8sObject | undefined): Record<string, unknown> | undefined {
  const first = object === undefined ? undefined : podSpecs(object)[0];
  const list = first?.containers;
  return Array.isArray(list) && isRecord(list[0]) ? list[0] : undefined;
}

function probePath(c: Record<string, unknown> | undefined, probe: string): unknown {
  const p = c?.[probe];
  return isRecord(p) && isRecord(p.httpGet) ? p.httpGet.path : undefined;
}

/** What the production shape needs (design §5), as facts about the rendered objects. */
export function checkPlatformKubernetes(objects: readonly RenderedObject[]): Problem[] {
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file: 'deploy/k8s', message });
  };
  const need = (kind: string, name: string): K8sObject | undefined => {
    const o = find(objects, kind, name);
    if (o === undefined) add(`${kind}/${name} is missing`);
    return o;
  };
  const gateway = container(need('Deployment', 'device-gateway'));
  if (probePath(gateway, 'livenessProbe') !== '/api/health')
    add('device-gateway liveness must probe /api/health');
  if (probePath(gateway, 'readinessProbe') !== '/api/ready')
    add('device-gateway readiness must probe /api/ready');
  const workflow = container(need('Deployment', 'enterprise-workflow'));
  if (probePath(workflow, 'livenessProbe') !== '/health')
    add('enterprise-workflow liveness must probe /health');
  if (probePath(workflow, 'readinessProbe') !== '/ready')
    add('enterprise-workflow readiness must probe /ready');

  const coap = objects
    .map((o) => o.object)
    .filter((o) => o.kind === 'Service' && isRecord(o.spec) && Array.isArray(o.spec.ports))
    .find((o) => (o.spec as { ports: { protocol?: string }[] }).ports.some((p) => p.protocol === 'UDP'));
  if (coap === undefined) add('no Service exposes the gateway over protocol UDP');
  else if ((coap.spec as { sessionAffinity?: string }).sessionAffinity !== 'ClientIP')
    add(`Service/${coap.metadata.name} must use sessionAffinity ClientIP (an observer keeps its replica)`);

  for (const name of ['device-gateway', 'enterprise-workflow']) need('PodDisruptionBudget', name);
  const hpa = need('HorizontalPodAutoscaler', 'enterprise-workflow');
  const targetName = (hpa?.spec as { scaleTargetRef?: { name?: string } } | undefined)?.scaleTargetRef?.name;
  if (hpa !== undefined && targetName !== 'enterprise-workflow')
    add('the HPA must scale Deployment/enterprise-workflow');
  need('Deployment', 'postgrest');
  need('Service', 'postgrest');
  if (!objects.some((o) => o.object.kind === 'Job')) add('no migration Job');
  for (const name of ['default-deny', 'device-gateway', 'enterprise-workflow', 'postgrest'])
    need('NetworkPolicy', name);
  // Monitoring: the alerting rules (equal to deploy/monitoring/alerts.yaml) and the scrape jobs they select.
  need('PrometheusRule', 'facility-platform');
  for (const name of ['device-gateway', 'enterprise-workflow']) need('PodMonitor', name);
  problems.push(...checkOidcSettings(objects));
  return problems;
}

/**
 * People's tokens: the gateway's /api takes the realm's tokens as the workflow does (design §3.1), so both name
 * the same issuer (exactly as tokens carry it) and the same JWKS; without GATEWAY_OIDC_ISSUER_URL the gateway
 * takes API keys only. And every workload given an issuer may open its JWKS under the NetworkPolicies.
 */
export function checkOidcSettings(objects: readonly RenderedObject[]): Problem[] {
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file: 'deploy/k8s', message });
  };
  const gateway = find(objects, 'Deployment', 'device-gateway');
  const workflow = find(objects, 'Deployment', 'enterprise-workflow');
  if (gateway !== undefined && workflow !== undefined) {
    const gw = workloadEnvironment(objects, gateway);
    const wf = workloadEnvironment(objects, workflow);
    if (!gw.GATEWAY_OIDC_ISSUER_URL)
      add(
        'device-gateway sets no GATEWAY_OIDC_ISSUER_URL: its /api would take API keys only, no access token',
      );
    else if (gw.GATEWAY_OIDC_ISSUER_URL !== wf.OIDC_ISSUER_URL)
      add(
        `device-gateway's GATEWAY_OIDC_ISSUER_URL ${gw.GATEWAY_OIDC_ISSUER_URL} is not enterprise-workflow's ` +
          `OIDC_ISSUER_URL ${String(wf.OIDC_ISSUER_URL)} (one realm, its issuer as tokens carry it)`,
      );
    if (gw.GATEWAY_OIDC_JWKS_URL !== wf.OIDC_JWKS_URL)
      add(
        `device-gateway's GATEWAY_OIDC_JWKS_URL ${String(gw.GATEWAY_OIDC_JWKS_URL)} is not enterprise-workflow's ` +
          `OIDC_JWKS_URL ${String(wf.OIDC_JWKS_URL)}`,
      );
  }
  for (const { object } of objects) {
    const env = workloadEnvironment(objects, object);
    for (const [name, issuer] of Object.entries(env)) {
      const prefix = /^(.*)OIDC_ISSUER_URL$/.exec(name)?.[1];
      if (prefix === undefined || !issuer) continue;
      const jwksName = `${prefix}OIDC_JWKS_URL`;
      const jwks = env[jwksName] || keycloakJwksUrl(issuer);
      const to = urlDestination(jwks);
      const what = `${object.kind}/${object.metadata.name}`;
      if (to === undefined) add(`${what}: ${jwksName} ${jwks} is not an http(s) URL`);
      else if (egressAllowedBy(objects, podLabels(object), to) === undefined)
        add(
          `${what} cannot fetch the realm's keys from ${jwks}: no NetworkPolicy lets its pods open ` +
            `${to.namespace === undefined ? to.host : `namespace ${to.namespace}`} ${to.protocol} ${to.port}`,
        );
    }
  }
  return problems;
}
