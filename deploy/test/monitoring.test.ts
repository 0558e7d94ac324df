// The monitoring files operators load: the rules pass `promtool check rules` and their
// unit tests (`promtool test rules`), the base's PrometheusRule equals the rules file, every alert links
// to an existing runbook section, the dashboards parse, and every metric a rule or a panel names is on
// the real /metrics of both services, started the way `npm start` runs them.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { jest } from '@jest/globals';
import { freePort } from '@platform/testkit';
import {
  checkAlertRules,
  checkDashboard,
  checkMonitoringFiles,
  checkPrometheusRuleEqualsFile,
  checkSelectorsAgainstExpositions,
  dashboardExpressions,
  exposedMetricNames,
  findObject,
  grafanaQueryAsPromql,
  kubectlKustomize,
  monitoringExpressions,
  monitoringFiles,
  parseRuleGroups,
  parseYamlDocuments,
  promtool,
  promqlSelectors,
  selectorsUsed,
} from '../src/validate/index.js';
import { breakText, readRepoFile, repoRoot } from './helpers.js';

jest.setTimeout(120_000);

/** The alerts docs/operations.md promises, by runbook section. */
const RUNBOOK_ALERTS: Record<string, string[]> = {
  'service-down': ['ServiceDown', 'ServiceReplicaDown'],
  'readiness-failing': ['ReadinessFailing'],
  '5xx-rate': ['Http5xxRateHigh'],
  'p99-latency': ['HttpLatencyP99High'],
  'database-unavailable': ['DatabaseUnavailable'],
  'coap-relations-near-the-cap': ['CoapRelationsNearCap'],
  'retransmissions-and-ack-timeouts': ['CoapRetransmissionRateHigh', 'CoapAckTimeoutsHigh'],
  'cluster-bus-disconnected': ['GatewayBusDisconnected'],
  'webhook-failures': ['WebhookFailures'],
  'jwks-fetch-failures': ['JwksFetchFailing'],
  'a-rollout-aborted': ['GatewayRolloutAborted'],
  'delivery-record-behind': ['GatewayDeliveryRecordBehind'],
  'dtls-handshake-failures': ['GatewayDtlsHandshakeFailures'],
  'rollout-driver-missing-or-failing': ['GatewayRolloutNoDriver', 'GatewayRolloutDriverFailing'],
};

/** Gateway dashboard panels (title fragments, lower case) beyond the validator's required ones, each with a metric it must query. */
const GATEWAY_PANELS: Record<string, string> = {
  'delivery record lag': 'gateway_delivery_record_lag_seconds',
  'delivery record writes': 'gateway_delivery_record_writes_total',
  'dtls handshakes': 'gateway_dtls_handshakes_total',
  'dtls handshake failures': 'gateway_dtls_handshake_failures_total',
  'dtls sessions': 'gateway_dtls_sessions',
  rollouts: 'gateway_rollouts',
  'rollout driver': 'gateway_rollout_driver',
};

/** The runbook's section "Alerts and dashboards", up to its first alert's section. */
function section10(runbook: string): string {
  const start = runbook.indexOf('## 10. Alerts and dashboards');
  return runbook.slice(start, runbook.indexOf('\n### ', start));
}

/** A throwaway copy of deploy/monitoring, for breaking. */
function monitoringCopy(): { dir: string; edit: (file: string, from: string | RegExp, to: string) => void } {
  const dir = mkdtempSync(join(tmpdir(), 'deploy-monitoring-'));
  cpSync(join(repoRoot, 'deploy/monitoring'), dir, { recursive: true });
  return {
    dir,
    edit: (file, from, to) => {
      const path = join(dir, file);
      writeFileSync(path, breakText(readFileSync(path, 'utf8'), from, to));
    },
  };
}

