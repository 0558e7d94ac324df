import { validateNotifySettingsRequest } from '@platform/contracts';
import { DomainError, mapDbError, requireValid, type RouteDefinition } from '@platform/service-kit';
import type { RequestHandler } from 'express';
import { BusMessageTooLargeError, BusPublishError } from '../cluster/bus.js';
import { DocumentTooLargeError, UnknownDeviceError } from '../domain/gateway-state.js';
import type { GatewayService } from '../service.js';

const HEALTH_PATH = '/api/health';
const READY_PATH = '/api/ready';
/** What answers without an API key: the probes (design §3.1) and the Prometheus scrape (design §4.4). */
export const PUBLIC_PATHS: ReadonlySet<string> = new Set([HEALTH_PATH, READY_PATH, '/metrics']);

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
    next(
      new DomainError('not_ready', `Not ready: ${problems.join('; ')}.`, { headers: { 'Retry-After': '1' } }),
    );
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
    { method: 'GET', path: HEALTH_PATH, handler: health },
    { method: 'GET', path: READY_PATH, handler: ready },
    { method: 'GET', path: '/api/config', handler: [auth, config] },
    { method: 'POST', path: '/api/reload-registry', handler: [auth, reload] },
    { method: 'POST', path: '/api/register-device', handler: [auth, reload] },
    { method: 'POST', path: '/api/notify-settings', handler: [auth, notify] },
    { method: 'POST', path: '/api/update-settings', handler: [auth, notify] },
  ];
}
