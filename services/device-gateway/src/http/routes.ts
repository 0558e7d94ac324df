// The management API (design §3.1), each route with its entry in the API document (http/api-document.ts):
// its parameter, body and answer schemas from @platform/contracts, the error codes it may answer, the prose.
import {
  deviceIdSchema,
  deviceListQuerySchema,
  deviceListResponseSchema,
  deviceViewResponseSchema,
  gatewayOkResponseSchema,
  gatewayPublicConfigSchema,
  gatewayReloadedResponseSchema,
  gatewayUnusedBodySchema,
  gatewayUpdatedResponseSchema,
  isDeviceId,
  isUuid,
  notifySettingsRequestSchema,
  rolloutActionResponseSchema,
  rolloutCreateRequestSchema,
  rolloutCreatedResponseSchema,
  rolloutListQuerySchema,
  rolloutListResponseSchema,
  rolloutResponseSchema,
  uuidPathSchema,
  validateNotifySettingsRequest,
  validateRolloutCreateRequest,
} from '@platform/contracts';
import {
  DomainError,
  mapDbError,
  requireValid,
  sqlState,
  type ContractSchema,
  type RequestBodyDoc,
  type RouteDefinition,
  type RouteDoc,
} from '@platform/service-kit';
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
import { listQueryParameters, readListQuery, type ListQuerySchema } from './list-query.js';

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

type DocumentedRoute = RouteDefinition & { doc: RouteDoc };

/**
 * The management API (design §3.1). Aliases are the same handler object registered under a second path:
 * `register-device` = `reload-registry`, `update-settings` = `notify-settings`. Building the routes touches
 * neither `service` nor `auth` (the API document is generated from them without a gateway).
 */
