import { isDeviceId, validateNotifySettingsRequest, validateRolloutCreateRequest } from '@platform/contracts';
import { DomainError, mapDbError, requireValid, sqlState, type RouteDefinition } from '@platform/service-kit';
import type { Request, RequestHandler } from 'express';
import type { DeliveryState } from '../db/tables.js';
import { decodeCursor, type DeviceListQuery } from '../delivery/device-view.js';
import { BusMessageTooLargeError, BusPublishError } from '../cluster/bus.js';
import { DocumentTooLargeError, UnknownDeviceError } from '../domain/gateway-state.js';
import type { GatewayService } from '../service.js';
import type { RolloutAction, RolloutState } from '../rollout/sql.js';
import {
  decodeRolloutCursor,
  NoTargetsError,
  RolloutInvalidError,
  RolloutOverlapError,
  RolloutStateError,
  UnknownRolloutError,
} from '../rollout/service.js';

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
      const outcome = await service.notifySettings(body.device_id, body.settings);
      // On-call's trail (design §3.8): which device, which version, how many relations here were told.
      req.log.info('settings notified', {
        device_id: body.device_id,
        version: outcome.version,
        relations_notified: outcome.relations,
      });
    } catch (err) {
      if (err instanceof UnknownDeviceError) {
        throw unknownDevice(body.device_id);
      }
      if (err instanceof DocumentTooLargeError) throw settingsTooLarge(err);
      asProblem(err);
    }
    res.setHeader('Location', `/api/devices/${encodeURIComponent(body.device_id)}`);
    res.json({ status: 'updated' });
  };
  const device: RequestHandler = async (req, res) => {
    const raw: unknown = req.params.device_id;
    const deviceId = typeof raw === 'string' ? raw : '';
    // Not echoed when it is not a device id at all (markup, control characters).
    if (!isDeviceId(deviceId)) throw new DomainError('unknown_device', 'The device is unknown or disabled.');
    try {
      res.json(await service.deviceView(deviceId));
    } catch (err) {
      if (err instanceof UnknownDeviceError) throw unknownDevice(deviceId);
      throw mapDbError(err);
    }
  };
  const devices: RequestHandler = async (req, res) => {
    const query = listQuery(req);
    res.json(
      await service.deviceList(query).catch((err: unknown) => {
        throw mapDbError(err);
      }),
    );
  };
  const createRollout: RequestHandler = async (req, res) => {
    // The settings are validated exactly as a notify body's (the same Device Settings schema).
    const body = requireValid(validateRolloutCreateRequest(req.body));
    try {
      const created = await service.rollouts.create(body);
      req.log.info('rollout created', { ...created });
      res.status(201).setHeader('Location', `/api/rollouts/${created.rollout_id}`);
      res.json({ ...created, state: 'active' });
    } catch (err) {
      if (err instanceof DocumentTooLargeError) throw settingsTooLarge(err);
      if (err instanceof NoTargetsError) {
        throw new DomainError('invalid_body', 'The selector matches no enabled device.', {
          errors: [{ path: '/selector', message: 'matches no enabled device of the registry' }],
        });
      }
      if (err instanceof RolloutInvalidError) {
        throw new DomainError('invalid_body', `The rollout cannot be created: ${err.path} ${err.message}.`, {
          errors: [{ path: err.path, message: err.message }],
        });
      }
      if (err instanceof RolloutOverlapError) {
        throw new DomainError(
          'rollout_conflict',
          `${err.devices} of the selected devices belong to the open rollout ${err.conflictingRollout}; a device belongs to at most one open rollout.`,
        );
      }
      // 22023 from the creation function: a plan that makes more than 1000 waves.
      if (sqlState(err) === '22023') {
        throw new DomainError('invalid_body', 'The plan makes more than 1000 waves.', {
          errors: [{ path: '/plan', message: 'makes more than 1000 waves for this selector' }],
        });
      }
      throw mapDbError(err);
    }
  };
  const rollout: RequestHandler = async (req, res) => {
    const id = rolloutId(req);
    res.json(await service.rollouts.get(id).catch(rolloutProblem));
  };
  const rollouts: RequestHandler = async (req, res) => {
    res.json(await service.rollouts.list(rolloutListQuery(req)).catch(rolloutProblem));
  };
  const control =
    (action: RolloutAction): RequestHandler =>
    async (req, res) => {
      const id = rolloutId(req);
      const outcome = await service.rollouts.control(id, action).catch(rolloutProblem);
      req.log.info(`rollout ${action}`, { rollout_id: id, state: outcome.state, returned: outcome.returned });
      res.json({ rollout_id: id, state: outcome.state, devices_returned: outcome.returned });
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
    // On-call's reads of delivery (design §3.8).
    { method: 'GET', path: '/api/devices', authenticate: auth, handler: devices },
    { method: 'GET', path: '/api/devices/:device_id', authenticate: auth, handler: device },
    // Staged rollouts (design §3.9).
    { method: 'POST', path: '/api/rollouts', authenticate: auth, body: 'json', handler: createRollout },
    { method: 'GET', path: '/api/rollouts', authenticate: auth, handler: rollouts },
    { method: 'GET', path: '/api/rollouts/:rollout_id', authenticate: auth, handler: rollout },
    ...(['pause', 'resume', 'cancel', 'rollback'] as const).map((action) => ({
      method: 'POST' as const,
      path: `/api/rollouts/:rollout_id/${action}`,
      authenticate: auth,
      body: 'json' as const,
      handler: control(action),
    })),
  ];
}

