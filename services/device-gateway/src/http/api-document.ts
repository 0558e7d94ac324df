// The gateway's OpenAPI document, generated from its routes (service-kit openApiDocument): `npm run openapi`
// writes it to openapi.yaml, and test/openapi.test.ts fails when the committed file differs.
import { gatewayReferencedSchemas } from '@platform/contracts';
import { openApiDocument, type OpenApiInfo } from '@platform/service-kit';
import type { RequestHandler } from 'express';
import { gatewayRoutes } from './routes.js';
import { overrideRoutes } from './override-routes.js';
import { apiKeyStep } from './route-parts.js';

const info: OpenApiInfo = {
  title: 'Device gateway management API',
  version: '1.0.0',
  description: `Management API of the device gateway (design §3.1). Devices talk CoAP (UDP 5683) to the same process;
this HTTP API is for on-call engineers and operations tools. Every error is RFC 9457 problem+json with a
stable \`code\`; each operation lists the codes it may answer under their status. Every response carries
\`X-Request-Id\` (taken from the request when well-formed). A request body is JSON (\`application/json\`,
else 415) of at most 64 KiB (else 413). 503 answers carry \`Retry-After\` (seconds).

Generated from the gateway's routes and @platform/contracts' schemas (\`npm run openapi\`); do not edit.
`,
  servers: [{ url: 'http://localhost:8080' }],
  securitySchemes: {
    apiKey: {
      type: 'http',
      scheme: 'bearer',
      description: 'An API key from GATEWAY_API_KEYS / GATEWAY_API_KEYS_FILE (several may be valid at once).',
    },
  },
  problemHeaders: {
    401: {
      'WWW-Authenticate': {
        description:
          '`Bearer realm="device-gateway"` (with `error="invalid_token"` for a key that is not valid).',
        required: true,
      },
    },
    503: { 'Retry-After': { description: 'Seconds to wait before retrying.', required: true } },
  },
};

/** The document of every route the gateway registers. Building the routes touches no dependency. */
export function gatewayApiDocument(): Record<string, unknown> {
  const pass: RequestHandler = (_req, _res, next) => {
    next();
  };
  const routes = [...gatewayRoutes({} as never, pass), ...overrideRoutes({} as never, apiKeyStep(pass))];
  return openApiDocument(info, routes, gatewayReferencedSchemas);
}
