// The workflow's OpenAPI document, generated from its routes (service-kit openApiDocument): `npm run openapi`
// writes it to openapi.yaml, and test/openapi.test.ts fails when the committed file differs.
import { openApiDocument, Registry } from '@platform/service-kit';
import type { OpenApiInfo } from '@platform/service-kit';
import type { WorkflowContext } from '../domain/context.js';
import { workflowRoutes } from './routes.js';

const info: OpenApiInfo = {
  title: 'Enterprise workflow service',
  version: '0.1.0',
  description: `Writes of the enterprise portal (design §4.4): media upload intents and downloads through presigned
object-storage URLs, work-item decisions, and the object-store webhook. Reads go through PostgREST.

Portal endpoints take a Keycloak access token (realm \`platform\`, client \`platform-enterprise-web\`,
claim \`role = enterprise_portal_role\`), RS256 or ES256. Site access is data: a site, media item
or work item outside the caller's sites answers 404 exactly like one that does not exist.

Every non-2xx answer is \`application/problem+json\` (RFC 9457) with a stable \`code\`; each operation lists
the codes it may answer under their status. Every answer carries \`X-Request-Id\`. 503 answers carry
\`Retry-After\` (seconds).

Generated from the service's routes and @platform/contracts' schemas (\`npm run openapi\`); do not edit.
`,
  servers: [{ url: 'http://localhost:3800', description: 'local stack (`npm start`)' }],
  tags: ['media', 'work-items', 'internal', 'operations'],
  securitySchemes: {
    portalToken: {
      type: 'http',
      scheme: 'bearer',
      bearerFormat: 'JWT',
      description: 'Keycloak access token of realm `platform` for client `platform-enterprise-web`.',
    },
    webhookToken: { type: 'http', scheme: 'bearer', description: 'A shared secret from `WEBHOOK_TOKENS`.' },
  },
  problemHeaders: {
    401: {
      'WWW-Authenticate': {
        description: '`Bearer realm="platform"` (with `error="invalid_token"` for a rejected token).',
        required: true,
      },
    },
    503: { 'Retry-After': { description: 'Seconds to wait before retrying.', required: true } },
  },
};

/**
 * The document of every route the service can register (with /metrics). Building the routes reads nothing of
 * their dependencies but whether metrics are served; no handler runs.
 */
export function workflowApiDocument(): Record<string, unknown> {
  const routes = workflowRoutes({
    ctx: { metrics: new Registry() } as unknown as WorkflowContext,
    verifier: {} as never,
    webhookTokens: () => {
      throw new Error('not served');
    },
    checkReady: () => Promise.resolve({}),
  });
  return openApiDocument(info, routes);
}