describe('alerting rules', () => {
  const rulesText = readRepoFile(monitoringFiles.rules);
  const runbook = readRepoFile(monitoringFiles.runbook);

  it('promtool check rules accepts the rules file', () => {
    const r = promtool(['check', 'rules', monitoringFiles.rules], repoRoot);
    expect(r.output).toContain('SUCCESS');
    expect(r.status).toBe(0);
  });

  it('promtool test rules passes every unit test', () => {
    const r = promtool(['test', 'rules', monitoringFiles.ruleTests], repoRoot);
    expect(r.output).toContain('SUCCESS');
    expect(r.status).toBe(0);
  });

  it('the unit tests fail when a threshold moves (they test the rules, not themselves)', () => {
    const copy = monitoringCopy();
    try {
      copy.edit('alerts.yaml', '> 0.2\n', '> 0.6\n');
      const r = promtool(['test', 'rules', 'alerts.test.yaml'], copy.dir);
      expect(r.status).not.toBe(0);
      expect(r.output).toMatch(/alertname: CoapRetransmissionRateHigh/);
    } finally {
      rmSync(copy.dir, { recursive: true, force: true });
    }
  });

  it('promtool check rules refuses a broken expression', () => {
    const copy = monitoringCopy();
    try {
      copy.edit(
        'alerts.yaml',
        'expr: gateway_bus_listening{job="device-gateway"} == 0',
        'expr: gateway_bus_listening{job=} == 0',
      );
      const r = promtool(['check', 'rules', 'alerts.yaml'], copy.dir);
      expect(r.status).not.toBe(0);
      expect(r.output).toMatch(/FAILED/);
    } finally {
      rmSync(copy.dir, { recursive: true, force: true });
    }
  });

  it('fails, naming promtool and its package, when promtool is not on PATH (never skips)', () => {
    const path = process.env.PATH;
    process.env.PATH = '/nonexistent';
    try {
      expect(() => promtool(['check', 'rules', monitoringFiles.rules], repoRoot)).toThrow(
        /promtool is not installed or not on PATH .*Debian package `prometheus`/,
      );
    } finally {
      process.env.PATH = path;
    }
  });

  it('has every alert the runbook names, each linking to its section', () => {
    const alerts = parseRuleGroups(rulesText).flatMap((g) => g.rules);
    for (const [section, names] of Object.entries(RUNBOOK_ALERTS))
      for (const name of names) {
        const rule = alerts.find((r) => r.alert === name);
        expect(rule?.annotations?.runbook_url).toMatch(new RegExp(`/docs/operations\\.md#${section}$`));
      }
    expect(checkAlertRules(rulesText, runbook, monitoringFiles.runbook, monitoringFiles.rules)).toEqual([]);
  });

  it('links each alert under the external label runbook_base_url, never a host written into the rules', () => {
    // The links pointed at a placeholder host (git.example.com) that every operator had to edit. Where the
    // repository is served is the Prometheus' own setting; without it a link is the runbook's repository path.
    const template = /^\{\{ \$externalLabels\.runbook_base_url \}\}\/docs\/operations\.md#[\w-]+$/;
    for (const rule of parseRuleGroups(rulesText).flatMap((g) => g.rules))
      expect({ alert: rule.alert, runbook_url: rule.annotations?.runbook_url }).toEqual({
        alert: rule.alert,
        runbook_url: expect.stringMatching(template) as unknown,
      });
    expect(section10(runbook)).toContain('`runbook_base_url`');
  });

  it('has a unit test in which each alert fires', () => {
    const tests = parseYamlDocuments(readRepoFile(monitoringFiles.ruleTests), { version: '1.2' })[0] as {
      tests: { alert_rule_test?: { alertname: string; exp_alerts: unknown[] }[] }[];
    };
    const firing = new Set(
      tests.tests.flatMap((t) =>
        (t.alert_rule_test ?? []).filter((c) => c.exp_alerts.length > 0).map((c) => c.alertname),
      ),
    );
    const alerts = parseRuleGroups(rulesText).flatMap((g) => g.rules.map((r) => r.alert));
    expect(alerts.filter((alert) => !firing.has(alert))).toEqual([]);
  });

  it('refuses a runbook link to a section that does not exist', () => {
    const broken = breakText(runbook, '### JWKS fetch failures', '### Signing keys');
    expect(checkAlertRules(rulesText, broken, monitoringFiles.runbook, monitoringFiles.rules)).toEqual([
      {
        file: `${monitoringFiles.rules} alert JwksFetchFailing`,
        message: 'runbook_url: docs/operations.md has no section #jwks-fetch-failures',
      },
    ]);
  });

  it('the PrometheusRule kubectl kustomize renders in the base equals the rules file', () => {
    const base = kubectlKustomize(join(repoRoot, 'deploy/k8s/base'), repoRoot);
    expect(base.problems).toEqual([]);
    const rule = findObject(base.objects, 'PrometheusRule', 'facility-platform');
    expect(checkPrometheusRuleEqualsFile(rule, rulesText)).toEqual([]);
    // …and names the alert that drifts.
    const drifted = breakText(rulesText, 'for: 1m\n', 'for: 5m\n');
    expect(checkPrometheusRuleEqualsFile(rule, drifted)).toEqual([
      expect.objectContaining({
        message: expect.stringContaining('facility-platform.device-gateway/CoapRelationsNearCap') as unknown,
      }),
    ]);
  });
});

