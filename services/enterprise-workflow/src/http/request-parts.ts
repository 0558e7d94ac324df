// What every portal route reads from its request the same way: path ids, the caller, the Idempotency-Key.
import { IDEMPOTENCY_KEY_PATTERN, idempotencyKeySchema, isUuid, uuidPathSchema } from '@platform/contracts';
import type { ParameterDoc, RouteDefinition, RouteDoc } from '@platform/service-kit';
import type { Request, RequestHandler, Response } from 'express';
import type { UserScope } from '../domain/context.js';
import { ERRORS } from '../domain/errors.js';
import { portalUser } from './auth.js';

/** Express 5 forwards rejected promises to the error handler; this only narrows the types. */
type AsyncHandler = (req: Request, res: Response) => Promise<void>;
export const handle =
  (fn: AsyncHandler): RequestHandler =>
  (req, res, next) => {
    fn(req, res).catch(next);
  };

type PathId = 'site_id' | 'media_id' | 'item_id';

/**
 * A path id that is not a UUID cannot name anything: answer as for an unknown resource (404),
 * before touching the database, exactly like an existing id outside the caller's sites.
 */
const notFound = {
  site_id: ERRORS.siteNotFound,
  media_id: ERRORS.mediaNotFound,
  item_id: ERRORS.workItemNotFound,
} satisfies Record<PathId, () => Error>;

export function pathId(req: Request, name: PathId): string {
  const value = req.params[name];
  if (!isUuid(value)) throw notFound[name]();
  return value.toLowerCase();
}

/** The path ids' entries in the API document. */
export const PATH_IDS = {
  site_id: { in: 'path', description: 'A site of the caller.', schema: uuidPathSchema },
  media_id: { in: 'path', description: 'A media item at that site.', schema: uuidPathSchema },
  item_id: { in: 'path', description: 'A work item at that site.', schema: uuidPathSchema },
} as const satisfies Record<PathId, ParameterDoc>;

/** The caller of a portal route, for the domain: the user requireUser verified, the request's id and log. */
export function userScope(req: Request, res: Response): UserScope {
  return { user: portalUser(res), requestId: req.id, log: req.log };
}

const IDEMPOTENCY_KEY = new RegExp(IDEMPOTENCY_KEY_PATTERN);

export const IDEMPOTENCY_KEY_HEADER = {
  in: 'header',
  description: '1–255 visible ASCII characters, scoped to the caller (design §4.5).',
  schema: idempotencyKeySchema,
} as const satisfies ParameterDoc;

export function idempotencyKey(req: Request): string | undefined {
  const raw = req.get('Idempotency-Key');
  if (raw === undefined) return undefined;
  const match = IDEMPOTENCY_KEY.exec(raw.trim());
  if (match === null) throw ERRORS.malformedIdempotencyKey();
  return match[1];
}

/** The site and media item a media route names. */
export function mediaIds(req: Request): { siteId: string; mediaId: string } {
  return { siteId: pathId(req, 'site_id'), mediaId: pathId(req, 'media_id') };
}

/** What every portal route may answer besides its own: no or a bad token, no role, 404, an outage. */
export const PORTAL_ERRORS = ['unauthorized', 'forbidden', 'not_found', 'backend_unavailable'] as const;

/**
 * A portal route: authenticated by `user` (a bearer JWT, design §4.1), its handler given the caller's scope,
 * documented with the portal token and the portal routes' common error codes besides its own.
 */
export function portalRoute(
  user: RequestHandler,
  route: Omit<RouteDefinition, 'authenticate' | 'handler' | 'doc'> & {
    doc: Omit<RouteDoc, 'security'>;
    handle: (req: Request, res: Response, scope: UserScope) => Promise<void>;
  },
): RouteDefinition {
  const { handle: act, doc, ...rest } = route;
  return {
    ...rest,
    authenticate: user,
    handler: handle((req, res) => act(req, res, userScope(req, res))),
    doc: { ...doc, security: ['portalToken'], errors: [...PORTAL_ERRORS, ...(doc.errors ?? [])] },
  };
}
