// The HTTP edge: parses and validates requests, authenticates, calls the domain, shapes responses.
// Statuses come from DomainError codes; nothing below this folder knows about HTTP. Each route carries its
// entry in the API document (`doc`); api-document.ts generates openapi.yaml from them.
import type { RouteDefinition, SecretSet } from '@platform/service-kit';
import type { TokenVerifier } from '../auth/token-verifier.js';
import type { WorkflowContext } from '../domain/context.js';
import { requireUser } from './auth.js';
import { decisionRoutes } from './decision-routes.js';
import { mediaRoutes } from './media-routes.js';
import { multipartRoutes } from './multipart-routes.js';
import { operationsRoutes } from './operations-routes.js';
import { webhookRoutes } from './webhook-routes.js';

export interface RouteDeps {
  ctx: WorkflowContext;
  verifier: TokenVerifier;
  /** The webhook tokens valid now (SIGHUP may replace them). */
  webhookTokens: () => SecretSet;
  /** Readiness: database reachable, signing keys loaded. */
  checkReady: () => Promise<Record<string, 'ok' | 'failed'>>;
}

export function workflowRoutes(deps: RouteDeps): RouteDefinition[] {
  const user = requireUser(deps.verifier);
  return [
    ...operationsRoutes(deps.ctx, deps.checkReady),
    ...mediaRoutes(deps.ctx, user),
    ...multipartRoutes(deps.ctx, user),
    ...decisionRoutes(deps.ctx, user),
    ...webhookRoutes(deps.ctx, deps.webhookTokens),
  ];
}
