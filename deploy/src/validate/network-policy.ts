// What the rendered NetworkPolicies let a workload's pods open, read the way Kubernetes reads them
// (https://kubernetes.io/docs/concepts/services-networking/network-policies/): egress is unrestricted for a pod
// no Egress policy selects; otherwise it is the union of the egress rules of every policy that selects it; a
// rule without `to` reaches anywhere, a rule without `ports` any port. Conservative where the manifests cannot
// tell: a peer that also selects pods, an ipBlock (for an address inside the cluster), a named port or a
// matchExpressions selector never counts as reaching a destination.
import type { K8sObject, RenderedObject } from './kubectl.js';
import { visitContainers } from './kubectl.js';
import { isRecord } from './yaml.js';

/** Where a workload connects: a namespace of the cluster (a `name.namespace.svc` host) or an outside host. */
export interface Destination {
  /** The namespace of an in-cluster Service; undefined for a host outside the cluster. */
  namespace: string | undefined;
  host: string;
  protocol: 'TCP' | 'UDP';
  port: number;
}

/** An http(s) URL as a destination: `svc.ns.svc[.cluster.local]` is namespace `ns`; default ports 80, 443. */
export function urlDestination(url: string): Destination | undefined {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return undefined;
  }
  const port =
    parsed.port !== ''
      ? Number(parsed.port)
      : parsed.protocol === 'https:'
        ? 443
        : parsed.protocol === 'http:'
          ? 80
          : NaN;
  if (!Number.isInteger(port)) return undefined;
  const inCluster = /^[a-z0-9-]+\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?$/.exec(parsed.hostname);
  return { namespace: inCluster?.[1], host: parsed.hostname, protocol: 'TCP', port };
}

function podTemplate(object: K8sObject): Record<string, unknown> | undefined {
  const spec = object.spec;
  if (!isRecord(spec)) return undefined;
  if (isRecord(spec.template)) return spec.template;
  const jt = spec.jobTemplate;
  if (isRecord(jt) && isRecord(jt.spec) && isRecord(jt.spec.template)) return jt.spec.template;
  return undefined;
}

/** The labels a workload's pods carry (its pod template's). */
export function podLabels(object: K8sObject): Record<string, string> {
  const metadata = podTemplate(object)?.metadata;
  const labels = isRecord(metadata) && isRecord(metadata.labels) ? metadata.labels : {};
  return Object.fromEntries(Object.entries(labels).map(([k, v]) => [k, String(v)]));
}

/** A label selector with matchLabels only; undefined (never matching) when it has matchExpressions. */
function matchLabelsOf(selector: unknown): Record<string, string> | undefined {
  if (!isRecord(selector)) return {};
  if (Array.isArray(selector.matchExpressions) && selector.matchExpressions.length > 0) return undefined;
  return isRecord(selector.matchLabels)
    ? Object.fromEntries(Object.entries(selector.matchLabels).map(([k, v]) => [k, String(v)]))
    : {};
}

function selects(selector: unknown, labels: Record<string, string>): boolean {
  const wanted = matchLabelsOf(selector);
  return wanted !== undefined && Object.entries(wanted).every(([k, v]) => labels[k] === v);
}

interface EgressRule {
  policy: string;
  to: unknown[] | undefined;
  ports: unknown[] | undefined;
}

/** The egress rules that apply to pods with `labels`; undefined when no Egress policy selects them (open). */
function egressRules(
  objects: readonly RenderedObject[],
  labels: Record<string, string>,
): EgressRule[] | undefined {
  let selected = false;
  const rules: EgressRule[] = [];
  for (const { object } of objects) {
    if (object.kind !== 'NetworkPolicy' || !isRecord(object.spec)) continue;
    const spec = object.spec;
    const types = Array.isArray(spec.policyTypes)
      ? spec.policyTypes
      : spec.egress !== undefined
        ? ['Egress']
        : [];
    if (!types.includes('Egress') || !selects(spec.podSelector, labels)) continue;
    selected = true;
    for (const rule of Array.isArray(spec.egress) ? spec.egress : [])
      if (isRecord(rule))
        rules.push({
          policy: object.metadata.name,
          to: Array.isArray(rule.to) && rule.to.length > 0 ? rule.to : undefined,
          ports: Array.isArray(rule.ports) && rule.ports.length > 0 ? rule.ports : undefined,
        });
  }
  return selected ? rules : undefined;
}