describe('Grafana dashboards', () => {
  it('both dashboards are well formed, have the required panels, and their PromQL parses', () => {
    for (const [service, path] of Object.entries(monitoringFiles.dashboards))
      expect(checkDashboard(readRepoFile(path), path, service)).toEqual([]);
    expect(checkMonitoringFiles(repoRoot)).toEqual([]);
  });

  it('the gateway dashboard covers the delivery record, DTLS handshakes and sessions, and rollouts', () => {
    const path = monitoringFiles.dashboards['device-gateway'];
    const uses = dashboardExpressions(readRepoFile(path), path);
    for (const [title, metric] of Object.entries(GATEWAY_PANELS)) {
      const queried = uses
        .filter((use) => use.where.toLowerCase().includes(`panel "${title}`))
        .some((use) =>
          promqlSelectors(grafanaQueryAsPromql(use.expr)).selectors.some((s) => s.metric === metric),
        );
      expect({ title, metric, queried }).toEqual({ title, metric, queried: true });
    }
  });

  it('refuses a query that does not parse and a missing panel', () => {
    const path = monitoringFiles.dashboards['device-gateway'];
    const broken = breakText(
      breakText(
        readRepoFile(path),
        'sum by (outcome) (rate(gateway_coap_notifications_total',
        'sum by (outcome) (rate(gateway_coap_notifications_total))',
      ),
      '"title": "Database pool connections by state"',
      '"title": "Connections"',
    );
    const messages = checkDashboard(broken, path, 'device-gateway').map((p) => `${p.file}: ${p.message}`);
    expect(messages.join('\n')).toMatch(/panel "CoAP notifications by outcome".*PromQL: syntax error/);
    expect(messages).toContain(`${path}: no panel whose title mentions "pool"`);
  });
});

describe('PromQL metric names', () => {
  it('come from the syntax tree: functions, label names and strings are not metrics', () => {
    const s = promqlSelectors(
      'histogram_quantile(0.99, sum by (le, route) (rate(http_request_duration_seconds_bucket{route!="/metrics"}[5m]))) ' +
        '> 1 and on (job) {__name__="up", job="x"} == 0',
    );
    expect(s.errors).toEqual([]);
    expect(s.selectors.map((x) => x.metric)).toEqual(['http_request_duration_seconds_bucket', 'up']);
    expect(promqlSelectors('rate({__name__=~"gateway_.*"}[5m])').errors).toContain(
      'metric name matched by =~: __name__=~"gateway_.*" (name it)',
    );
  });

  it('histogram series are found through their family', () => {
    const names = exposedMetricNames(
      '# HELP h help\n# TYPE h histogram\n# HELP c help\n# TYPE c_total counter\nc_total{a="b"} 1\n',
    );
    expect([...names].sort()).toEqual(['c_total', 'h', 'h_bucket', 'h_count', 'h_sum']);
  });
});

