// What a route says of itself for the API document (openapi.ts renders it): its own file, so that the route
// definitions (routes.ts) and the document's generator (openapi.ts) both import it and not each other.
import type { ErrorCode } from '@platform/contracts';

/** A JSON Schema from @platform/contracts: written once, `as const`, with an `$id` (STYLE.md §3). */
export interface ContractSchema {
  readonly $id: string;
  readonly [keyword: string]: unknown;
}

/** A schema embedded in a contracts schema (a property's), which has no `$id` of its own. */
export type EmbeddedSchema = Readonly<Record<string, unknown>>;

export interface ParameterDoc {
  in: 'path' | 'header' | 'query';
  description?: string;
  /** Default: true for a path parameter, false otherwise. */
  required?: boolean;
  /** Written inline in the parameter (without its `$id`). */
  schema: ContractSchema | EmbeddedSchema;
}

/** A JSON body with more to say than its schema. */
export interface RequestBodyDoc {
  schema: ContractSchema;
  /** Default true. False: the route also takes a request without a body. */
  required?: boolean;
  description?: string;
  /** An example body, shown under the schema. */
  example?: unknown;
}

export interface HeaderDoc {
  description: string;
  /** The header is sent with every answer of this status. */
  required?: boolean;
}

export interface ResponseDoc {
  description: string;
  /** The body's schema; omitted for an answer without a body. */
  schema?: ContractSchema | { type: 'string' };
  /** Default `application/json`. */
  contentType?: string;
  headers?: Record<string, HeaderDoc>;
}

/** What a route's entry in the API document says beyond its method and path. */
export interface RouteDoc {
  operationId: string;
  summary: string;
  /** Prose for the portal's developers (Markdown). */
  description?: string;
  tags?: readonly string[];
  /** The security schemes the route accepts (names of `OpenApiInfo.securitySchemes`); empty or absent: public. */
  security?: readonly string[];
  /** Path parameters by name (each `:name` of the path must be here), then headers and query parameters. */
  parameters?: Readonly<Record<string, ParameterDoc>>;
  /** The JSON body's schema, or the schema and its prose (routes with `body: 'json'`). */
  requestBody?: ContractSchema | RequestBodyDoc;
  /** The success answers, by status. */
  responses: Readonly<Record<number, ResponseDoc>>;
  /**
   * Every error code the route may answer, besides those its JSON body brings (addRoutes' body reader:
   * invalid_json, invalid_body, payload_too_large, unsupported_media_type). Grouped by status, each status's
   * problem document lists them as the `code` it may carry.
   */
  errors?: readonly ErrorCode[];
}
