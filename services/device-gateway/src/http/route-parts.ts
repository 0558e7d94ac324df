// What the gateway's route files share: the API key step with its document entry, the body a route does not
// read, the settings-size problem, a list route's document.
import { gatewayUnusedBodySchema } from '@platform/contracts';
import {
  DomainError,
  type ContractSchema,
  type RequestBodyDoc,
  type RouteDefinition,
  type RouteDoc,
} from '@platform/service-kit';
import type { RequestHandler } from 'express';
import type { DocumentTooLargeError } from '../domain/gateway-state.js';
import { listQueryParameters, type ListQuerySchema } from './list-query.js';

export type DocumentedRoute = RouteDefinition & { doc: RouteDoc };

/**
 * The route behind the API key, checked before any body is read, and its document entry with it: the
 * `apiKey` scheme and 401 `unauthorized`.
 */
export function apiKeyStep(auth: RequestHandler): (route: DocumentedRoute) => DocumentedRoute {
  return (route) => ({
    ...route,
    authenticate: auth,
    doc: { ...route.doc, security: ['apiKey'], errors: ['unauthorized', ...(route.doc.errors ?? [])] },
  });
}

/** The body of a route that reads none of it (the reloads, the rollout actions). */
export const UNUSED_BODY: RequestBodyDoc = { schema: gatewayUnusedBodySchema, required: false };

/** What a list route's document says of its query and its page (its query read by list-query.ts). */
export function listDoc(
  query: ListQuerySchema,
  page: ContractSchema,
): Pick<RouteDoc, 'parameters' | 'responses' | 'errors'> {
  return {
    parameters: listQueryParameters(query),
    responses: { 200: { description: 'One page.', schema: page } },
    errors: ['invalid_query', 'backend_unavailable'],
  };
}

/** A notify's or a rollout's settings whose notification would not fit one CoAP datagram (design §3.3). */
export function settingsTooLarge(err: DocumentTooLargeError): DomainError {
  return new DomainError('settings_too_large', err.message, {
    errors: [
      {
        path: '/settings',
        message: `must encode to at most ${err.limitBytes} bytes (is ${err.encodedBytes})`,
      },
    ],
  });
}
