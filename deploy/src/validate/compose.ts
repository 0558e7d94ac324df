// docker-compose.yml against the Compose Specification JSON schema (vendored, deploy/schemas/README.md),
// plus the facts of the production shape the platform relies on (design §5).
import { readFileSync } from 'node:fs';
import { Ajv } from 'ajv';
import type { ValidateFunction } from 'ajv';
import addFormatsModule from 'ajv-formats';
import type { Problem } from './problems.js';
import { isRecord, parseYamlDocuments } from './yaml.js';

const addFormats = addFormatsModule.default;
let compiled: ValidateFunction | undefined;

function composeSchemaValidator(): ValidateFunction {
  if (compiled !== undefined) return compiled;
  const schema = JSON.parse(
    readFileSync(new URL('../../schemas/compose-spec.json', import.meta.url), 'utf8'),
  ) as Record<string, unknown>;
  // The file names its meta-schema "https://json-schema.org/draft-07/schema"; Ajv's draft-07 is the
  // same meta-schema under the http URL, so compile it as draft-07 without the alias.
  delete schema.$schema;
  // strict: false: the spec uses annotations Ajv does not know (e.g. "deprecated" on draft-07).
  const ajv = new Ajv({ allErrors: true, strict: false });
  addFormats(ajv);
  compiled = ajv.compile(schema);
  return compiled;
}

/** Names interpolated as ${NAME}, ${NAME:?msg}, ${NAME:-default} ($$ escapes and comment lines excluded). */
export function composeVariables(text: string): Set<string> {
  const names = new Set<string>();
  const code = text
    .split(/\r?\n/)
    .filter((line) => !line.trimStart().startsWith('#'))
    .join('\n');
  for (const m of code.matchAll(/(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)/g)) names.add(m[1]!);
  return names;
}

/** Keys defined in a dotenv file. */
export function dotenvKeys(text: string): Set<string> {
  const keys = new Set<string>();
  for (const line of text.split(/\r?\n/)) {
    const m = /^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=/.exec(line);
    if (m) keys.add(m[1]!);
  }
  return keys;
}

const SECRET_NAME = /(PASSWORD|SECRET|TOKENS?|API_KEYS?|AUTH_TOKEN(_[A-Z0-9]+)?)$/;
const URL_WITH_PASSWORD = /^[a-z][a-z0-9+.-]*:\/\/[^/:@\s]+:([^@\s]+)@/i;

function environmentOf(service: Record<string, unknown>): Record<string, string> {
  const env = service.environment;
  const out: Record<string, string> = {};
  if (Array.isArray(env)) {
    for (const item of env) {
      if (typeof item !== 'string') continue;
      const i = item.indexOf('=');
      if (i > 0) out[item.slice(0, i)] = item.slice(i + 1);
    }
  } else if (isRecord(env)) {
    for (const [k, v] of Object.entries(env))
      out[k] = typeof v === 'string' ? v : v === null ? '' : JSON.stringify(v);
  }
  return out;
}

function dependsOn(service: Record<string, unknown>): Record<string, string> {
  const deps = service.depends_on;
  const out: Record<string, string> = {};
  if (Array.isArray(deps)) for (const d of deps) out[String(d)] = 'service_started';
  else if (isRecord(deps))
    for (const [name, spec] of Object.entries(deps))
      out[name] = isRecord(spec) && typeof spec.condition === 'string' ? spec.condition : 'service_started';
  return out;
}

export interface ComposeCheckOptions {
  file?: string;
  /** Contents of .env.example: every interpolated variable must be listed there. */
  envExample?: string;
}

/** Schema and platform checks of a compose file; an empty list means valid. */
export function validateCompose(text: string, options: ComposeCheckOptions = {}): Problem[] {
  const file = options.file ?? 'docker-compose.yml';
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file, message });
  };
  let docs: unknown[];
  try {
    docs = parseYamlDocuments(text, { version: '1.2' });
  } catch (err) {
    add(`YAML: ${(err as Error).message}`);
    return problems;
  }
  if (docs.length !== 1 || !isRecord(docs[0])) {
    add('must be exactly one YAML mapping');
    return problems;
  }
  const doc = docs[0];
  const validate = composeSchemaValidator();
  if (!validate(doc)) {
    for (const e of validate.errors ?? []) {
      const extra = e.keyword === 'additionalProperties' ? ` (${String(e.params.additionalProperty)})` : '';
      add(`schema: ${e.instancePath || '/'} ${e.message ?? e.keyword}${extra}`);
    }
  }

  const services = isRecord(doc.services) ? doc.services : {};
  for (const [name, raw] of Object.entries(services)) {
    if (!isRecord(raw)) continue;
    for (const [dep, condition] of Object.entries(dependsOn(raw))) {
      if (!(dep in services)) add(`services.${name}.depends_on names unknown service "${dep}"`);
      else if (
        condition === 'service_healthy' &&
        !isRecord((services[dep] as Record<string, unknown>).healthcheck)
      )
        add(`services.${name} waits for ${dep} to be healthy but ${dep} has no healthcheck`);
    }
    for (const [key, value] of Object.entries(environmentOf(raw))) {
      const isSecret = SECRET_NAME.test(key);
      const urlPassword = URL_WITH_PASSWORD.exec(value)?.[1];
      if (isSecret && value !== '' && !value.includes('${'))
        add(`services.${name}.environment.${key} is a literal secret; take it from .env (\${${key}:?})`);
      if (urlPassword !== undefined && !urlPassword.includes('${'))
        add(`services.${name}.environment.${key} holds a URL with a literal password`);
    }
  }

  if (options.envExample !== undefined) {
    const listed = dotenvKeys(options.envExample);
    for (const name of composeVariables(text))
      if (!listed.has(name)) add(`\${${name}} is not listed in .env.example`);
  }
  return problems;
}

