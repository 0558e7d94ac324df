// The operators' monitoring files: the Prometheus alerting rules (deploy/monitoring/alerts.yaml), their
// PrometheusRule copy in the Kubernetes base, and the Grafana dashboards. PromQL is read with Prometheus'
// own grammar (npm @prometheus-io/lezer-promql, the parser of Prometheus' web UI), so the metric names
// an expression uses come from its syntax tree, not from a pattern. `promtool` (Debian package
// `prometheus`) checks and unit-tests the rules themselves.
import { spawnSync } from 'node:child_process';
import { parser } from '@prometheus-io/lezer-promql';
import type { K8sObject } from './kubectl.js';
import type { Problem } from './problems.js';
import { isRecord, parseYamlDocuments } from './yaml.js';

/** Series Prometheus records itself for every target (not on any /metrics page). */
export const PROMETHEUS_SYNTHETIC_METRICS: ReadonlySet<string> = new Set(['up']);

type SyntaxNode = ReturnType<typeof parser.parse>['topNode'];

function children(node: SyntaxNode): SyntaxNode[] {
  const out: SyntaxNode[] = [];
  for (let c = node.firstChild; c !== null; c = c.nextSibling) out.push(c);
  return out;
}

function unquote(literal: string): string {
  // PromQL strings: "…" and '…' with Go escapes, or `…` raw.
  if (literal.startsWith('`')) return literal.slice(1, -1);
  const body = literal.slice(1, -1);
  return body.replace(/\\(.)/g, (_m, c: string) => ({ n: '\n', t: '\t', '\\': '\\' })[c] ?? c);
}

export interface LabelMatcher {
  label: string;
  op: '=' | '!=' | '=~' | '!~';
  value: string;
}

export interface VectorSelector {
  /** `name{…}`, or `{__name__="name"}`. */
  metric: string;
  matchers: LabelMatcher[];
}

export interface PromqlSelectors {
  selectors: VectorSelector[];
  /** Syntax errors, and selectors whose metric name cannot be known (`{__name__=~"…"}`). */
  errors: string[];
}

/** The vector selectors of a PromQL expression, from Prometheus' grammar. */
export function promqlSelectors(expr: string): PromqlSelectors {
  const out: PromqlSelectors = { selectors: [], errors: [] };
  const tree = parser.parse(expr);
  const text = (n: SyntaxNode): string => expr.slice(n.from, n.to);
  tree.iterate({
    enter: (ref) => {
      if (ref.type.isError) {
        out.errors.push(`syntax error at offset ${ref.from}: "${expr.slice(ref.from, ref.from + 20)}"`);
        return;
      }
      if (ref.name !== 'VectorSelector') return;
      const node = ref.node;
      const id = node.getChild('Identifier');
      let name = id === null ? undefined : text(id);
      const matcherList = node.getChild('LabelMatchers');
      const matchers: LabelMatcher[] = [];
      for (const m of matcherList === null ? [] : children(matcherList)) {
        if (m.name !== 'UnquotedLabelMatcher') {
          if (m.name !== '{' && m.name !== '}' && m.name !== ',')
            out.errors.push(`unsupported label matcher ${text(m)}`);
          continue;
        }
        const label = m.getChild('LabelName');
        const op = m.getChild('MatchOp');
        const value = m.getChild('StringLiteral');
        if (label === null || op === null || value === null) continue;
        const matcher: LabelMatcher = {
          label: text(label),
          op: text(op) as LabelMatcher['op'],
          value: unquote(text(value)),
        };
        matchers.push(matcher);
        if (matcher.label === '__name__') {
          if (matcher.op === '=') name = matcher.value;
          else out.errors.push(`metric name matched by ${matcher.op}: ${text(m)} (name it)`);
        }
      }
      if (name === undefined) out.errors.push(`selector without a metric name: ${text(node)}`);
      else out.selectors.push({ metric: name, matchers });
    },
  });
  return out;
}

/**
 * The literal values a positive matcher on `label` can take: `=`'s value, or the alternatives of an
 * `=~` made of plain text joined by `|` (anything fancier is skipped, not guessed).
 */
export function literalMatcherValues(matchers: readonly LabelMatcher[], label: string): string[] {
  const out: string[] = [];
  for (const m of matchers) {
    if (m.label !== label) continue;
    if (m.op === '=') out.push(m.value);
    else if (m.op === '=~' && /^[\w/:.-]+(\|[\w/:.-]+)*$/.test(m.value)) out.push(...m.value.split('|'));
  }
  return out;
}