function settingsTooLarge(err: DocumentTooLargeError): DomainError {
  return new DomainError('settings_too_large', err.message, {
    errors: [
      {
        path: '/settings',
        message: `must encode to at most ${err.limitBytes} bytes (is ${err.encodedBytes})`,
      },
    ],
  });
}

/** A rollout id from the path; anything but a UUID is as unknown as an absent one (and never echoed). */
function rolloutId(req: Request): string {
  const raw: unknown = req.params.rollout_id;
  if (typeof raw !== 'string' || !UUID.test(raw))
    throw new DomainError('unknown_rollout', 'The rollout is unknown.');
  return raw.toLowerCase();
}

function rolloutProblem(err: unknown): never {
  if (err instanceof UnknownRolloutError)
    throw new DomainError('unknown_rollout', `Rollout ${err.rolloutId} is unknown.`);
  if (err instanceof RolloutStateError) throw new DomainError('rollout_conflict', `${err.message}.`);
  throw mapDbError(err);
}

const ROLLOUT_STATES: readonly RolloutState[] = ['active', 'paused', 'completed', 'cancelled', 'rolled_back'];
const ROLLOUT_LIST_PARAMS = new Set(['state', 'limit', 'cursor']);

/** GET /api/rollouts's query, checked whole like GET /api/devices's. */
function rolloutListQuery(req: Request): { limit: number; cursor?: string; state?: RolloutState } {
  const errors: { path: string; message: string }[] = [];
  const one = (name: string): string | undefined => {
    const value = req.query[name];
    if (value === undefined) return undefined;
    if (typeof value !== 'string') {
      errors.push({ path: `/query/${name}`, message: 'must be given once' });
      return undefined;
    }
    return value;
  };
  for (const name of Object.keys(req.query))
    if (!ROLLOUT_LIST_PARAMS.has(name))
      errors.push({ path: `/query/${name.slice(0, 64)}`, message: 'is not a parameter of this route' });
  const state = one('state');
  if (state !== undefined && !ROLLOUT_STATES.includes(state as RolloutState))
    errors.push({ path: '/query/state', message: `must be one of ${ROLLOUT_STATES.join(', ')}` });
  const limitText = one('limit');
  const limit = limitText === undefined ? 20 : Number(limitText);
  if (limitText !== undefined && !(/^\d{1,3}$/.test(limitText) && limit >= 1 && limit <= 100))
    errors.push({ path: '/query/limit', message: 'must be an integer from 1 to 100' });
  const cursorText = one('cursor');
  const cursor = cursorText === undefined ? undefined : decodeRolloutCursor(cursorText);
  if (cursorText !== undefined && cursor === undefined)
    errors.push({ path: '/query/cursor', message: 'is not a cursor this API issued' });
  if (errors.length > 0)
    throw new DomainError('invalid_query', 'The query parameters are invalid.', { errors });
  return {
    limit,
    ...(cursor === undefined ? {} : { cursor }),
    ...(state === undefined ? {} : { state: state as RolloutState }),
  };
}

function unknownDevice(deviceId: string): DomainError {
  return new DomainError('unknown_device', `Device ${deviceId} is unknown or disabled.`);
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const DELIVERY_STATES: readonly DeliveryState[] = ['acknowledged', 'pending', 'unobserved', 'stale'];
const LIST_PARAMS = new Set(['site_id', 'delivery', 'limit', 'cursor']);

/** GET /api/devices's query, checked whole: every problem listed, unknown parameters refused. */
function listQuery(req: Request): DeviceListQuery {
  const errors: { path: string; message: string }[] = [];
  const one = (name: string): string | undefined => {
    const value = req.query[name];
    if (value === undefined) return undefined;
    if (typeof value !== 'string') {
      errors.push({ path: `/query/${name}`, message: 'must be given once' });
      return undefined;
    }
    return value;
  };
  for (const name of Object.keys(req.query))
    if (!LIST_PARAMS.has(name))
      errors.push({ path: `/query/${name.slice(0, 64)}`, message: 'is not a parameter of this route' });
  const siteId = one('site_id');
  if (siteId !== undefined && !UUID.test(siteId))
    errors.push({ path: '/query/site_id', message: 'must be a UUID' });
  const delivery = one('delivery');
  if (delivery !== undefined && !DELIVERY_STATES.includes(delivery as DeliveryState))
    errors.push({ path: '/query/delivery', message: `must be one of ${DELIVERY_STATES.join(', ')}` });
  const limitText = one('limit');
  const limit = limitText === undefined ? 100 : Number(limitText);
  if (limitText !== undefined && !(/^\d{1,3}$/.test(limitText) && limit >= 1 && limit <= 500))
    errors.push({ path: '/query/limit', message: 'must be an integer from 1 to 500' });
  const cursorText = one('cursor');
  const after = cursorText === undefined ? undefined : decodeCursor(cursorText);
  if (cursorText !== undefined && after === undefined)
    errors.push({ path: '/query/cursor', message: 'is not a cursor this API issued' });
  if (errors.length > 0)
    throw new DomainError('invalid_query', 'The query parameters are invalid.', { errors });
  return {
    limit,
    ...(siteId === undefined ? {} : { siteId: siteId.toLowerCase() }),
    ...(delivery === undefined ? {} : { delivery: delivery as DeliveryState }),
    ...(after === undefined ? {} : { after }),
  };
}
