// An offline renderer for the subset of kustomize this repository uses (no kustomize binary can be
// installed here or in CI). It refuses any kustomization field it does not implement, so a new feature
// cannot be silently ignored. Generated Secret/ConfigMap names keep no hash suffix (kustomize adds one
// and rewrites the references consistently, so reference checks are unaffected).
import { readFileSync, statSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
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
  /** File the object came from (relative to the render root's parent), or the generator. */
  source: string;
}

export interface RenderResult {
  objects: RenderedObject[];
  problems: Problem[];
  /** Every file read (kustomization files, resources, patches). */
  files: string[];
}

const SUPPORTED = new Set([
  'apiVersion',
  'kind',
  'namespace',
  'resources',
  'labels',
  'images',
  'patches',
  'secretGenerator',
  'configMapGenerator',
]);

function isK8sObject(value: unknown): value is K8sObject {
  return (
    isRecord(value) &&
    typeof value.apiVersion === 'string' &&
    typeof value.kind === 'string' &&
    isRecord(value.metadata) &&
    typeof value.metadata.name === 'string'
  );
}

/** Strategic-merge subset: maps merge recursively; lists of named objects merge by `name`; others replace. */
export function strategicMerge(target: unknown, patch: unknown): unknown {
  if (isRecord(target) && isRecord(patch)) {
    const out: Record<string, unknown> = { ...target };
    for (const [k, v] of Object.entries(patch))
      out[k] = v === null ? undefined : strategicMerge(target[k], v);
    for (const k of Object.keys(out)) if (out[k] === undefined) delete out[k];
    return out;
  }
  const named = (list: unknown[]): boolean => list.every((i) => isRecord(i) && typeof i.name === 'string');
  if (Array.isArray(target) && Array.isArray(patch) && named(target) && named(patch)) {
    const out = target.map((i) => i as Record<string, unknown>);
    for (const p of patch as Record<string, unknown>[]) {
      const at = out.findIndex((i) => i.name === p.name);
      if (at >= 0) out[at] = strategicMerge(out[at], p) as Record<string, unknown>;
      else out.push(p);
    }
    return out;
  }
  return patch;
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

function literalsToData(literals: unknown, where: string, problems: Problem[]): Record<string, string> {
  const data: Record<string, string> = {};
  for (const lit of Array.isArray(literals) ? literals : []) {
    const s = String(lit);
    const i = s.indexOf('=');
    if (i <= 0) problems.push({ file: where, message: `generator literal "${s}" is not key=value` });
    else data[s.slice(0, i)] = s.slice(i + 1);
  }
  return data;
}

/** Renders `dir/kustomization.yaml` (recursively through directory resources). */
export function renderKustomization(dir: string, root = resolve(dir, '..')): RenderResult {
  const problems: Problem[] = [];
  const files: string[] = [];
  const objects: RenderedObject[] = [];
  const kfile = join(dir, 'kustomization.yaml');
  const rel = (p: string): string => relative(root, p);
  files.push(kfile);
  let k: unknown;
  try {
    k = parseYamlDocuments(readFileSync(kfile, 'utf8'), { version: '1.1' })[0];
  } catch (err) {
    problems.push({ file: rel(kfile), message: `cannot read: ${(err as Error).message}` });
    return { objects, problems, files };
  }
  if (!isRecord(k)) {
    problems.push({ file: rel(kfile), message: 'not a mapping' });
    return { objects, problems, files };
  }
  if (k.apiVersion !== 'kustomize.config.k8s.io/v1beta1' || k.kind !== 'Kustomization')
    problems.push({
      file: rel(kfile),
      message: 'apiVersion/kind must be kustomize.config.k8s.io/v1beta1 Kustomization',
    });
  for (const key of Object.keys(k))
    if (!SUPPORTED.has(key))
      problems.push({ file: rel(kfile), message: `unsupported kustomization field "${key}"` });

  for (const entry of (k.resources as unknown[] | undefined) ?? []) {
    const path = resolve(dir, String(entry));
    let isDir: boolean;
    try {
      isDir = statSync(path).isDirectory();
    } catch {
      problems.push({ file: rel(kfile), message: `resource ${String(entry)} does not exist` });
      continue;
    }
    if (isDir) {
      const sub = renderKustomization(path, root);
      objects.push(...sub.objects);
      problems.push(...sub.problems);
      files.push(...sub.files);
      continue;
    }
    files.push(path);
    try {
      const docs = parseYamlDocuments(readFileSync(path, 'utf8'), { version: '1.1' });
      docs.forEach((doc, i) => {
        if (isK8sObject(doc)) objects.push({ object: doc, source: `${rel(path)}#${i}` });
        else
          problems.push({
            file: `${rel(path)}#${i}`,
            message: 'not a Kubernetes object (apiVersion, kind, metadata.name)',
          });
      });
    } catch (err) {
      problems.push({ file: rel(path), message: `YAML: ${(err as Error).message}` });
    }
  }

  for (const [kind, key] of [
    ['Secret', 'secretGenerator'],
    ['ConfigMap', 'configMapGenerator'],
  ] as const) {
    for (const gen of (k[key] as unknown[] | undefined) ?? []) {
      if (!isRecord(gen) || typeof gen.name !== 'string') {
        problems.push({ file: rel(kfile), message: `${key} entry without a name` });
        continue;
      }
      for (const f of Object.keys(gen))
        if (!['name', 'literals', 'type'].includes(f))
          problems.push({ file: rel(kfile), message: `${key} ${gen.name}: unsupported field "${f}"` });
      const data = literalsToData(gen.literals, rel(kfile), problems);
      const object: K8sObject = { apiVersion: 'v1', kind, metadata: { name: gen.name } };
      if (kind === 'Secret') {
        object.type = typeof gen.type === 'string' ? gen.type : 'Opaque';
        object.stringData = data;
      } else object.data = data;
      objects.push({ object, source: `${rel(kfile)}:${key}/${gen.name}` });
    }
  }

  for (const p of (k.patches as unknown[] | undefined) ?? []) {
    if (!isRecord(p) || typeof p.path !== 'string' || Object.keys(p).some((f) => f !== 'path')) {
      problems.push({
        file: rel(kfile),
        message: 'only `patches: - path: <strategic merge patch>` is supported',
      });
      continue;
    }
    const path = resolve(dir, p.path);
    files.push(path);
    let docs: unknown[] = [];
    try {
      docs = parseYamlDocuments(readFileSync(path, 'utf8'), { version: '1.1' });
    } catch (err) {
      problems.push({ file: rel(path), message: `cannot read patch: ${(err as Error).message}` });
    }
    docs.forEach((patch, i) => {
      if (!isK8sObject(patch)) {
        problems.push({ file: `${rel(path)}#${i}`, message: 'patch is not a Kubernetes object' });
        return;
      }
      const target = objects.find(
        (o) =>
          o.object.kind === patch.kind &&
          o.object.apiVersion === patch.apiVersion &&
          o.object.metadata.name === patch.metadata.name,
      );
      if (target === undefined) {
        problems.push({
          file: `${rel(path)}#${i}`,
          message: `patch target ${patch.kind}/${patch.metadata.name} is not among the resources`,
        });
        return;
      }
      target.object = strategicMerge(target.object, patch) as K8sObject;
    });
  }

  if (Array.isArray(k.labels)) {
    for (const l of k.labels) {
      if (!isRecord(l) || !isRecord(l.pairs) || Object.keys(l).some((f) => f !== 'pairs')) {
        problems.push({
          file: rel(kfile),
          message: 'only `labels: - pairs: {...}` (metadata labels) is supported',
        });
        continue;
      }
      for (const o of objects)
        o.object.metadata.labels = {
          ...(o.object.metadata.labels ?? {}),
          ...(l.pairs as Record<string, string>),
        };
    }
  }

  for (const img of (k.images as unknown[] | undefined) ?? []) {
    if (!isRecord(img) || typeof img.name !== 'string') {
      problems.push({ file: rel(kfile), message: 'images entry without a name' });
      continue;
    }
    let used = false;
    for (const o of objects)
      visitContainers(o.object, (c) => {
        const image = typeof c.image === 'string' ? c.image : '';
        const name = image.replace(/[:@].*$/, '');
        if (name !== img.name) return;
        used = true;
        const newName = typeof img.newName === 'string' ? img.newName : name;
        c.image =
          typeof img.digest === 'string'
            ? `${newName}@${img.digest}`
            : `${newName}:${typeof img.newTag === 'string' ? img.newTag : 'latest'}`;
      });
    if (!used) problems.push({ file: rel(kfile), message: `images: no container uses ${img.name}` });
  }

  if (typeof k.namespace === 'string')
    for (const o of objects) if (o.object.kind !== 'Namespace') o.object.metadata.namespace = k.namespace;

  return { objects, problems, files };
}
