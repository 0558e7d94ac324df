// The management API (design §3.1), each route with its entry in the API document (http/api-document.ts):
// its parameter, body and answer schemas from @platform/contracts, the error codes it may answer, the prose.
// The probes, the configuration, the registry and settings routes and on-call's reads are here; the staged
// rollouts' routes in rollout-routes.ts.
import {
  deliveryStates,
  deviceIdSchema,
  deviceListQuerySchema,
  deviceListResponseSchema,
  deviceViewResponseSchema,
  gatewayOkResponseSchema,
  gatewayPublicConfigSchema,
  gatewayReloadedResponseSchema,
  gatewayUpdatedResponseSchema,
  isDeviceId,
  notifySettingsRequestSchema,
  validateNotifySettingsRequest,
} from '@platform/contracts';
import {
  DomainError,
  mapDbError,
  requireValid,
  type RouteDefinition,
  type RouteDoc,
} from '@platform/service-kit';
import type { Request, RequestHandler } from 'express';
import type { DeliveryState } from '../db/tables.js';
import { decodeCursor, type DeviceListQuery } from '../delivery/device-view.js';
import { auditRows } from '../audit/writer.js';
import type { Principal } from '../auth/principal.js';
import { unknownSite } from '../sites/catalogue.js';
import { withConfirmedCompanies } from '../sites/confirm.js';
import { BusMessageTooLargeError, BusPublishError } from '../cluster/bus.js';
import { DocumentTooLargeError, UnknownDeviceError } from '../domain/gateway-state.js';
import type { GatewayService } from '../service.js';
import { auditWhenAnswered, principalOf } from './auth.js';
import { readListQuery } from './list-query.js';
import { siteScopeOf } from '../rollout/names.js';
import { rolloutRoutes } from './rollout-routes.js';
import { apiKeyStep, listDoc, settingsTooLarge, UNUSED_BODY } from './route-parts.js';

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
 * `register-device` = `reload-registry`, `update-settings` = `notify-settings`. Building the routes touches
 * neither `service` nor `auth` (the API document is generated from them without a gateway).
 */
