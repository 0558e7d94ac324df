// One ajv instance for every schema of the platform, so formats and keywords are registered once and
// each validator is compiled once at module load.
//
// Dialect: JSON Schema draft-07 (ajv's default class). json-schema-to-ts derives the TypeScript types
// from the draft-07 keyword set, so validation and types read the schemas the same way. The schemas use
// only keywords whose meaning is identical in draft 2020-12 (no `definitions`, `dependencies`, array
// `items`), so they can be embedded unchanged in an OpenAPI 3.1 document.
import { Ajv, type AnySchemaObject, type ErrorObject, type SchemaValidateFunction } from 'ajv';
import addFormats from 'ajv-formats';
import { isIanaTimeZone } from './time-zone.js';

/** A validation failure of one value: `path` is a JSON Pointer (RFC 6901) into the validated document. */
export interface FieldError {
  path: string;
  message: string;
}

export type Validation<T> = { ok: true; value: T } | { ok: false; errors: FieldError[] };

export type Validator<T> = (data: unknown) => Validation<T>;

/** Most field errors reported for one document; keeps problem+json bodies small on hostile input. */
export const MAX_FIELD_ERRORS = 50;

const ajv = new Ajv({
  // Report every failing field at once; documents are bounded by the 64 KiB body limit.
  allErrors: true,
  strict: true,
  // strictRequired would reject `then: { required: [...] }` naming a property declared by the parent.
  strictRequired: false,
  // Validators only check: no defaults, no coercion, no removal of properties.
  useDefaults: false,
  coerceTypes: false,
  removeAdditional: false,
  // Errors carry their parent schema, so a `pattern` failure can use the schema's `patternMessage`.
  verbose: true,
});

// ajv-formats is CommonJS; under NodeNext its default import is `module.exports`, whose `default`
// property is the plugin itself.
addFormats.default(ajv, ['date-time', 'uri', 'uri-reference', 'json-pointer']);

// Annotation: a readable sentence for a failed `pattern`, instead of the regular expression itself.
ajv.addKeyword({ keyword: 'patternMessage', schemaType: 'string' });

ajv.addFormat('iana-time-zone', { type: 'string', validate: isIanaTimeZone });

// `{min, max}` bounds where both present must satisfy min <= max. The failure points at `min`, the
// entry that a caller has to change together with `max` (e.g. `/thresholds/temp_c/min`).
const minNotAboveMax: SchemaValidateFunction = (
  enabled: boolean,
  data: unknown,
  _parentSchema?: AnySchemaObject,
  dataCxt?: { instancePath: string },
): boolean => {
  if (!enabled || typeof data !== 'object' || data === null) return true;
  const { min, max } = data as { min?: unknown; max?: unknown };
  if (typeof min !== 'number' || typeof max !== 'number' || min <= max) return true;
  minNotAboveMax.errors = [
    {
      keyword: 'minNotAboveMax',
      instancePath: `${dataCxt?.instancePath ?? ''}/min`,
      params: { min, max },
      message: `must not be greater than max (${max})`,
    },
  ];
  return false;
};

ajv.addKeyword({
  keyword: 'minNotAboveMax',
  type: 'object',
  schemaType: 'boolean',
  errors: true,
  validate: minNotAboveMax,
});

function escapePointerToken(token: string): string {
  return token.replace(/~/g, '~0').replace(/\//g, '~1');
}

const formatMessages: Record<string, string> = {
  'iana-time-zone': 'must be an IANA time zone name such as "Europe/Berlin"',
  'date-time': 'must be an RFC 3339 date-time with a time zone offset, e.g. "2025-01-31T09:00:00Z"',
  uri: 'must be an absolute URI',
  'uri-reference': 'must be a URI reference',
  'json-pointer': 'must be a JSON Pointer',
};

function fieldError(error: ErrorObject): FieldError | undefined {
  const path = error.instancePath;
  const params = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case 'required':
      return {
        path: `${path}/${escapePointerToken(String(params.missingProperty))}`,
        message: 'is required',
      };
    case 'additionalProperties':
      return {
        path: `${path}/${escapePointerToken(String(params.additionalProperty))}`,
        message: 'is not an allowed property',
      };
    case 'propertyNames':
    case 'if':
      // Summaries of errors already reported for the offending name / the failing branch.
      return undefined;
    case 'false schema':
      return { path, message: 'is not allowed here' };
    case 'format':
      return { path, message: formatMessages[String(params.format)] ?? error.message ?? 'is invalid' };
    case 'minProperties':
      return {
        path,
        message: params.limit === 1 ? 'must have at least one property' : (error.message ?? 'is invalid'),
      };
    case 'enum':
      return {
        path,
        message: `must be one of ${(params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`,
      };
    case 'const':
      return { path, message: `must be ${JSON.stringify(params.allowedValue)}` };
    default: {
      const patternMessage = (error.parentSchema as { patternMessage?: unknown } | undefined)?.patternMessage;
      const message =
        error.keyword === 'pattern' && typeof patternMessage === 'string'
          ? patternMessage
          : (error.message ?? 'is invalid');
      // Errors raised while checking a property name carry that name; point at the entry itself.
      const propertyName = (error as ErrorObject & { propertyName?: string }).propertyName;
      if (propertyName !== undefined) {
        return { path: `${path}/${escapePointerToken(propertyName)}`, message: `property name ${message}` };
      }
      return { path, message };
    }
  }
}

/** ajv errors as `{path, message}` with JSON Pointer paths that name the offending member, deduplicated. */
export function toFieldErrors(errors: readonly ErrorObject[] | null | undefined): FieldError[] {
  const result: FieldError[] = [];
  const seen = new Set<string>();
  for (const error of errors ?? []) {
    const converted = fieldError(error);
    if (converted === undefined) continue;
    const key = `${converted.path}\u0000${converted.message}`;
    if (seen.has(key)) continue;
    seen.add(key);
    result.push(converted);
    if (result.length >= MAX_FIELD_ERRORS) break;
  }
  return result;
}

/**
 * Registers a schema with an `$id` so that others can `$ref` it. Must run before compiling a schema
 * that references it.
 */
export function registerSchema(schema: AnySchemaObject & { $id: string }): void {
  if (ajv.getSchema(schema.$id) === undefined) ajv.addSchema(schema);
}

/**
 * Compiles `schema` once (with the platform's formats and keywords) and returns a validator. The
 * validated value is returned as is (never modified) and typed as `T`; derive `T` from the schema.
 */
export function compileValidator<T>(schema: AnySchemaObject): Validator<T> {
  const validate =
    typeof schema.$id === 'string' && ajv.getSchema(schema.$id) !== undefined
      ? ajv.getSchema(schema.$id)!
      : ajv.compile(schema);
  return (data: unknown): Validation<T> => {
    if (validate(data)) return { ok: true, value: data as T };
    const errors = toFieldErrors(validate.errors);
    // Every failing ajv error maps to at least one field error, but never answer "invalid" with none.
    return { ok: false, errors: errors.length > 0 ? errors : [{ path: '', message: 'is invalid' }] };
  };
}