interface Stack {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

describe('every metric the rules and dashboards use is on the running services’ /metrics', () => {
  const startScript = join(repoRoot, 'scripts/dist/start.js');
  let dataDir: string;
  let env: Record<string, string>;
  let stack: Stack | undefined;
  const expositions: Record<string, string> = {};

  beforeAll(async () => {
    if (!existsSync(startScript))
      throw new Error(`${startScript} is missing: run npx tsc -b (npm test does)`);
    dataDir = await mkdtemp(join(tmpdir(), 'platform-monitoring-'));
    // As root, embedded PostgreSQL runs as the OS user `postgres`, which must be able to enter the folder.
    await chmod(dataDir, 0o711);
    env = {
      PLATFORM_DATA_DIR: dataDir,
      LOCAL_POSTGRES_PORT: String(await freePort('tcp')),
      GATEWAY_HTTP_PORT: String(await freePort('tcp')),
      GATEWAY_COAP_PORT: String(await freePort('udp')),
      GATEWAY_COAPS_PORT: String(await freePort('udp')),
      PORT: String(await freePort('tcp')),
      LOCAL_S3_PORT: String(await freePort('tcp')),
      LOCAL_ISSUER_PORT: String(await freePort('tcp')),
      LOG_LEVEL: 'warn',
    };
    // A port found free above can be taken before the stack binds it (other test files open ephemeral UDP
    // sockets all the time): on EADDRINUSE the port it names gets a new free port, up to three starts.
    for (let attempt = 1; ; attempt++) {
      let output = '';
      const child = spawn(process.execPath, [startScript], {
        env: { PATH: process.env.PATH ?? '', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      child.stdout?.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr?.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      stack = { child, output: () => output, exited };
      const deadline = Date.now() + 90_000;
      while (!output.includes('local stack is up') && child.exitCode === null && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 200));
      if (output.includes('local stack is up')) break;
      const taken = /EADDRINUSE[^\n]*?:(\d+)\b/.exec(output)?.[1];
      const name = Object.keys(env).find((key) => key.endsWith('PORT') && env[key] === taken);
      if (attempt >= 3 || name === undefined)
        throw new Error(`stack did not come up:\n${output.slice(-3000)}`);
      await exited;
      env[name] = String(await freePort(/COAPS?_PORT$/.test(name) ? 'udp' : 'tcp'));
    }
    const gateway = `http://127.0.0.1:${env.GATEWAY_HTTP_PORT}`;
    const workflow = `http://127.0.0.1:${env.PORT}`;
    // Traffic on the routes the rules match, so that their route labels are recorded: probes, and a
    // webhook delivery as MinIO sends one (a JSON body) with a token the workflow does not know (401).
    for (const url of [
      `${gateway}/api/health`,
      `${gateway}/api/ready`,
      `${workflow}/health`,
      `${workflow}/ready`,
    ]) {
      const status = (await fetch(url)).status;
      if (status !== 200) throw new Error(`${url} answered ${status}, not 200`);
    }
    const hook = await fetch(`${workflow}/internal/media/object-created`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer not-a-webhook-token' },
      body: JSON.stringify({ EventName: 's3:ObjectCreated:Put', Records: [] }),
    });
    if (hook.status !== 401)
      throw new Error(`the webhook answered ${hook.status} to an unknown token, not 401`);
    expositions['device-gateway'] = await (await fetch(`${gateway}/metrics`)).text();
    expositions['enterprise-workflow'] = await (await fetch(`${workflow}/metrics`)).text();
  });

  afterAll(async () => {
    if (stack !== undefined && stack.child.exitCode === null && stack.child.signalCode === null) {
      stack.child.kill('SIGTERM');
      await stack.exited;
    }
    await rm(dataDir, { recursive: true, force: true });
  });

  it('names only exposed metrics, and routes the services record', () => {
    const { selectors, problems } = selectorsUsed(monitoringExpressions(repoRoot));
    expect(problems).toEqual([]);
    expect(selectors.length).toBeGreaterThan(30);
    expect(checkSelectorsAgainstExpositions(selectors, expositions)).toEqual([]);
  });

  it('reports a metric a service does not expose and a route it never records', () => {
    const { selectors } = selectorsUsed([
      { where: 'renamed', expr: 'rate(gateway_coap_notification_total{job="device-gateway"}[5m])' },
      { where: 'wrong service', expr: 'workflow_decisions_total{job="device-gateway"}' },
      {
        where: 'histogram',
        expr: 'rate(http_request_duration_seconds_count{job="enterprise-workflow"}[5m])',
      },
      { where: 'route', expr: 'http_requests_total{job="enterprise-workflow", route="/api/ready"}' },
    ]);
    expect(checkSelectorsAgainstExpositions(selectors, expositions)).toEqual([
      { file: 'renamed', message: 'metric gateway_coap_notification_total is not exposed by device-gateway' },
      { file: 'wrong service', message: 'metric workflow_decisions_total is not exposed by device-gateway' },
      { file: 'route', message: 'route "/api/ready" is recorded by none of enterprise-workflow' },
    ]);
  });
});
