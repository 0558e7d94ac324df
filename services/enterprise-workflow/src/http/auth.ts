// Edge authentication: bearer JWTs for portal routes, shared tokens for the storage webhook. Each is a
// route's `authenticate` step (service-kit addRoutes), so it runs once per request, before the body is read.
import { bearerToken } from '@platform/service-kit';
import type { SecretSet } from '@platform/service-kit';
import type { Request, RequestHandler, Response } from 'express';
import type { TokenVerifier } from '../auth/token-verifier.js';
import { ERRORS } from '../domain/errors.js';
import type { PortalUser } from '../domain/ports.js';

/** RFC 6750 challenge; the realm names the Keycloak realm the token must come from. */
function challenge(error?: 'invalid_token'): Record<string, string> {
  return {
    'WWW-Authenticate':
      error === undefined ? 'Bearer realm="platform"' : `Bearer realm="platform", error="${error}"`,
  };
}

export const WEBHOOK_PATH = '/internal/media/object-created';

/**
 * Portal routes: the verified user, kept for the handler (`portalUser(res)`). No token means the anonymous
 * role, which may do nothing here (design §4.1): 401. An invalid token is 401, a valid token without the
 * portal role 403, unreachable signing keys 503.
 */
export function requireUser(verifier: TokenVerifier): RequestHandler {
  return (req, res, next) => {
    verify(req, verifier).then((user) => {
      res.locals.portalUser = user;
      next();
    }, next);
  };
}

/** The user `requireUser` verified for this request. */
export function portalUser(res: Response): PortalUser {
  const user = res.locals.portalUser as PortalUser | undefined;
  // A route that reads the user without requireUser before it is a wiring mistake, never a client's.
  if (user === undefined) throw new Error('portal route registered without requireUser');
  return user;
}

async function verify(req: Request, verifier: TokenVerifier): Promise<PortalUser> {
  const token = bearerToken(req);
  if (token === undefined) throw ERRORS.tokenRequired(challenge());
  // bearerToken's '' is a repeated Authorization header: refused whatever its copies say (design §4.4).
  if (token === '')
    throw ERRORS.invalidToken(
      'The request carries more than one Authorization header.',
      challenge('invalid_token'),
    );
  const result = await verifier.verify(token);
  if (result.ok) return result.user;
  switch (result.reason) {
    case 'invalid_token':
      throw ERRORS.invalidToken(result.detail, challenge('invalid_token'));
    case 'insufficient_role':
      throw ERRORS.portalRoleMissing(result.detail);
    case 'keys_unavailable':
      req.log.warn('token signing keys unavailable', {
        jwks_url: verifier.jwksUrl,
        err: String(result.cause),
      });
      throw ERRORS.signingKeysUnavailable(result.detail, result.cause);
  }
}

/**
 * The webhook's shared secrets: several may be valid at once (rotation), compared in constant time. `tokens`
 * is asked per request, so a SIGHUP reload takes effect without a restart.
 */
export function requireWebhookToken(tokens: () => SecretSet): RequestHandler {
  return (req, _res, next) => {
    const token = bearerToken(req);
    // RFC 6750 §3.1: no error code when no token came; invalid_token for a wrong one, or for a repeated
    // Authorization header (bearerToken's ''), refused whatever its copies say, as on the portal routes.
    if (token === undefined || !tokens().has(token)) {
      next(ERRORS.webhookTokenRequired(challenge(token === undefined ? undefined : 'invalid_token')));
      return;
    }
    next();
  };
}