/**
 * Grafana's interval variables replaced by a duration so that the query parses as PromQL; label values
 * may hold other variables (`"$instance"`): they are strings to the grammar.
 */
export function grafanaQueryAsPromql(expr: string): string {
  return expr.replace(/\$\{?__(rate_interval|interval|range)\}?/g, '5m');
}

export interface ExpressionUse {
  /** Where it is: alert name, or dashboard and panel. */
  where: string;
  expr: string;
}

export interface AlertRule {
  alert: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

/** The `groups` of a Prometheus rules file. */
export function parseRuleGroups(text: string): { name: string; rules: AlertRule[] }[] {
  const doc = parseYamlDocuments(text, { version: '1.2' })[0];
  if (!isRecord(doc) || !Array.isArray(doc.groups)) throw new Error('a rules file has a `groups` list');
  return doc.groups as { name: string; rules: AlertRule[] }[];
}

export function ruleExpressions(text: string): ExpressionUse[] {
  return parseRuleGroups(text).flatMap((g) =>
    g.rules.map((r) => ({ where: `alert ${r.alert} (group ${g.name})`, expr: r.expr })),
  );
}

interface GrafanaPanel {
  title?: string;
  type?: string;
  targets?: { expr?: string; refId?: string }[];
  panels?: GrafanaPanel[];
}

function panelsOf(panels: readonly GrafanaPanel[]): GrafanaPanel[] {
  return panels.flatMap((p) => [p, ...panelsOf(p.panels ?? [])]);
}

/** Every query of a Grafana dashboard: panel targets and `label_values(<selector>, label)` variables. */
export function dashboardExpressions(text: string, file: string): ExpressionUse[] {
  const doc = JSON.parse(text) as { panels?: GrafanaPanel[]; templating?: { list?: unknown[] } };
  const out: ExpressionUse[] = [];
  for (const panel of panelsOf(doc.panels ?? []))
    for (const t of panel.targets ?? [])
      if (typeof t.expr === 'string')
        out.push({ where: `${file} panel "${panel.title ?? '?'}" ${t.refId ?? ''}`.trim(), expr: t.expr });
  for (const v of doc.templating?.list ?? []) {
    if (!isRecord(v) || v.type !== 'query') continue;
    const query = isRecord(v.query) ? v.query.query : v.query;
    const selector = typeof query === 'string' ? /^label_values\((.+),\s*\w+\)$/.exec(query)?.[1] : undefined;
    if (selector !== undefined) out.push({ where: `${file} variable ${String(v.name)}`, expr: selector });
  }
  return out;
}

export interface SelectorUse extends VectorSelector {
  where: string;
}

/** Every vector selector of `uses`, with where it is used; and any expression that does not parse. */
export function selectorsUsed(uses: readonly ExpressionUse[]): {
  selectors: SelectorUse[];
  problems: Problem[];
} {
  const selectors: SelectorUse[] = [];
  const problems: Problem[] = [];
  for (const use of uses) {
    const s = promqlSelectors(grafanaQueryAsPromql(use.expr));
    for (const e of s.errors) problems.push({ file: use.where, message: `PromQL: ${e}` });
    for (const sel of s.selectors) selectors.push({ ...sel, where: use.where });
  }
  return { selectors, problems };
}

/**
 * Each selector's metric must be exposed by the service(s) its `job` matcher names (`job="x"` or
 * `job=~"x|y"`; any service when it names none), and each literal `route` it matches must be a route
 * label those services have recorded. `expositions` maps a job to the text of its /metrics.
 */
export function checkSelectorsAgainstExpositions(
  selectors: readonly SelectorUse[],
  expositions: Readonly<Record<string, string>>,
): Problem[] {
  const problems: Problem[] = [];
  const names = Object.fromEntries(
    Object.entries(expositions).map(([job, text]) => [job, exposedMetricNames(text)]),
  );
  const routes = Object.fromEntries(
    Object.entries(expositions).map(([job, text]) => [
      job,
      exposedLabelValues(text, 'http_requests_total', 'route'),
    ]),
  );
  for (const sel of selectors) {
    if (PROMETHEUS_SYNTHETIC_METRICS.has(sel.metric)) continue;
    const named = literalMatcherValues(sel.matchers, 'job');
    const unknown = named.filter((j) => !(j in expositions));
    if (unknown.length > 0) {
      problems.push({ file: sel.where, message: `job ${unknown.join(', ')} is none of the services` });
      continue;
    }
    const jobs = named.length > 0 ? named : Object.keys(expositions);
    const exposing = jobs.filter((j) => names[j]!.has(sel.metric));
    if (named.length > 0 ? exposing.length < jobs.length : exposing.length === 0)
      problems.push({
        file: sel.where,
        message: `metric ${sel.metric} is not exposed by ${jobs.filter((j) => !exposing.includes(j)).join(', ')}`,
      });
    for (const route of literalMatcherValues(sel.matchers, 'route'))
      if (!jobs.some((j) => routes[j]!.has(route)))
        problems.push({
          file: sel.where,
          message: `route "${route}" is recorded by none of ${jobs.join(', ')}`,
        });
  }
  return problems;
}

/**
 * Every series name a Prometheus text exposition can produce: each family of its `# TYPE` lines, with
 * `_bucket`, `_sum`, `_count` for a histogram and `_sum`, `_count` for a summary. Families without a
 * sample yet (a labelled counter never incremented) count: the name is what a rule refers to.
 */
export function exposedMetricNames(exposition: string): Set<string> {
  const names = new Set<string>();
  for (const line of exposition.split('\n')) {
    const m = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)/.exec(line);
    if (m === null) {
      const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/.exec(line);
      if (sample !== null) names.add(sample[1]!);
      continue;
    }
    const [, name, type] = m as unknown as [string, string, string];
    names.add(name);
    if (type === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(name + s);
    if (type === 'summary') for (const s of ['_sum', '_count']) names.add(name + s);
  }
  return names;
}

/** The values of `label` in the samples of `metric` in an exposition. */
export function exposedLabelValues(exposition: string, metric: string, label: string): Set<string> {
  const values = new Set<string>();
  const re = new RegExp(`(?:^|[{,])${label}="((?:[^"\\\\]|\\\\.)*)"`);
  for (const line of exposition.split('\n')) {
    if (!line.startsWith(`${metric}{`)) continue;
    const m = re.exec(line.slice(metric.length));
    if (m !== null) values.add(m[1]!.replace(/\\(.)/g, '$1'));
  }
  return values;
}

/** GitHub's anchors of a Markdown document's headings (lower case, punctuation dropped, spaces → -). */
export function markdownAnchors(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of markdown.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const m = fenced ? null : /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (m === null) continue;
    const base = m[1]!
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

/**
 * The rules file's own conventions: each alert has a severity, a summary and a `runbook_url` into an
 * existing section of the runbook (`runbookPath`, e.g. docs/operations.md).
 */
export function checkAlertRules(text: string, runbook: string, runbookPath: string, file: string): Problem[] {
  const problems: Problem[] = [];
  const anchors = markdownAnchors(runbook);
  let groups: ReturnType<typeof parseRuleGroups>;
  try {
    groups = parseRuleGroups(text);
  } catch (err) {
    return [{ file, message: (err as Error).message }];
  }
  for (const g of groups)
    for (const r of g.rules) {
      const where = `${file} alert ${r.alert}`;
      if (!['critical', 'warning'].includes(r.labels?.severity ?? ''))
        problems.push({ file: where, message: 'labels.severity must be critical or warning' });
      if (typeof r.annotations?.summary !== 'string')
        problems.push({ file: where, message: 'annotations.summary is missing' });
      const url = r.annotations?.runbook_url ?? '';
      const m = new RegExp(`/${runbookPath.replace(/[.]/g, '\\.')}#([\\w-]+)$`).exec(url);
      if (m === null)
        problems.push({ file: where, message: `runbook_url must link to ${runbookPath}#<section>` });
      else if (!anchors.has(m[1]!))
        problems.push({ file: where, message: `runbook_url: ${runbookPath} has no section #${m[1]!}` });
    }
  return problems;
}

/** JSON with object keys sorted: kustomize writes keys in alphabetical order, the rules file does not. */
function canonical(value: unknown): string {
  return JSON.stringify(value, (_k, v: unknown) =>
    isRecord(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : v,
  );
}

/** The PrometheusRule of the rendered base carries exactly the rules file's groups (order of lists kept). */
export function checkPrometheusRuleEqualsFile(object: K8sObject | undefined, rulesText: string): Problem[] {
  const where = 'PrometheusRule/facility-platform';
  if (object === undefined) return [{ file: where, message: 'missing from the rendered base' }];
  const spec = isRecord(object.spec) ? object.spec : {};
  const file = parseRuleGroups(rulesText);
  if (canonical(spec.groups) === canonical(file)) return [];
  // Name what differs: each rule as "group/alert" → its JSON, on both sides.
  const byName = (groups: unknown): Map<string, string> =>
    new Map(
      (Array.isArray(groups) ? (groups as { name?: string; rules?: AlertRule[] }[]) : []).flatMap((g) =>
        (g.rules ?? []).map((r) => [`${g.name ?? '?'}/${r.alert}`, canonical(r)] as const),
      ),
    );
  const deployed = byName(spec.groups);
  const source = byName(file);
  const differing = [...new Set([...deployed.keys(), ...source.keys()])].filter(
    (k) => deployed.get(k) !== source.get(k),
  );
  return [
    {
      file: where,
      message:
        `spec.groups differs from deploy/monitoring/alerts.yaml (${differing.join(', ') || 'group order or fields'}): ` +
        'edit alerts.yaml, then copy its groups into deploy/k8s/base/monitoring.yaml',
    },
  ];
}

/** Panels a dashboard must have (title fragments, case-insensitive), as docs/operations.md section 10 promises them. */
export const REQUIRED_PANELS: Record<string, readonly string[]> = {
  'device-gateway': [
    'requests',
    'latency',
    'errors by status',
    'coap relations',
    'notifications',
    'retransmissions',
    'bus',
    'pool',
  ],
  'enterprise-workflow': ['requests', 'latency', 'errors by status', 'webhook', 'decisions', 'pool'],
};

/** A Grafana dashboard's structure: title, uid, unique panel ids, a query in every graph, PromQL that parses. */
export function checkDashboard(text: string, file: string, service: string): Problem[] {
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file, message });
  };
  let doc: Record<string, unknown>;
  try {
    doc = JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    return [{ file, message: `JSON: ${(err as Error).message}` }];
  }
  if (typeof doc.title !== 'string' || doc.title === '') add('title is missing');
  if (typeof doc.uid !== 'string' || !/^[\w-]{1,40}$/.test(doc.uid))
    add('uid must be 1–40 letters, digits, - or _');
  if (typeof doc.schemaVersion !== 'number') add('schemaVersion is missing');
  const panels = panelsOf((doc.panels as GrafanaPanel[] | undefined) ?? []);
  const ids = panels.map((p) => (p as { id?: unknown }).id);
  if (new Set(ids).size !== ids.length || ids.some((id) => typeof id !== 'number'))
    add('every panel needs a unique numeric id');
  for (const p of panels) {
    if (p.type === 'row') continue;
    if ((p.targets ?? []).every((t) => typeof t.expr !== 'string' || t.expr.trim() === ''))
      add(`panel "${p.title ?? '?'}" has no query`);
  }
  const titles = panels.map((p) => (p.title ?? '').toLowerCase());
  for (const want of REQUIRED_PANELS[service] ?? [])
    if (!titles.some((t) => t.includes(want))) add(`no panel whose title mentions "${want}"`);
  problems.push(...selectorsUsed(dashboardExpressions(text, file)).problems);
  return problems;
}

/** Thrown when promtool cannot be run: the rules cannot be checked, which fails, never skips. */
export class PromtoolMissingError extends Error {
  constructor(cause: string) {
    super(
      `promtool is not installed or not on PATH (${cause}): the alerting rules are checked with ` +
        '`promtool check rules` and `promtool test rules`. Install the Debian package `prometheus` ' +
        '(apt-get install prometheus) and run again.',
    );
    this.name = 'PromtoolMissingError';
  }
}

/** `promtool <args>` in `cwd`: its exit status and output (stdout and stderr). */
export function promtool(args: readonly string[], cwd: string): { status: number; output: string } {
  const r = spawnSync('promtool', args, { cwd, encoding: 'utf8', env: process.env, timeout: 60_000 });
  const code = (r.error as { code?: string } | undefined)?.code;
  if (code === 'ENOENT' || code === 'EACCES') throw new PromtoolMissingError(code);
  if (r.error !== undefined) throw r.error;
  return { status: r.status ?? 1, output: `${r.stdout}${r.stderr}` };
}
