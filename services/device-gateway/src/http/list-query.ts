// The query of a list route (GET /api/devices, GET /api/rollouts), read by its contracts schema
// (deviceListQuerySchema, rolloutListQuerySchema): the schema's enums, UUID format, integer range and default
// are the rules applied here, and the same schema documents the parameters in the API document.
import { isUuid } from '@platform/contracts';
import { DomainError, type ParameterDoc } from '@platform/service-kit';
import type { Request } from 'express';

const DIGITS = /^\d+$/;
/** RFC 3339 §5.6 date-time, with its offset (Z or ±hh:mm). */
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/i;

/** A query parameter's schema, as the contracts' list query schemas write them. */
interface QueryParameterSchema {
  readonly type?: string;
  readonly format?: string;
  readonly enum?: readonly string[];
  readonly pattern?: string;
  readonly minimum?: number;
  readonly maximum?: number;
  readonly default?: number;
  readonly description?: string;
}

export interface ListQuerySchema {
  readonly properties: Readonly<Record<string, QueryParameterSchema>>;
}

/** What a list query holds once checked: the page size, the decoded cursor, the other parameters given. */
export interface ListQuery<Cursor> {
  limit: number;
  cursor?: Cursor;
  /** The parameters other than `limit` and `cursor`, as given (a UUID in lower case). */
  filters: Record<string, string>;
}

/**
 * Checks the query whole: every problem listed (unknown parameters first, then each parameter in the schema's
 * order), each parameter at most once. `cursor` is whatever `decodeCursor` makes of the previous page's
 * `next_cursor`; one it cannot read was not issued by this API.
 */
export function readListQuery<Cursor>(
  req: Request,
  schema: ListQuerySchema,
  decodeCursor: (text: string) => Cursor | undefined,
): ListQuery<Cursor> {
  const errors: { path: string; message: string }[] = [];
  for (const name of Object.keys(req.query))
    if (!Object.hasOwn(schema.properties, name))
      errors.push({ path: `/query/${name.slice(0, 64)}`, message: 'is not a parameter of this route' });
  const query: ListQuery<Cursor> = { limit: 0, filters: {} };
  for (const [name, rule] of Object.entries(schema.properties)) {
    const path = `/query/${name}`;
    const value = req.query[name];
    if (name === 'limit') query.limit = rule.default ?? 0;
    if (value === undefined) continue;
    if (typeof value !== 'string') {
      errors.push({ path, message: 'must be given once' });
      continue;
    }
    if (name === 'cursor') {
      const cursor = decodeCursor(value);
      if (cursor === undefined) errors.push({ path, message: 'is not a cursor this API issued' });
      else query.cursor = cursor;
    } else if (rule.type === 'integer') {
      const min = rule.minimum ?? 1;
      const max = rule.maximum ?? 1;
      const n = Number(value);
      if (DIGITS.test(value) && value.length <= String(max).length && n >= min && n <= max) {
        if (name === 'limit') query.limit = n;
        else query.filters[name] = value;
      } else errors.push({ path, message: `must be an integer from ${min} to ${max}` });
    } else if (rule.enum !== undefined) {
      if (rule.enum.includes(value)) query.filters[name] = value;
      else errors.push({ path, message: `must be one of ${rule.enum.join(', ')}` });
    } else if (rule.pattern !== undefined) {
      // The schema's own pattern (ECMAScript, as ajv reads it); its description says it in words.
      if (value.length <= 400 && new RegExp(rule.pattern).test(value)) query.filters[name] = value;
      else errors.push({ path, message: `must be ${rule.description ?? `like ${rule.pattern}`}` });
    } else if (rule.format === 'uuid') {
      if (isUuid(value)) query.filters[name] = value.toLowerCase();
      else errors.push({ path, message: 'must be a UUID' });
    } else if (rule.format === 'date-time') {
      if (RFC3339.test(value) && Number.isFinite(Date.parse(value))) query.filters[name] = value;
      else errors.push({ path, message: 'must be an RFC 3339 date-time with an offset' });
    } else {
      throw new Error(`query parameter ${name}: no rule to read it by`);
    }
  }
  if (errors.length > 0)
    throw new DomainError('invalid_query', 'The query parameters are invalid.', { errors });
  return query;
}

/** The list's query parameters for the API document, each schema's description said of the parameter. */
export function listQueryParameters(schema: ListQuerySchema): Record<string, ParameterDoc> {
  return Object.fromEntries(
    Object.entries(schema.properties).map(([name, { description, ...rule }]) => [
      name,
      { in: 'query', ...(description === undefined ? {} : { description }), schema: rule },
    ]),
  );
}
