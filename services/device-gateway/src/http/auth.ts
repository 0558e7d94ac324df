// The authentication step of every /api route but the probes (design §3.1, issue 42 §2, §3): who is calling (a
// named or anonymous API key, or a person's access token from the platform realm), then whether their role allows
// the route's action (auth/route-policy.ts), before any byte of the body is read.
import { bearerToken, DomainError, type SecretSet } from '@platform/service-kit';
import type { Request, RequestHandler, Response } from 'express';
import { GatewayKeys } from '../auth/api-keys.js';
import { ANONYMOUS_KEY, forbidden, type Principal } from '../auth/principal.js';
import { actionOf } from '../auth/route-policy.js';
import type { OperationsTokenVerifier } from '../auth/tokens.js';
import type { AuditQueue } from '../audit/queue.js';
import { auditRows, type AuditOrigin } from '../audit/writer.js';

export interface AuthDeps {
  /** Current API keys; read per request so a SIGHUP reload takes effect without a restart. */
  keys: () => SecretSet;
  /** People's access tokens (GATEWAY_OIDC_ISSUER_URL); absent: API keys only. */
  tokens?: OperationsTokenVerifier | undefined;
  /** Where the rows of the changes this step audits itself (a reload) are queued. */
  audit?: AuditQueue | undefined;
}

const PRINCIPAL = 'principal';

function challenge(error?: 'invalid_token'): Record<string, string> {
  return {
    'WWW-Authenticate':
      error === undefined
        ? 'Bearer realm="device-gateway"'
        : 'Bearer realm="device-gateway", error="invalid_token"',
  };
}

function unauthorized(detail: string, error?: 'invalid_token'): DomainError {
  return new DomainError('unauthorized', detail, { headers: challenge(error) });
}

/** A compact JWS has three dot-separated parts; an API key is looked up first whatever its shape. */
const looksLikeJwt = (presented: string): boolean => presented.split('.').length === 3;

async function authenticate(req: Request, deps: AuthDeps): Promise<Principal> {
  const presented = bearerToken(req);
  if (presented === undefined)
    throw unauthorized('An API key or an access token is required (Authorization: Bearer …).');
  // bearerToken's '' is a repeated Authorization header: refused whatever its copies say (design §2).
  if (presented === '')
    throw unauthorized('The request carries more than one Authorization header.', 'invalid_token');
  const keys = deps.keys();
  const byKey =
    keys instanceof GatewayKeys ? keys.identify(presented) : keys.has(presented) ? ANONYMOUS_KEY : undefined;
  if (byKey !== undefined) return byKey;
  if (deps.tokens === undefined || !looksLikeJwt(presented))
    throw unauthorized('The API key is not valid.', 'invalid_token');
  const result = await deps.tokens.verify(presented);
  if (result.ok) return result.user;
  switch (result.reason) {
    case 'invalid_token':
      throw unauthorized(result.detail, 'invalid_token');
    case 'insufficient_role':
      throw new DomainError('forbidden', result.detail);
    case 'keys_unavailable':
      req.log.warn('token signing keys unavailable', {
        jwks_url: deps.tokens.jwksUrl,
        err: String(result.cause),
      });
      throw new DomainError('backend_unavailable', result.detail, { cause: result.cause });
  }
}

/**
 * The route's authentication and role check: the principal is kept for the handler (`principalOf(res)`) and named
 * on the request's log lines; an unknown or bad credential is 401, a role short of the route's action 403 (a scoped
 * principal on a fleet-wide action too), unreachable signing keys 503. A reload that answered 200 is audited here.
 */
export function requirePrincipal(deps: AuthDeps): RequestHandler {
  return (req, res, next) => {
    authenticate(req, deps).then((principal) => {
      res.locals[PRINCIPAL] = principal;
      req.log = req.log.child(principal.logFields());
      const action = actionOf(req.method, res.locals.route as string | undefined);
      if (!principal.may(action)) {
        next(forbidden(principal, action));
        return;
      }
      const queue = deps.audit;
      if (action === 'registry.reload' && queue !== undefined) {
        try {
          queue.requireRoom();
        } catch (err) {
          next(err);
          return;
        }
        auditWhenAnswered(req, res, 'registry.reloaded', (origin) =>
          queue.add(auditRows.registryReloaded(origin)),
        );
      }
      next();
    }, next);
  };
}

/**
 * Writes a change's audit row once the route answers it 200, in the turn after the answer is handed to the socket:
 * the row costs the caller no database round trip (the notify path's latency, design §3.1) and a database that
 * cannot be reached delays no answer. It hooks the route's `res.end`, not the socket's 'finish': a client that hung
 * up before the change committed gets no 'finish', and its change must still be recorded (a cold review dropped the
 * connection to escape the audit). A row that cannot be written is logged at error level with its action; the
 * change stands.
 */
export function auditWhenAnswered(
  req: Request,
  res: Response,
  action: string,
  write: (origin: AuditOrigin) => Promise<void> | void,
): void {
  const origin = auditOrigin(req, res);
  const end = res.end.bind(res) as (...args: unknown[]) => Response;
  let answered = false;
  res.end = ((...args: unknown[]) => {
    if (!answered) {
      answered = true;
      if (res.statusCode === 200)
        setImmediate(() => {
          Promise.resolve()
            .then(() => write(origin))
            .catch((err: unknown) => {
              req.log.error('audit row not written', { action, error: String(err) });
            });
        });
    }
    return end(...args);
  }) as Response['end'];
}

/** The principal `requirePrincipal` authenticated for this request. */
export function principalOf(res: Response): Principal {
  const principal = res.locals[PRINCIPAL] as Principal | undefined;
  // A route that reads the principal without requirePrincipal before it is a wiring mistake, never a client's.
  if (principal === undefined) throw new Error('route registered without requirePrincipal');
  return principal;
}

/** Who, which request and from where, for an audit row written by a route. */
export function auditOrigin(req: Request, res: Response): AuditOrigin {
  return { principal: principalOf(res), requestId: req.id, sourceAddress: req.ip };
}