function describePeer(peer: unknown): string {
  if (!isRecord(peer)) return 'nothing';
  if (isRecord(peer.ipBlock)) {
    const except = Array.isArray(peer.ipBlock.except) ? ` except ${peer.ipBlock.except.join(',')}` : '';
    return `ipBlock ${String(peer.ipBlock.cidr)}${except}`;
  }
  const labels = (selector: unknown): string => {
    const m = matchLabelsOf(selector);
    return m === undefined
      ? 'matchExpressions'
      : Object.entries(m)
          .map(([k, v]) => `${k}=${v}`)
          .join(',') || 'all';
  };
  const parts: string[] = [];
  if (peer.namespaceSelector !== undefined) {
    const name = matchLabelsOf(peer.namespaceSelector)?.['kubernetes.io/metadata.name'];
    parts.push(
      name !== undefined && Object.keys(matchLabelsOf(peer.namespaceSelector)!).length === 1
        ? `namespace ${name}`
        : `namespaces ${labels(peer.namespaceSelector)}`,
    );
  } else parts.push('own namespace');
  if (peer.podSelector !== undefined) parts.push(`pods ${labels(peer.podSelector)}`);
  return parts.join(' ');
}

function describePort(port: unknown): string {
  if (!isRecord(port)) return 'any port';
  const protocol = typeof port.protocol === 'string' ? port.protocol : 'TCP';
  if (port.port === undefined) return `${protocol} any port`;
  // A port is a number or a named port (IntOrString).
  const scalar = (v: unknown): string =>
    typeof v === 'number' || typeof v === 'string' ? String(v) : JSON.stringify(v);
  return `${protocol} ${scalar(port.port)}${port.endPort !== undefined ? `-${scalar(port.endPort)}` : ''}`;
}

/**
 * Everything the policies let pods with `labels` open, one line per peer and port ("namespace identity TCP 8080",
 * "anywhere TCP 5432"), sorted; ["anywhere any port"] when no Egress policy selects them.
 */
export function describeEgress(objects: readonly RenderedObject[], labels: Record<string, string>): string[] {
  const rules = egressRules(objects, labels);
  if (rules === undefined) return ['anywhere any port'];
  const lines = new Set<string>();
  for (const rule of rules)
    for (const peer of rule.to ?? [undefined])
      for (const port of rule.ports ?? [undefined])
        lines.add(`${peer === undefined ? 'anywhere' : describePeer(peer)} ${describePort(port)}`);
  return [...lines].sort();
}

function peerReaches(peer: unknown, to: Destination): boolean {
  if (!isRecord(peer) || peer.ipBlock !== undefined || peer.podSelector !== undefined) return false;
  if (to.namespace === undefined || peer.namespaceSelector === undefined) return false;
  const wanted = matchLabelsOf(peer.namespaceSelector);
  if (wanted === undefined) return false;
  // A namespace's labels as the manifests know them: its automatic kubernetes.io/metadata.name.
  return Object.entries(wanted).every(([k, v]) => k === 'kubernetes.io/metadata.name' && v === to.namespace);
}

function portReaches(port: unknown, to: Destination): boolean {
  if (!isRecord(port)) return false;
  if ((typeof port.protocol === 'string' ? port.protocol : 'TCP') !== to.protocol) return false;
  if (port.port === undefined) return true;
  if (typeof port.port !== 'number') return false;
  const end = typeof port.endPort === 'number' ? port.endPort : port.port;
  return to.port >= port.port && to.port <= end;
}

/** The name of a policy that lets pods with `labels` reach `to`, or undefined when none does. */
export function egressAllowedBy(
  objects: readonly RenderedObject[],
  labels: Record<string, string>,
  to: Destination,
): string | undefined {
  const rules = egressRules(objects, labels);
  if (rules === undefined) return '(no Egress policy selects the pods)';
  return rules.find(
    (rule) =>
      (rule.to === undefined || rule.to.some((peer) => peerReaches(peer, to))) &&
      (rule.ports === undefined || rule.ports.some((port) => portReaches(port, to))),
  )?.policy;
}

/**
 * A workload's environment as its containers receive it (all its containers and init containers together):
 * every ConfigMap named by `envFrom` and every `env` entry, in that order (an `env` entry wins). An `env` value
 * from a Secret or another reference is null: the manifests do not hold it (nor the names of an `envFrom`
 * Secret's keys, which are left out).
 */
export function workloadEnvironment(
  objects: readonly RenderedObject[],
  workload: K8sObject,
): Record<string, string | null> {
  const env: Record<string, string | null> = {};
  visitContainers(workload, (c) => {
    for (const from of Array.isArray(c.envFrom) ? c.envFrom : []) {
      if (!isRecord(from) || !isRecord(from.configMapRef)) continue;
      const name = from.configMapRef.name;
      const cm = objects.find(
        (o) => o.object.kind === 'ConfigMap' && o.object.metadata.name === name,
      )?.object;
      const prefix = typeof from.prefix === 'string' ? from.prefix : '';
      if (cm !== undefined && isRecord(cm.data))
        for (const [k, v] of Object.entries(cm.data)) env[`${prefix}${k}`] = String(v);
    }
    for (const e of Array.isArray(c.env) ? c.env : [])
      if (isRecord(e) && typeof e.name === 'string')
        env[e.name] = typeof e.value === 'string' ? e.value : e.valueFrom !== undefined ? null : '';
  });
  return env;
}
