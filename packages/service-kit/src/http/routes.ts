import type { IRoute, RequestHandler } from 'express';
import { COMMON_ERRORS } from '../errors.js';
import type { RouteDoc } from './route-doc.js';
import { DEFAULT_BODY_LIMIT_BYTES, readJsonBody } from './app.js';
import { CLIENT_ADDRESS } from './request-context.js';

export type HttpMethod = 'GET' | 'HEAD' | 'POST' | 'PUT' | 'PATCH' | 'DELETE' | 'OPTIONS';

export interface RouteDefinition {
  /** Either case; GET routes also answer HEAD (express does that). */
  method: HttpMethod | Lowercase<HttpMethod>;
  /** An express path pattern, e.g. `/sites/:site_id/media/:media_id/download`. */
  path: string;
  /**
   * The route's authentication, run before anything else of the route: a caller without credentials gets
   * its 401 before the server reads, inflates and parses a body for it, and before any 400/413/415 about
   * that body. Omitted on public routes.
   */
  authenticate?: RequestHandler;
  /** The route takes a JSON body, read after `authenticate` and before `handler` (see `readJsonBody`). */
  body?: 'json';
  /**
   * The route is reached without the trusted proxy in front (an internal route, e.g. the object store's
   * webhook): its client address, as logged, is the connection's peer, never `X-Forwarded-For`, which any
   * caller of such a route could write. Default: the app's `trustProxy` decides (`req.ip`). It holds for every
   * answer on the path (a 405 too) when any route of the path sets it.
   */
  direct?: boolean;
  handler: RequestHandler | RequestHandler[];
  /**
   * The route's entry in the API document (openapi.ts `openApiDocument`): its parameter, body and answer
   * schemas from @platform/contracts, the error codes it may answer, and the prose. Both services' routes carry
   * it; `openApiDocument` refuses a route without one (a route only a test registers may leave it out).
   */
  doc?: RouteDoc;
}

export interface AddRoutesOptions {
  /** Largest accepted JSON body in bytes (after decompression); default 64 KiB (design §3.1). */
  bodyLimitBytes?: number;
}

/** Anything with express's `route(path)`: an app or a Router. */
export interface RouteTarget {
  route(path: string): IRoute;
}

const ORDER: HttpMethod[] = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'];

/**
 * Registers the routes, each as one straight line: authenticate → read the body → the handler (which
 * validates, then acts). For each path, other methods get 405 `method_not_allowed` and an `Allow` header
 * (OPTIONS gets 204 with `Allow` unless a route defines it). Each matched request is tagged with its
 * route pattern for logs and metrics.
 */
export function addRoutes(
  target: RouteTarget,
  routes: readonly RouteDefinition[],
  options: AddRoutesOptions = {},
): void {
  const jsonBody = readJsonBody(options.bodyLimitBytes ?? DEFAULT_BODY_LIMIT_BYTES);
  const byPath = new Map<string, RouteDefinition[]>();
  for (const route of routes) {
    const group = byPath.get(route.path) ?? [];
    group.push(route);
    byPath.set(route.path, group);
  }

  for (const [path, group] of byPath) {
    const methods = new Set(group.map((route) => route.method.toUpperCase() as HttpMethod));
    if (methods.has('GET')) methods.add('HEAD');
    methods.add('OPTIONS');
    const allow = ORDER.filter((method) => methods.has(method)).join(', ');
    const definesOptions = group.some((route) => route.method.toUpperCase() === 'OPTIONS');

    const direct = group.some((route) => route.direct === true);

    const route = target.route(path);
    route.all((req, res, next) => {
      res.locals.route = `${req.baseUrl}${path}`;
      if (direct) res.locals[CLIENT_ADDRESS] = req.socket.remoteAddress;
      next();
    });
    for (const definition of group) {
      const handlers = [
        ...(definition.authenticate === undefined ? [] : [definition.authenticate]),
        ...(definition.body === 'json' ? jsonBody : []),
        ...(Array.isArray(definition.handler) ? definition.handler : [definition.handler]),
      ];
      const method = definition.method.toLowerCase() as Lowercase<HttpMethod>;
      route[method](...handlers);
    }
    route.all((req, res, next) => {
      if (req.method === 'OPTIONS' && !definesOptions) {
        res.setHeader('Allow', allow);
        res.status(204).end();
        return;
      }
      if (methods.has(req.method as HttpMethod)) {
        // A handler for this method passed the request on without answering it.
        next();
        return;
      }
      next(COMMON_ERRORS.methodNotAllowed(req.method, allow));
    });
  }
}