export function gatewayRoutes(service: GatewayService, auth: RequestHandler): RouteDefinition[] {
  // Every route but the probes needs the API key, checked before any body is read.
  const withApiKey = apiKeyStep(auth);

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
    // A device outside the caller's sites is as unknown as an absent one (issue 42 §3).
    const siteId = seenSiteOf(service, principalOf(res), body.device_id);
    // A caller scoped by companies: its company's site now, not as the catalogue last read it (sites/confirm.ts).
    const confirmed = await service.confirmSites(principalOf(res), [siteId]);
    if (confirmed.kind === 'outside') throw unknownDevice(body.device_id);
    // Not made when its audit row could not be kept (a database that takes no rows for long, AuditQueue).
    service.audit.requireRoom();
    let outcome: { version: number; relations: number };
    try {
      outcome = await service.notifySettings(body.device_id, body.settings);
      // On-call's trail (design §3.8): which device, which version, how many relations here were told. Asked
      // first: winston formats every line it is given (timestamp, redaction, JSON) before its transport drops
      // one below its level, about 15 µs a notify at LOG_LEVEL=warn (the notify benchmark's profile).
      if (infoEnabled(req.log))
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
    const version = outcome.version;
    auditWhenAnswered(req, res, 'settings.notified', (origin) =>
      service.audit.add(
        withConfirmedCompanies(
          auditRows.settingsNotified(origin, {
            deviceId: body.device_id,
            siteId,
            version,
            settings: body.settings,
          }),
          confirmed,
        ),
      ),
    );
    res.setHeader('Location', `/api/devices/${encodeURIComponent(body.device_id)}`);
    // What was done, so a push to a device nobody observes here is visible (relations_notified 0).
    res.json({ status: 'updated', version: outcome.version, relations_notified: outcome.relations });
  };
  const device: RequestHandler = async (req, res) => {
    const raw: unknown = req.params.device_id;
    const deviceId = typeof raw === 'string' ? raw : '';
    // Not echoed when it is not a device id at all (markup, control characters).
    if (!isDeviceId(deviceId)) throw new DomainError('unknown_device', 'The device is unknown or disabled.');
    const principal = principalOf(res);
    seenSiteOf(service, principal, deviceId);
    try {
      res.json(await service.deviceView(deviceId, siteScopeOf(principal, service.sites)));
    } catch (err) {
      if (err instanceof UnknownDeviceError) throw unknownDevice(deviceId);
      throw mapDbError(err);
    }
  };
  const devices: RequestHandler = async (req, res) => {
    const principal = principalOf(res);
    const sites = service.sites;
    const query = deviceListQuery(req);
    // A site the platform does not know, or one outside the caller's scope: 404, the same answer (issue 42 §1).
    if (query.siteId !== undefined && !(sites.knows(query.siteId) && principal.seesSite(query.siteId, sites)))
      throw unknownSite();
    if (!principal.unscoped) query.siteScope = (column) => principal.siteCondition(column, sites);
    res.json(
      await service.deviceList(query).catch((err: unknown) => {
        throw mapDbError(err);
      }),
    );
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
(then by device id), paged by an opaque keyset cursor. Each device is in exactly one delivery state, the first
that holds: applied or rejected (the device reported so for the desired settings, over CoAP), acknowledged (its
CoAP stack acknowledged a confirmable notification of them; it has not reported), observed_unauthenticated (no
relation that speaks for it on any replica, but one that cannot: plain CoAP for a device with a key),
unobserved (no relation to its settings on any replica), pending (sent in a confirmable notification, no ACK yet), sent_unconfirmed (sent
in a NON notification or in the answer to its registration: it holds them unless the datagram was lost),
stale (observed, and the desired settings have not been sent: it holds older ones). \`delivery\` takes several
states (\`delivery=pending,stale\`) or not_applied (every state but applied); \`acknowledged_for_s=N\` keeps
only the acknowledged devices acknowledged at least N s ago ("acknowledged but not applied after N s").
The record is written in batches; it lags the devices by up to two GATEWAY_DELIVERY_FLUSH_MS plus one write
(reports are written as they arrive).
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
    ...rolloutRoutes(service, withApiKey),
  ];
}

/** GET /api/devices's query (list-query.ts, by deviceListQuerySchema). */
function deviceListQuery(req: Request): DeviceListQuery {
  const { limit, cursor, filters } = readListQuery(req, deviceListQuerySchema, decodeCursor);
  return {
    limit,
    ...(filters.site_id === undefined ? {} : { siteId: filters.site_id }),
    ...(filters.delivery === undefined ? {} : { delivery: deliveryFilter(filters.delivery) }),
    ...(filters.acknowledged_for_s === undefined
      ? {}
      : { acknowledgedForS: Number(filters.acknowledged_for_s) }),
    ...(cursor === undefined ? {} : { after: cursor }),
  };
}

/** `delivery=a,b`: the states named (the schema's pattern checked them), `not_applied` as every state but applied. */
function deliveryFilter(text: string): DeliveryState[] {
  const states = new Set<DeliveryState>();
  for (const name of text.split(',')) {
    if (name !== 'not_applied') states.add(name as DeliveryState);
    else for (const s of deliveryStates) if (s !== 'applied') states.add(s);
  }
  // In the schema's order, so the same filter compiles to the same query whatever order it was written in.
  return deliveryStates.filter((s) => states.has(s));
}

/** `log.isLevelEnabled('info')`, asked again only when the level changes (winston's walks its transports). */
let gateLevel: string | undefined;
let gateInfo = false;
function infoEnabled(log: Request['log']): boolean {
  if (log.level !== gateLevel) {
    gateLevel = log.level;
    gateInfo = log.isLevelEnabled('info');
  }
  return gateInfo;
}

/**
 * The site of a device the caller may see; a device absent from this replica's registry, or at a site outside the
 * caller's scope, is 404 `unknown_device` with the same bytes (nothing tells the caller it exists).
 */
function seenSiteOf(service: GatewayService, principal: Principal, deviceId: string): string {
  const siteId = service.siteOf(deviceId);
  if (siteId === undefined) throw unknownDevice(deviceId);
  if (!principal.seesSite(siteId, service.sites)) throw unknownDevice(deviceId);
  return siteId;
}

function unknownDevice(deviceId: string): DomainError {
  return new DomainError('unknown_device', `Device ${deviceId} is unknown or disabled.`);
}
