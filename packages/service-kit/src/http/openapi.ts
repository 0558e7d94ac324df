// The OpenAPI 3.1 document of a service, generated from its route definitions (after supabase/storage, whose
// routes carry their own schemas and whose API document follows from them). Each documented route names the
// contracts schemas of its parameters, body and answers and the error codes it may answer; statuses and
// titles come from the contracts' error catalogue. Nothing here is hand-kept beside the routes.
import { errorCatalogue, problemDocumentSchema } from '@platform/contracts';
import type { ErrorCode } from '@platform/contracts';
import type { ContractSchema, EmbeddedSchema, HeaderDoc, RequestBodyDoc, RouteDoc } from './route-doc.js';
import type { RouteDefinition } from './routes.js';

/** The parts of the document that are not routes. */
export interface OpenApiInfo {
  title: string;
  version: string;
  description: string;
  servers?: ReadonlyArray<{ url: string; description?: string }>;
  tags?: readonly string[];
  securitySchemes?: Readonly<Record<string, Record<string, unknown>>>;
  /** Response headers sent with every problem of a status: e.g. 401 WWW-Authenticate, 503 Retry-After. */
  problemHeaders?: Readonly<Record<number, Record<string, HeaderDoc>>>;
}

/** What addRoutes' JSON body reader answers (http/app.ts readJsonBody, problem.ts). */
export const JSON_BODY_ERRORS: readonly ErrorCode[] = [
  'invalid_json',
  'invalid_body',
  'payload_too_large',
  'unsupported_media_type',
];

const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** `…/upload-intent-request.json` → `UploadIntentRequest`, `…/device-settings.v1.json` → `DeviceSettingsV1`. */
function componentName(id: string): string {
  const base = id.slice(id.lastIndexOf('/') + 1).replace(/\.json$/, '');
  return base.replace(/(^|[-_.])([a-z0-9])/g, (_m, _sep, c: string) => c.toUpperCase());
}

/** Collects schemas under components, each once, its `$id` dropped and `$ref`s to other ids rewritten. */
class SchemaComponents {
  readonly byName = new Map<string, unknown>();
  private readonly names = new Map<string, string>();

  constructor(private readonly known: ReadonlyMap<string, ContractSchema>) {}

  ref(schema: ContractSchema | { type: 'string' }): unknown {
    if (!('$id' in schema)) return schema;
    const id = schema.$id;
    let name = this.names.get(id);
    if (name === undefined) {
      name = componentName(id);
      const other = [...this.names.entries()].find(([, n]) => n === name);
      if (other !== undefined) throw new Error(`schemas ${other[0]} and ${id} would share the name ${name}`);
      this.names.set(id, name);
      const { $id: _id, ...rest } = schema;
      this.byName.set(name, this.rewrite(JSON.parse(JSON.stringify(rest))));
    }
    return { $ref: `#/components/schemas/${name}` };
  }

  /** A schema inline (a parameter's), without its `$id`. */
  inline(schema: ContractSchema | EmbeddedSchema): unknown {
    const { $id: _id, ...rest } = schema;
    return this.rewrite(JSON.parse(JSON.stringify(rest)));
  }

  private rewrite(node: unknown): unknown {
    if (Array.isArray(node)) return node.map((item) => this.rewrite(item));
    if (typeof node !== 'object' || node === null) return node;
    const out: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(node)) {
      if (key === '$ref' && typeof value === 'string' && !value.startsWith('#')) {
        const target = this.known.get(value);
        if (target === undefined) throw new Error(`unknown schema ${value}`);
        return this.ref(target);
      }
      out[key] = this.rewrite(value);
    }
    return out;
  }
}

function problemResponse(
  status: number,
  codes: readonly ErrorCode[],
  components: SchemaComponents,
  info: OpenApiInfo,
): Record<string, unknown> {
  const headers = info.problemHeaders?.[status];
  return {
    description: codes.map((code) => `\`${code}\`: ${errorCatalogue[code].title}.`).join(' '),
    ...(headers === undefined ? {} : { headers: headerObjects(headers) }),
    content: {
      [PROBLEM_CONTENT_TYPE]: {
        schema: {
          allOf: [components.ref(problemDocumentSchema), { properties: { code: { enum: [...codes] } } }],
        },
      },
    },
  };
}

function headerObjects(headers: Record<string, HeaderDoc>): Record<string, unknown> {
  return Object.fromEntries(
    Object.entries(headers).map(([name, header]) => [
      name,
      {
        description: header.description,
        ...(header.required === true ? { required: true } : {}),
        schema: { type: 'string' },
      },
    ]),
  );
}

