// The Kubernetes manifests as a cluster would receive them: rendered by kustomize itself through
// `kubectl kustomize <dir>` (kubectl ≥ 1.32 embeds kustomize v5.5), offline, no cluster needed. The policy
// checks of kubernetes.ts read this output, so generator name hashes, reference rewriting, patches and
// labels are kustomize's, not an imitation of them.
import { execFileSync } from 'node:child_process';
import { relative } from 'node:path';
import type { Problem } from './problems.js';
import { isRecord, parseYamlDocuments } from './yaml.js';

export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; [k: string]: unknown };
  [key: string]: unknown;
}

export interface RenderedObject {
  object: K8sObject;
  /** The kustomization directory (relative to the repository root) and the document's index in the output. */
  source: string;
}

export interface RenderResult {
  objects: RenderedObject[];
  problems: Problem[];
}

/** Thrown when no kubectl can be run: the checks cannot be made, which is a failure, never a skip. */
export class KubectlMissingError extends Error {
  constructor(cause: string) {
    super(
      `kubectl is not installed or not on PATH (${cause}): the Kubernetes manifests are rendered with ` +
        '`kubectl kustomize` (kubectl v1.32 or later, kustomize v5). Install kubectl (Debian/Ubuntu: the ' +
        '`kubectl` package of the Kubernetes apt repository, or any official kubectl binary) and run again.',
    );
    this.name = 'KubectlMissingError';
  }
}

function isK8sObject(value: unknown): value is K8sObject {
  return (
    isRecord(value) &&
    typeof value.apiVersion === 'string' &&
    typeof value.kind === 'string' &&
    isRecord(value.metadata) &&
    typeof value.metadata.name === 'string'
  );
}

/** `kubectl kustomize dir`: every object of the output, or kustomize's own error as a problem. */
export function kubectlKustomize(dir: string, root: string): RenderResult {
  const where = relative(root, dir) || '.';
  let output: string;
  try {
    output = execFileSync('kubectl', ['kustomize', dir], {
      encoding: 'utf8',
      // The PATH of this process at call time is the one searched (a test removes kubectl from it).
      env: process.env,
      stdio: ['ignore', 'pipe', 'pipe'],
      // The dev overlay renders to about 40 kB; 32 MiB leaves room without letting a runaway render grow.
      maxBuffer: 32 * 1024 * 1024,
    });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: string; status?: number | null };
    if (e.code === 'ENOENT' || e.code === 'EACCES') throw new KubectlMissingError(e.code);
    const message = kustomizeError(e.stderr ?? '') || e.message;
    return { objects: [], problems: [{ file: where, message: `kubectl kustomize failed: ${message}` }] };
  }
  const objects: RenderedObject[] = [];
  const problems: Problem[] = [];
  // YAML 1.1 is what Kubernetes reads; kustomize's output quotes every ambiguous scalar anyway.
  parseYamlDocuments(output, { version: '1.1' }).forEach((doc, i) => {
    if (isK8sObject(doc)) objects.push({ object: unfoldSecretData(doc), source: `${where}#${i}` });
    else
      problems.push({
        file: `${where}#${i}`,
        message: 'not a Kubernetes object (apiVersion, kind, metadata.name)',
      });
  });
  return { objects, problems };
}

/**
 * Kustomize folds long base64 values of a Secret's `data` over several lines; the API server's decoder
 * (Go encoding/base64) ignores the line breaks, the OpenAPI `byte` format of the schema check does not.
 */
function unfoldSecretData(object: K8sObject): K8sObject {
  if (object.kind !== 'Secret' || !isRecord(object.data)) return object;
  const data = Object.fromEntries(
    Object.entries(object.data).map(([k, v]) => [k, typeof v === 'string' ? v.replace(/[\r\n]/g, '') : v]),
  );
  return { ...object, data };
}

/** kubectl logs a failure as a klog line, `... "command failed" err="<quoted message>"`: the message alone. */
function kustomizeError(stderr: string): string {
  const quoted = /err="((?:[^"\\]|\\.)*)"/.exec(stderr)?.[1];
  if (quoted === undefined) return stderr.trim();
  try {
    return JSON.parse(`"${quoted}"`) as string;
  } catch {
    return quoted;
  }
}

/**
 * Kustomize names a generated ConfigMap or Secret `<name>-<hash>`: the first ten hex digits of the
 * content's SHA-256 with 0, 1, 3, a, e replaced by g, h, k, m, t (kustomize api/hasher `encode`, so that
 * no word is spelt). True for `name` itself too.
 */
export function hasGeneratedName(object: K8sObject, name: string): boolean {
  const actual = object.metadata.name;
  return (
    actual === name ||
    (actual.startsWith(`${name}-`) && /^[2456789bcdfghkmt]{10}$/.test(actual.slice(name.length + 1)))
  );
}

/** The object of `kind` named `name`, or generated from a generator of that name. */
export function findObject(
  objects: readonly RenderedObject[],
  kind: string,
  name: string,
): K8sObject | undefined {
  return (
    objects.find((o) => o.object.kind === kind && o.object.metadata.name === name)?.object ??
    objects.find((o) => o.object.kind === kind && hasGeneratedName(o.object, name))?.object
  );
}

/** A Secret's or ConfigMap's values as text: `data` (base64 for a Secret) and `stringData`. */
export function objectValues(object: K8sObject): Record<string, string> {
  const out: Record<string, string> = {};
  const data = isRecord(object.data) ? object.data : {};
  for (const [k, v] of Object.entries(data))
    out[k] = object.kind === 'Secret' ? Buffer.from(String(v), 'base64').toString('utf8') : String(v);
  const stringData = isRecord(object.stringData) ? object.stringData : {};
  for (const [k, v] of Object.entries(stringData)) out[k] = String(v);
  return out;
}

/** Calls `visit` for every container and init container of a workload's pod template(s). */
export function visitContainers(obj: K8sObject, visit: (c: Record<string, unknown>) => void): void {
  const podSpecs: unknown[] = [];
  const spec = obj.spec;
  if (isRecord(spec)) {
    if (isRecord(spec.template) && isRecord(spec.template.spec)) podSpecs.push(spec.template.spec);
    const jt = spec.jobTemplate;
    if (isRecord(jt) && isRecord(jt.spec) && isRecord(jt.spec.template) && isRecord(jt.spec.template.spec))
      podSpecs.push(jt.spec.template.spec);
  }
  for (const ps of podSpecs) {
    if (!isRecord(ps)) continue;
    for (const key of ['initContainers', 'containers'])
      for (const c of (ps[key] as unknown[] | undefined) ?? []) if (isRecord(c)) visit(c);
  }
}