export function gatewayRoutes(service: GatewayService, auth: RequestHandler): RouteDefinition[] {
  // Every route but the probes needs the API key, checked before any body is read: 401 `unauthorized`.
  const withApiKey = (route: DocumentedRoute): DocumentedRoute => ({
    ...route,
    authenticate: auth,
    doc: { ...route.doc, security: ['apiKey'], errors: ['unauthorized', ...(route.doc.errors ?? [])] },
  });

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
    const query = deviceListQuery(req);
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

  const reloadDoc = (operationId: string, summary: string): RouteDoc => ({
    operationId,
    summary,
    description:
      'When PostgreSQL cannot be reached the answer is 503 and the previous registry keeps serving.',
    requestBody: UNUSED_BODY,
    responses: {
      200: {
        description: 'The registry was reloaded and swapped in.',
        schema: gatewayReloadedResponseSchema,
      },
    },
    errors: ['backend_unavailable'],
  });
  const notifyDoc = (operationId: string, summary: string, description?: string): RouteDoc => ({
    operationId,
    summary,
    ...(description === undefined ? {} : { description }),
    requestBody: {
      schema: notifySettingsRequestSchema,
      example: {
        device_id: 'acme-hq-hvac-01',
        settings: { reporting_interval_s: 120, thresholds: { supply_temp_c: { min: 12, max: 18 } } },
      },
    },
    responses: {
      200: {
        description: 'The override is stored; observers were notified if anything visible changed.',
        schema: gatewayUpdatedResponseSchema,
        headers: {
          Location: { description: 'The device view (GET /api/devices/{device_id}).', required: true },
        },
      },
    },
    // settings_too_large: the settings' notification would not fit one CoAP datagram; payload_too_large: the
    // override would not fit one NOTIFY.
    errors: ['settings_too_large', 'unknown_device', 'payload_too_large', 'backend_unavailable'],
  });

  return [
    // Public: the probes (design §3.1).
    {
      method: 'GET',
      path: '/api/health',
      handler: health,
      doc: {
        operationId: 'health',
        summary: 'Liveness (no dependency call)',
        responses: { 200: { description: 'The process is alive.', schema: gatewayOkResponseSchema } },
      },
    },
    {
      method: 'GET',
      path: '/api/ready',
      handler: ready,
      doc: {
        operationId: 'ready',
        summary: 'Readiness (registry loaded and CoAP socket bound)',
        responses: { 200: { description: 'Ready to serve devices.', schema: gatewayOkResponseSchema } },
        errors: ['not_ready'],
      },
    },
    withApiKey({
      method: 'GET',
      path: '/api/config',
      handler: config,
      doc: {
        operationId: 'getConfig',
        summary: 'Effective configuration, secrets redacted',
        responses: {
          200: {
            description: 'API keys only as a count and fingerprints; passwords in URLs replaced.',
            schema: gatewayPublicConfigSchema,
          },
        },
      },
    }),
    // The reload routes take no fields; a body, if any, is still read as JSON and must be well-formed.
    withApiKey({
      method: 'POST',
      path: '/api/reload-registry',
      body: 'json',
      handler: reload,
      doc: reloadDoc(
        'reloadRegistry',
        'Reload the registry from PostgreSQL and notify observers whose document changed',
      ),
    }),
    withApiKey({
      method: 'POST',
      path: '/api/register-device',
      body: 'json',
      handler: reload,
      doc: reloadDoc('registerDevice', 'Alias of /api/reload-registry (same handler)'),
    }),
    withApiKey({
      method: 'POST',
      path: '/api/notify-settings',
      body: 'json',
      handler: notify,
      doc: notifyDoc(
        'notifySettings',
        'Store an in-memory settings override (replaces the registry settings) and notify observers',
        `With the replica bus (GATEWAY_CLUSTER_BUS, default on) the override is published through PostgreSQL and
200 is answered only after that commit; every replica applies it and notifies its observers. When the
database cannot be reached the answer is 503 with Retry-After and nothing was applied.
`,
      ),
    }),
    withApiKey({
      method: 'POST',
      path: '/api/update-settings',
      body: 'json',
      handler: notify,
      doc: notifyDoc('updateSettings', 'Alias of /api/notify-settings (same handler)'),
    }),
    // On-call's reads of delivery (design §3.8).
    withApiKey({
      method: 'GET',
      path: '/api/devices',
      handler: devices,
      doc: {
        operationId: 'listDevices',
        summary: 'The fleet\'s delivery, "which devices have not acknowledged their desired settings?"',
        description: `Devices of the registry (enabled) with their delivery record (design §3.8), oldest desired change first
(then by device id), paged by an opaque keyset cursor. Each device is in exactly one delivery state:
acknowledged (it acknowledged the desired settings), unobserved (not acknowledged, and no relation on any
replica), pending (the desired settings were sent and not acknowledged; a NON notification stays pending,
"sent, unconfirmed"), stale (observed, and the desired settings have not been sent: it holds older ones).
The record is written in batches; it lags the devices by up to two GATEWAY_DELIVERY_FLUSH_MS plus one write.
`,
        ...listDoc(deviceListQuerySchema, deviceListResponseSchema),
      },
    }),
    withApiKey({
      method: 'GET',
      path: '/api/devices/:device_id',
      handler: device,
      doc: {
        operationId: 'getDevice',
        summary:
          'One device, as on-call needs it - was its setting received, when, by which replica, and if not why',
        description: `The device's public registry record, the settings this replica serves it, the delivery record shared by
every replica, each replica's live relations and DTLS sessions (gathered over the replica bus within
GATEWAY_DEVICE_VIEW_DEADLINE_MS; \`answered\` says which replicas did), and a summary of its keys. Never
key material.
`,
        parameters: { device_id: { in: 'path', schema: deviceIdSchema } },
        responses: { 200: { description: 'The device view.', schema: deviceViewResponseSchema } },
        errors: ['unknown_device', 'backend_unavailable'],
      },
    }),
    // Staged rollouts (design §3.9).
    withApiKey({
      method: 'POST',
      path: '/api/rollouts',
      body: 'json',
      handler: createRollout,
      doc: {
        operationId: 'createRollout',
        summary: 'Start a staged rollout of settings to a selection of devices (design §3.9)',
        description: `The selector is resolved once, now, against the registry (enabled devices matching every criterion
given); the answer says how many devices it resolved to. The devices are ordered by a hash of (rollout,
device) and cut into waves: the first of \`first_wave_count\` devices or \`first_wave_percent\` of them, each
next one \`growth_factor\` times larger, the last taking what is left. One replica (the driver) notifies a
wave's devices at most \`max_per_minute\` a minute; a device's outcome is read from the delivery record:
acknowledged (its CoAP stack acknowledged these settings), failed (not acknowledged within \`deadline_s\`),
skipped (left the registry or was disabled). As soon as the failed share of a wave reaches
\`abort_share\` the rollout pauses itself (aborted, with the reason); a finished wave whose acknowledged
share is below \`success_share\` pauses it too. A device belongs to at most one open (active or paused)
rollout: an overlap is 409 (\`rollout_conflict\`) naming the open rollout in \`detail\`.
`,
        requestBody: {
          schema: rolloutCreateRequestSchema,
          example: {
            selector: { site_ids: ['a1000000-0000-4000-8000-000000000001'], models: ['hvac-rtu-4000'] },
            settings: { reporting_interval_s: 300 },
            plan: {
              first_wave_percent: 5,
              growth_factor: 3,
              max_per_minute: 600,
              success_share: 0.95,
              abort_share: 0.1,
              deadline_s: 120,
            },
          },
        },
        responses: {
          201: {
            description: "Created; it starts at the driver's next tick.",
            schema: rolloutCreatedResponseSchema,
            headers: {
              Location: { description: 'The rollout (GET /api/rollouts/{rollout_id}).', required: true },
            },
          },
        },
        errors: ['settings_too_large', 'rollout_conflict', 'backend_unavailable'],
      },
    }),
    withApiKey({
      method: 'GET',
      path: '/api/rollouts',
      handler: rollouts,
      doc: {
        operationId: 'listRollouts',
        summary: 'Rollouts, newest first, paged by an opaque keyset cursor',
        ...listDoc(rolloutListQuerySchema, rolloutListResponseSchema),
      },
    }),
    withApiKey({
      method: 'GET',
      path: '/api/rollouts/:rollout_id',
      handler: rollout,
      doc: {
        operationId: 'getRollout',
        summary: 'One rollout - its state, the reason it paused, per-wave counts and its latest events',
        parameters: { rollout_id: ROLLOUT_ID },
        responses: { 200: { description: 'The rollout.', schema: rolloutResponseSchema } },
        errors: ['unknown_rollout', 'backend_unavailable'],
      },
    }),
    ...ROLLOUT_ACTIONS.map(({ action, operationId, summary }) =>
      withApiKey({
        method: 'POST',
        path: `/api/rollouts/:rollout_id/${action}`,
        body: 'json',
        handler: control(action),
        doc: {
          operationId,
          summary,
          description:
            "409 (`rollout_conflict`) when the rollout's state does not allow the action, or a rollback would undo devices an open rollout now holds.",
          parameters: { rollout_id: ROLLOUT_ID },
          requestBody: UNUSED_BODY,
          responses: {
            200: { description: "Done; the rollout's state after it.", schema: rolloutActionResponseSchema },
          },
          errors: ['unknown_rollout', 'rollout_conflict', 'backend_unavailable'],
        },
      }),
    ),
  ];
}

