import { validateNotifySettingsRequest } from '@platform/contracts';
import { DomainError, mapDbError, requireValid, type RouteDefinition } from '@platform/service-kit';
import type { RequestHandler } from 'express';
import { BusMessageTooLargeError, BusPublishError } from '../cluster/bus.js';
import { DocumentTooLargeError, UnknownDeviceError } from '../domain/gateway-state.js';
import type { GatewayService } from '../service.js';

/** The replica bus's failures as problems (design §3.6): the bus itself knows nothing of HTTP. */
function asProblem(err: unknown): never {
  if (err instanceof BusPublishError) throw mapDbError(err.cause);
  if (err instanceof BusMessageTooLargeError) {
    throw new DomainError(
      'payload_too_large',
      `The message would take ${err.bytes} bytes; PostgreSQL NOTIFY carries at most ${err.limitBytes}.`,
    );
  }
  throw err;
}

/**
 * The management API (design §3.1). Aliases are the same handler object registered under a second path:
 * `register-device` = `reload-registry`, `update-settings` = `notify-settings`.
 */
export function gatewayRoutes(service: GatewayService, auth: RequestHandler): RouteDefinition[] {
  const health: RequestHandler = (_req, res) => {
    res.json({ status: 'ok' });
  };
  const ready: RequestHandler = (_req, _res, next) => {
    const problems = service.readinessProblems();
    if (problems.length === 0) {
      _res.json({ status: 'ok' });
      return;
    }
    next(new DomainError('not_ready', `Not ready: ${problems.join('; ')}.`, { retryAfterS: 1 }));
  };
  const config: RequestHandler = (_req, res) => {
    res.json(service.publicConfig());
  };
  const reload: RequestHandler = async (req, res) => {
    const summary = await service.reloadEverywhere().catch(asProblem);
    req.log.info('registry reloaded', { ...summary, rejected: summary.rejected.length });
    res.json({ status: 'reloaded' });
  };
  const notify: RequestHandler = async (req, res) => {
    // The one validation of the request (Device Settings included); below this nothing checks it again.
    const body = requireValid(validateNotifySettingsRequest(req.body));
    try {
      await service.notifySettings(body.device_id, body.settings);
    } catch (err) {
      if (err instanceof UnknownDeviceError) {
        throw new DomainError('unknown_device', `Device ${body.device_id} is unknown or disabled.`);
      }
      if (err instanceof DocumentTooLargeError) {
        throw new DomainError('settings_too_large', err.message, {
          errors: [
            {
              path: '/settings',
              message: `must encode to at most ${err.limitBytes} bytes (is ${err.encodedBytes})`,
            },
          ],
        });
      }
      asProblem(err);
    }
    res.json({ status: 'updated' });
  };
  return [
    // Public: the probes (design §3.1). Every other route needs the API key, checked before any body is read.
    { method: 'GET', path: '/api/health', handler: health },
    { method: 'GET', path: '/api/ready', handler: ready },
    { method: 'GET', path: '/api/config', authenticate: auth, handler: config },
    // The reload routes take no fields; a body, if any, is still read as JSON and must be well-formed.
    { method: 'POST', path: '/api/reload-registry', authenticate: auth, body: 'json', handler: reload },
    { method: 'POST', path: '/api/register-device', authenticate: auth, body: 'json', handler: reload },
    { method: 'POST', path: '/api/notify-settings', authenticate: auth, body: 'json', handler: notify },
    { method: 'POST', path: '/api/update-settings', authenticate: auth, body: 'json', handler: notify },
  ];
}