/** The production shape's own requirements (design §5), on top of the schema. */
export function checkPlatformCompose(text: string, file = 'docker-compose.yml'): Problem[] {
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file, message });
  };
  let doc: unknown;
  try {
    doc = parseYamlDocuments(text, { version: '1.2' })[0];
  } catch (err) {
    add(`YAML: ${(err as Error).message}`);
    return problems;
  }
  const services = isRecord(doc) && isRecord(doc.services) ? doc.services : {};
  const service = (name: string): Record<string, unknown> | undefined => {
    const s = services[name];
    if (!isRecord(s)) add(`service "${name}" is missing`);
    return isRecord(s) ? s : undefined;
  };
  for (const name of ['postgres', 'migrate', 'postgrest', 'minio', 'keycloak']) service(name);

  for (const name of ['device-gateway', 'enterprise-workflow', 'postgrest', 'jwks-sync']) {
    const s = service(name);
    if (s === undefined) continue;
    if (dependsOn(s).migrate === undefined && !(name === 'postgrest'))
      add(`${name} must depend on migrate (condition service_completed_successfully)`);
    else if (dependsOn(s).migrate !== undefined && dependsOn(s).migrate !== 'service_completed_successfully')
      add(`${name} must wait for migrate with condition service_completed_successfully`);
  }
  for (const name of ['device-gateway', 'enterprise-workflow']) {
    const s = service(name);
    if (s !== undefined && !isRecord(s.healthcheck)) add(`${name} has no healthcheck`);
  }

  const postgrest = service('postgrest');
  if (postgrest !== undefined) {
    const env = environmentOf(postgrest);
    for (const key of ['PGRST_JWT_AUD', 'PGRST_DB_PRE_REQUEST', 'PGRST_DB_PRE_CONFIG', 'PGRST_DB_ANON_ROLE'])
      if (!env[key]) add(`postgrest.environment.${key} is not set`);
    if (!(postgrest.ports as unknown[] | undefined)?.some((p) => String(p).includes('3850')))
      add('postgrest must publish port 3850');
  }

  // People on the gateway's /api (design §3.1): the realm's tokens as the workflow takes them, so the same issuer
  // (the public URL, as tokens carry it) and the same JWKS; without an issuer the gateway takes API keys only.
  const gateway = service('device-gateway');
  const workflow = service('enterprise-workflow');
  if (gateway !== undefined && workflow !== undefined) {
    const gw = environmentOf(gateway);
    const wf = environmentOf(workflow);
    if (!gw.GATEWAY_OIDC_ISSUER_URL)
      add('device-gateway.environment.GATEWAY_OIDC_ISSUER_URL is not set: its /api would take API keys only');
    else if (gw.GATEWAY_OIDC_ISSUER_URL !== wf.OIDC_ISSUER_URL)
      add(
        "device-gateway's GATEWAY_OIDC_ISSUER_URL must be enterprise-workflow's OIDC_ISSUER_URL (one realm)",
      );
    if (gw.GATEWAY_OIDC_JWKS_URL !== wf.OIDC_JWKS_URL)
      add("device-gateway's GATEWAY_OIDC_JWKS_URL must be enterprise-workflow's OIDC_JWKS_URL");
  }

  const minio = service('minio');
  if (minio !== undefined) {
    const env = environmentOf(minio);
    const ids = Object.keys(env)
      .map((k) => /^MINIO_NOTIFY_WEBHOOK_ENDPOINT_(.+)$/.exec(k)?.[1])
      .filter((id): id is string => id !== undefined);
    if (ids.length === 0) add('minio has no MINIO_NOTIFY_WEBHOOK_ENDPOINT_<ID> target');
    for (const id of ids) {
      if (env[`MINIO_NOTIFY_WEBHOOK_ENABLE_${id}`] !== 'on') add(`minio webhook ${id} is not enabled`);
      if (!env[`MINIO_NOTIFY_WEBHOOK_ENDPOINT_${id}`]!.endsWith('/internal/media/object-created'))
        add(`minio webhook ${id} does not point at /internal/media/object-created`);
      if (!env[`MINIO_NOTIFY_WEBHOOK_AUTH_TOKEN_${id}`]) add(`minio webhook ${id} has no auth token`);
      // Without queue_dir MinIO tries an event once and drops it (design §4.4).
      if (!env[`MINIO_NOTIFY_WEBHOOK_QUEUE_DIR_${id}`]) add(`minio webhook ${id} has no queue_dir`);
    }
  }
  return problems;
}