function requestBody(
  body: ContractSchema | RequestBodyDoc,
  components: SchemaComponents,
): Record<string, unknown> {
  const doc: RequestBodyDoc = '$id' in body ? { schema: body } : body;
  return {
    ...(doc.description === undefined ? {} : { description: doc.description }),
    required: doc.required ?? true,
    content: {
      'application/json': {
        schema: components.ref(doc.schema),
        ...(doc.example === undefined ? {} : { example: doc.example }),
      },
    },
  };
}

/** Express's `/sites/:site_id/…` as OpenAPI's `/sites/{site_id}/…`. */
function templatePath(path: string): string {
  return path.replace(/:([A-Za-z0-9_]+)/g, '{$1}');
}

function operation(
  route: RouteDefinition & { doc: RouteDoc },
  components: SchemaComponents,
  info: OpenApiInfo,
): Record<string, unknown> {
  const { doc } = route;
  const pathNames = [...route.path.matchAll(/:([A-Za-z0-9_]+)/g)].map((m) => m[1]!);
  const parameters = Object.entries(doc.parameters ?? {});
  for (const name of pathNames) {
    if (doc.parameters?.[name]?.in !== 'path') {
      throw new Error(`${route.method} ${route.path}: path parameter ${name} is not documented`);
    }
  }
  if (route.body === 'json' && doc.requestBody === undefined) {
    throw new Error(`${route.method} ${route.path}: a JSON body without its schema`);
  }
  const codes = [...new Set([...(route.body === 'json' ? JSON_BODY_ERRORS : []), ...(doc.errors ?? [])])];
  const byStatus = new Map<number, ErrorCode[]>();
  for (const code of codes) {
    const status = errorCatalogue[code].status;
    byStatus.set(status, [...(byStatus.get(status) ?? []), code]);
  }
  const responses: Record<string, unknown> = {};
  const statuses = [...new Set([...Object.keys(doc.responses).map(Number), ...byStatus.keys()])].sort(
    (a, b) => a - b,
  );
  for (const status of statuses) {
    const success = doc.responses[status];
    if (success !== undefined) {
      responses[String(status)] = {
        description: success.description,
        ...(success.headers === undefined ? {} : { headers: headerObjects(success.headers) }),
        ...(success.schema === undefined
          ? {}
          : {
              content: {
                [success.contentType ?? 'application/json']: { schema: components.ref(success.schema) },
              },
            }),
      };
    } else {
      responses[String(status)] = problemResponse(status, byStatus.get(status)!, components, info);
    }
  }
  return {
    ...(doc.tags === undefined ? {} : { tags: [...doc.tags] }),
    operationId: doc.operationId,
    summary: doc.summary,
    ...(doc.description === undefined ? {} : { description: doc.description }),
    security: (doc.security ?? []).map((scheme) => ({ [scheme]: [] })),
    ...(parameters.length === 0
      ? {}
      : {
          parameters: parameters.map(([name, p]) => ({
            name,
            in: p.in,
            required: p.required ?? p.in === 'path',
            ...(p.description === undefined ? {} : { description: p.description }),
            schema: components.inline(p.schema),
          })),
        }),
    ...(doc.requestBody === undefined ? {} : { requestBody: requestBody(doc.requestBody, components) }),
    responses,
  };
}

/**
 * The document of `routes`: every route must carry its `doc` (a route left out of the API document is a
 * mistake the generator refuses). `schemas` are the contracts schemas that others may `$ref` by `$id`.
 */
export function openApiDocument(
  info: OpenApiInfo,
  routes: readonly RouteDefinition[],
  schemas: readonly ContractSchema[] = [],
): Record<string, unknown> {
  const components = new SchemaComponents(new Map(schemas.map((schema) => [schema.$id, schema])));
  const paths: Record<string, Record<string, unknown>> = {};
  for (const route of routes) {
    if (route.doc === undefined) throw new Error(`${route.method} ${route.path} has no doc`);
    const path = templatePath(route.path);
    paths[path] ??= {};
    paths[path][route.method.toLowerCase()] = operation(
      route as RouteDefinition & { doc: RouteDoc },
      components,
      info,
    );
  }
  return {
    openapi: '3.1.0',
    info: { title: info.title, version: info.version, description: info.description },
    ...(info.servers === undefined ? {} : { servers: info.servers.map((server) => ({ ...server })) }),
    ...(info.tags === undefined ? {} : { tags: info.tags.map((name) => ({ name })) }),
    paths,
    components: {
      ...(info.securitySchemes === undefined ? {} : { securitySchemes: info.securitySchemes }),
      schemas: Object.fromEntries([...components.byName.entries()].sort(([a], [b]) => (a < b ? -1 : 1))),
    },
  };
}
