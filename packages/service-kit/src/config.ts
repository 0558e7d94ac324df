import { Ajv } from 'ajv';
import type { ErrorObject } from 'ajv';
import addFormatsModule from 'ajv-formats';
import type { FromSchema, JSONSchema } from 'json-schema-to-ts';
import { isSensitiveKey, redactString } from './redact.js';

/** Deeply read-only view of a config object (the runtime value is deep-frozen to match). */
export type DeepReadonly<T> = T extends (infer U)[]
  ? readonly DeepReadonly<U>[]
  : T extends object
    ? { readonly [K in keyof T]: DeepReadonly<T[K]> }
    : T;

/** One rejected environment variable: its name and what is wrong with it. */
export interface ConfigProblem {
  variable: string;
  message: string;
}

/** Thrown by `loadConfig` with every problem at once; the message is readable as it stands. */
export class ConfigError extends Error {
  readonly problems: ConfigProblem[];

  constructor(problems: ConfigProblem[]) {
    super(
      `Invalid configuration (${problems.length} problem${problems.length === 1 ? '' : 's'}):\n` +
        problems.map((problem) => `  - ${problem.variable}: ${problem.message}`).join('\n'),
    );
    this.name = 'ConfigError';
    this.problems = problems;
  }
}

const addFormats = addFormatsModule.default;

function configAjv(): Ajv {
  // coerceTypes: environment values are strings ("8080" → 8080, "true" → true); useDefaults: unset
  // variables take the schema default; allErrors: report every bad variable at once. A fresh instance
  // per call, so the same schema (with its $id) can be loaded again, e.g. by tests; this runs at boot only.
  const ajv = new Ajv({ allErrors: true, coerceTypes: true, useDefaults: true, strict: true });
  addFormats(ajv);
  return ajv;
}

type ConfigSchema = JSONSchema & { type: 'object'; properties: Record<string, JSONSchema> };

/**
 * Reads the variables named by `schema.properties` from `env`, validates them (coercing strings to
 * the declared types and filling defaults) and returns a deep-frozen, typed object keyed by variable
 * name. Empty values count as unset; a string given for an `array` property is split on commas.
 * Fails fast with a `ConfigError` listing every bad variable; values of secret-looking variables
 * (or properties marked `writeOnly: true`) are never echoed.
 */
export function loadConfig<const S extends ConfigSchema>(
  schema: S,
  env?: Record<string, string | undefined>,
): DeepReadonly<FromSchema<S>>;
export function loadConfig(
  schema: ConfigSchema,
  env: Record<string, string | undefined> = process.env,
): unknown {
  const properties = schema.properties as Record<string, Exclude<JSONSchema, boolean>>;
  const input: Record<string, unknown> = {};
  for (const [name, property] of Object.entries(properties)) {
    const raw = env[name];
    if (raw === undefined || raw.trim() === '') continue;
    input[name] = property.type === 'array' ? splitList(raw) : raw;
  }

  const validate = configAjv().compile(schema);
  if (!validate(input)) {
    throw new ConfigError(describe(validate.errors ?? [], properties, env));
  }
  return deepFreeze(input);
}

function splitList(raw: string): string[] {
  return raw
    .split(/[,\n]/)
    .map((item) => item.trim())
    .filter((item) => item !== '');
}

function describe(
  errors: ErrorObject[],
  properties: Record<string, Exclude<JSONSchema, boolean>>,
  env: Record<string, string | undefined>,
): ConfigProblem[] {
  const problems: ConfigProblem[] = [];
  const seen = new Set<string>();
  for (const error of errors) {
    const variable =
      error.keyword === 'required'
        ? String((error.params as { missingProperty: string }).missingProperty)
        : (error.instancePath.split('/')[1] ?? '(config)');
    let message = error.keyword === 'required' ? 'is required but not set' : (error.message ?? 'is invalid');
    if (error.keyword === 'enum') {
      message += `: ${(error.params as { allowedValues: unknown[] }).allowedValues.map(String).join(', ')}`;
    }
    const raw = env[variable];
    const secret = isSensitiveKey(variable) || properties[variable]?.writeOnly === true;
    if (error.keyword !== 'required' && raw !== undefined && !secret) {
      message += ` (got ${JSON.stringify(redactString(raw))})`;
    }
    const key = `${variable}\u0000${message}`;
    if (seen.has(key)) continue;
    seen.add(key);
    problems.push({ variable, message });
  }
  return problems;
}

/** Freezes `value` and everything reachable from it (a configuration built from a validated one). */
export function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const item of Object.values(value)) deepFreeze(item);
  }
  return value;
}

/** The database deadlines of a service (see createDb): server-side statement, client-side statement, connect. */
export interface DatabaseDeadlines {
  statementTimeoutMs: number;
  queryTimeoutMs: number;
  connectionTimeoutMs: number;
}

/**
 * Reads DB_STATEMENT_TIMEOUT_MS, DB_QUERY_TIMEOUT_MS and DB_CONNECT_TIMEOUT_MS. The client-side deadline must
 * leave the server's own time to cancel a slow statement first (that keeps the connection); equal or lower,
 * every slow statement would cost a connection.
 */
export function databaseDeadlines(raw: {
  DB_STATEMENT_TIMEOUT_MS: number;
  DB_QUERY_TIMEOUT_MS: number;
  DB_CONNECT_TIMEOUT_MS: number;
}): DatabaseDeadlines {
  if (raw.DB_QUERY_TIMEOUT_MS <= raw.DB_STATEMENT_TIMEOUT_MS) {
    throw new ConfigError([
      {
        variable: 'DB_QUERY_TIMEOUT_MS',
        message: `must be above DB_STATEMENT_TIMEOUT_MS (${raw.DB_STATEMENT_TIMEOUT_MS})`,
      },
    ]);
  }
  return {
    statementTimeoutMs: raw.DB_STATEMENT_TIMEOUT_MS,
    queryTimeoutMs: raw.DB_QUERY_TIMEOUT_MS,
    connectionTimeoutMs: raw.DB_CONNECT_TIMEOUT_MS,
  };
}
