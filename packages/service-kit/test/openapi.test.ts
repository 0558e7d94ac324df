// The OpenAPI generator (http/openapi.ts): what a route's `doc` becomes, with a gateway-shaped route whose body
// schema `$ref`s another contracts schema by `$id`.
import {
  deviceSettingsSchema,
  gatewayUpdatedResponseSchema,
  notifySettingsRequestSchema,
} from '@platform/contracts';
import { openApiDocument } from '../src/index.js';
import type { OpenApiInfo, RouteDefinition } from '../src/index.js';

const info: OpenApiInfo = {
  title: 't',
  version: '1',
  description: 'd',
  securitySchemes: { apiKey: { type: 'http', scheme: 'bearer' } },
  problemHeaders: { 503: { 'Retry-After': { description: 'Seconds.', required: true } } },
};
const handler: RouteDefinition['handler'] = (_req, res) => {
  res.end();
};

const notify: RouteDefinition = {
  method: 'POST',
  path: '/api/devices/:device_id/settings',
  body: 'json',
  handler,
  doc: {
    operationId: 'notify',
    summary: 'Notify',
    security: ['apiKey'],
    parameters: {
      device_id: {
        in: 'path',
        schema: { $id: 'https://platform.example/schemas/x-id.json', type: 'string' },
      },
    },
    requestBody: notifySettingsRequestSchema,
    responses: { 200: { description: 'Sent.', schema: gatewayUpdatedResponseSchema } },
    errors: ['unauthorized', 'unknown_device', 'backend_unavailable'],
  },
};

/** The generated document, read as a tree of objects (the test only reads what it expects to be there). */
interface Tree {
  [key: string]: Tree;
}

describe('openApiDocument', () => {
  it('turns a route doc into an operation: parameters, body, answers, and its codes grouped by status', () => {
    const doc = openApiDocument(info, [notify], [deviceSettingsSchema]) as unknown as Tree;
    const op = doc.paths!['/api/devices/{device_id}/settings']!.post!;
    expect(op.security).toEqual([{ apiKey: [] }]);
    expect(op.parameters).toEqual([
      { name: 'device_id', in: 'path', required: true, schema: { type: 'string' } },
    ]);
    expect(Object.keys(op.responses!)).toEqual(['200', '400', '401', '404', '413', '415', '503']);
    // The JSON body's own codes come with `body: 'json'`; two codes of one status share its problem.
    expect(op.responses!['400']!.content!['application/problem+json']!.schema!.allOf!['1']).toEqual({
      properties: { code: { enum: ['invalid_json', 'invalid_body'] } },
    });
    expect(op.responses!['404']!.description).toBe('`unknown_device`: Unknown device.');
    expect(op.responses!['503']!.headers!['Retry-After']!.required).toBe(true);
    // Schemas by $id become components (without $id); a $ref to another contracts schema follows it.
    expect(doc.components!.schemas!.NotifySettingsRequest!.properties!.settings).toEqual({
      $ref: '#/components/schemas/DeviceSettingsV1',
    });
    expect(doc.components!.schemas!.DeviceSettingsV1!.$id).toBeUndefined();
    expect(Object.keys(doc.components!.schemas!).sort()).toEqual([
      'DeviceSettingsV1',
      'GatewayUpdatedResponse',
      'NotifySettingsRequest',
      'ProblemDocument',
    ]);
  });

  it('refuses a route without a doc, an undocumented path parameter and a JSON body without a schema', () => {
    expect(() => openApiDocument(info, [{ method: 'GET', path: '/x', handler }])).toThrow('has no doc');
    const { parameters: _p, ...noParams } = notify.doc!;
    expect(() => openApiDocument(info, [{ ...notify, doc: noParams }], [deviceSettingsSchema])).toThrow(
      'path parameter device_id is not documented',
    );
    const { requestBody: _b, ...noBody } = notify.doc!;
    expect(() => openApiDocument(info, [{ ...notify, doc: noBody }], [deviceSettingsSchema])).toThrow(
      'a JSON body without its schema',
    );
  });

  it('writes a body with its prose (optional, with an example) and a query parameter embedded in a schema', () => {
    const route: RouteDefinition = {
      method: 'POST',
      path: '/api/reload',
      body: 'json',
      handler,
      doc: {
        operationId: 'reload',
        summary: 'Reload',
        parameters: { limit: { in: 'query', schema: { type: 'integer', maximum: 5 } } },
        requestBody: {
          schema: { $id: 'https://platform.example/schemas/any-body.json', type: 'object' },
          required: false,
          example: { a: 1 },
        },
        responses: { 200: { description: 'Done.' } },
      },
    };
    const op = (openApiDocument(info, [route]) as unknown as Tree).paths!['/api/reload']!.post!;
    expect(op.requestBody).toEqual({
      required: false,
      content: {
        'application/json': { schema: { $ref: '#/components/schemas/AnyBody' }, example: { a: 1 } },
      },
    });
    expect(op.parameters).toEqual([
      { name: 'limit', in: 'query', required: false, schema: { type: 'integer', maximum: 5 } },
    ]);
  });
});
