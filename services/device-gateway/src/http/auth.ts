import { bearerToken, DomainError, type SecretSet } from '@platform/service-kit';
import type { RequestHandler } from 'express';

/**
 * `Authorization: Bearer <API key>`, compared in constant time against every configured key (rotation).
 * `keys()` is read per request so a SIGHUP reload takes effect without a restart. The key itself is never
 * logged (the service-kit logger redacts the header, and nothing here logs it).
 */
export function requireApiKey(keys: () => SecretSet): RequestHandler {
  return (req, _res, next) => {
    const presented = bearerToken(req);
    if (keys().has(presented)) {
      next();
      return;
    }
    const challenge =
      presented === undefined
        ? 'Bearer realm="device-gateway"'
        : 'Bearer realm="device-gateway", error="invalid_token"';
    next(
      new DomainError(
        'unauthorized',
        presented === undefined
          ? 'An API key is required (Authorization: Bearer <key>).'
          : 'The API key is not valid.',
        { headers: { 'WWW-Authenticate': challenge } },
      ),
    );
  };
}
