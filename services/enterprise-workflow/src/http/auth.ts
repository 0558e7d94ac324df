// Edge authentication: bearer JWTs for portal routes, shared tokens for the storage webhook.
import { DomainError, bearerToken } from '@platform/service-kit';
import type { SecretSet } from '@platform/service-kit';
import type { Request, RequestHandler } from 'express';
import type { PortalUser, TokenVerifier } from '../auth/token-verifier.js';

/** RFC 6750 challenge; the realm names the Keycloak realm the token must come from. */
function challenge(error?: 'invalid_token'): Record<string, string> {
  return {
    'WWW-Authenticate':
      error === undefined ? 'Bearer realm="platform"' : `Bearer realm="platform", error="${error}"`,
  };
}

export const WEBHOOK_PATH = '/internal/media/object-created';

/** Seconds a client should wait before retrying when the signing keys are unreachable. */
const KEYS_RETRY_AFTER_S = 5;

/** One verification per request, whether the body gate or the route asks first. */
const verified = new WeakMap<Request, Promise<PortalUser>>();

/**
 * The verified user of a portal request. No token means the anonymous role, which may do nothing
 * here (design §4.1): 401. An invalid token is 401, a valid token without the portal role 403.
 */
export function authenticateUser(req: Request, verifier: TokenVerifier): Promise<PortalUser> {
  let user = verified.get(req);
  if (user === undefined) {
    user = verify(req, verifier);
    verified.set(req, user);
  }
  return user;
}

async function verify(req: Request, verifier: TokenVerifier): Promise<PortalUser> {
  const token = bearerToken(req);
  if (token === undefined) {
    throw new DomainError('unauthorized', 'A bearer token is required.', { headers: challenge() });
  }
  const result = await verifier.verify(token);
  if (result.ok) return result.user;
  switch (result.reason) {
    case 'invalid_token':
      throw new DomainError('unauthorized', result.detail, { headers: challenge('invalid_token') });
    case 'insufficient_role':
      throw new DomainError('forbidden', result.detail);
    case 'keys_unavailable':
      req.log.warn('token signing keys unavailable', {
        jwks_url: verifier.jwksUrl,
        err: String(result.cause),
      });
      throw new DomainError('backend_unavailable', result.detail, {
        headers: { 'Retry-After': String(KEYS_RETRY_AFTER_S) },
        cause: result.cause,
      });
  }
}

/** Webhook requests whose token was already accepted (by the body gate, before the route asks). */
const webhookAccepted = new WeakSet<Request>();

/** The webhook's shared secrets: several may be valid at once (rotation), compared in constant time. */
export function authenticateWebhook(req: Request, tokens: SecretSet): void {
  if (webhookAccepted.has(req)) return;
  const token = bearerToken(req);
  if (token === undefined || !tokens.has(token)) {
    throw new DomainError('unauthorized', 'A valid webhook bearer token is required.', {
      headers: challenge(),
    });
  }
  webhookAccepted.add(req);
}

/**
 * For `createHttpApp({ authenticateBody })`: requests with a body are authenticated before it is read,
 * the webhook by its tokens and everything else by the portal JWT. Bodiless requests (probes, GETs, the
 * store's HEAD) never reach this.
 */
export function authenticateBodies(verifier: TokenVerifier, webhookTokens: SecretSet): RequestHandler {
  return (req, res, next) => {
    // The router matches paths case-insensitively and with or without a trailing slash; so does this.
    if (req.path.toLowerCase().replace(/\/+$/, '') === WEBHOOK_PATH) {
      // A refusal here comes before routing: without this its metrics and log line would say route
      // "unmatched", and a webhook token mismatch (always a POST with a body) would be invisible under
      // http_requests_total{route="/internal/media/object-created"}, which the runbook and alerts read.
      res.locals.route = WEBHOOK_PATH;
      try {
        authenticateWebhook(req, webhookTokens);
        next();
      } catch (err) {
        next(err);
      }
      return;
    }
    // Every other route that takes a body is a portal route, and no public one takes a body.
    authenticateUser(req, verifier).then(() => next(), next);
  };
}