/** The body of a route that reads none of it (the reloads, the rollout actions). */
const UNUSED_BODY: RequestBodyDoc = { schema: gatewayUnusedBodySchema, required: false };

const ROLLOUT_ID = { in: 'path', schema: uuidPathSchema } as const;

const ROLLOUT_ACTIONS: readonly { action: RolloutAction; operationId: string; summary: string }[] = [
  {
    action: 'pause',
    operationId: 'pauseRollout',
    summary: 'Pause an active rollout - no more devices are notified until it is resumed',
  },
  {
    action: 'resume',
    operationId: 'resumeRollout',
    summary:
      'Resume a paused rollout; a wave its criteria stopped is accepted as it is and the next one starts',
  },
  {
    action: 'cancel',
    operationId: 'cancelRollout',
    summary: 'Cancel an active or paused rollout; devices already changed keep the new settings',
  },
  {
    action: 'rollback',
    operationId: 'rollbackRollout',
    summary: 'Roll back - every device the rollout changed gets what it had before, as a new, higher version',
  },
];

/** What a list route's document says of its query and its page (its query read by list-query.ts). */
function listDoc(
  query: ListQuerySchema,
  page: ContractSchema,
): Pick<RouteDoc, 'parameters' | 'responses' | 'errors'> {
  return {
    parameters: listQueryParameters(query),
    responses: { 200: { description: 'One page.', schema: page } },
    errors: ['invalid_query', 'backend_unavailable'],
  };
}

/** GET /api/devices's query (list-query.ts, by deviceListQuerySchema). */
function deviceListQuery(req: Request): DeviceListQuery {
  const { limit, cursor, filters } = readListQuery(req, deviceListQuerySchema, decodeCursor);
  return {
    limit,
    ...(filters.site_id === undefined ? {} : { siteId: filters.site_id }),
    ...(filters.delivery === undefined ? {} : { delivery: filters.delivery as DeliveryState }),
    ...(cursor === undefined ? {} : { after: cursor }),
  };
}

/** GET /api/rollouts's query (list-query.ts, by rolloutListQuerySchema). */
function rolloutListQuery(req: Request): { limit: number; cursor?: string; state?: RolloutState } {
  const { limit, cursor, filters } = readListQuery(req, rolloutListQuerySchema, decodeRolloutCursor);
  return {
    limit,
    ...(cursor === undefined ? {} : { cursor }),
    ...(filters.state === undefined ? {} : { state: filters.state as RolloutState }),
  };
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
  if (!isUuid(raw)) throw new DomainError('unknown_rollout', 'The rollout is unknown.');
  return raw.toLowerCase();
}

function rolloutProblem(err: unknown): never {
  if (err instanceof UnknownRolloutError)
    throw new DomainError('unknown_rollout', `Rollout ${err.rolloutId} is unknown.`);
  if (err instanceof RolloutStateError) throw new DomainError('rollout_conflict', `${err.message}.`);
  throw mapDbError(err);
}

function unknownDevice(deviceId: string): DomainError {
  return new DomainError('unknown_device', `Device ${deviceId} is unknown or disabled.`);
}
