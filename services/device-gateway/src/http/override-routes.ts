// Development overrides in the open (design §3.3, §3.6): GET /api/overrides and DELETE
// /api/devices/{device_id}/override, each with its entry in the API document. Mounted by app.ts beside the
// routes of routes.ts; building them touches no dependency (the API document is generated from them).
import {
  deviceIdSchema,
  isDeviceId,
  overrideClearedResponseSchema,
  overrideListQuerySchema,
  overrideListResponseSchema,
} from '@platform/contracts';
import { DomainError, mapDbError, type RouteDefinition } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { RequestHandler } from 'express';
import { BusPublishError } from '../cluster/bus.js';
import {
  decodeOverrideCursor,
  Overrides,
  type LayerState,
  type OverridesOptions,
} from '../cluster/overrides.js';
import type { GatewayDatabase } from '../db/tables.js';
import { UnknownDeviceError } from '../domain/gateway-state.js';
import { readListQuery } from './list-query.js';
import { listDoc, type DocumentedRoute } from './route-parts.js';

export interface OverrideRouteDeps {
  state: LayerState;
  bus: OverridesOptions['bus'];
  db: Kysely<GatewayDatabase>;
}

/** The two routes, each behind `withAuth` (route-parts apiKeyStep). `deps` is read only when a request comes. */
export function overrideRoutes(
  deps: OverrideRouteDeps,
  withAuth: (route: DocumentedRoute) => DocumentedRoute,
): RouteDefinition[] {
  let overrides: Overrides | undefined;
  const service = (): Overrides => (overrides ??= new Overrides(deps));

  const list: RequestHandler = async (req, res) => {
    const { limit, cursor } = readListQuery(req, overrideListQuerySchema, decodeOverrideCursor);
    const page = await service()
      .list({ limit, ...(cursor === undefined ? {} : { after: cursor }) })
      .catch((err: unknown) => {
        throw mapDbError(err);
      });
    res.json(page);
  };
  const clear: RequestHandler = async (req, res) => {
    const raw: unknown = req.params.device_id;
    // Anything but a device id is as unknown as an absent device (and never echoed).
    if (!isDeviceId(raw)) throw new DomainError('unknown_device', 'The device is unknown or disabled.');
    const answer = await service()
      .clear(raw)
      .catch((err: unknown) => {
        if (err instanceof UnknownDeviceError)
          throw new DomainError('unknown_device', `Device ${raw} is unknown or disabled.`);
        if (err instanceof BusPublishError) throw mapDbError(err.cause);
        throw mapDbError(err);
      });
    req.log.info('override cleared', {
      device_id: raw,
      cleared: answer.cleared,
      version: (answer.settings as { version: number }).version,
    });
    res.json(answer);
  };

  return [
    withAuth({
      method: 'GET',
      path: '/api/overrides',
      handler: list,
      doc: {
        operationId: 'listOverrides',
        summary: 'Every development override, by device id, and the layers each hides (design §3.3)',
        description: `With the replica bus (the default) the overrides every replica holds, from the bus's retained rows;
without it, this replica's. \`hides\`: the device's rollout assignment and registry settings, which the override
replaces while it lasts. An override ends when it is cleared (DELETE /api/devices/{device_id}/override), when a
rollout assigns the device (with the bus), when the device leaves the registry, or when the last replica stops.
`,
        ...listDoc(overrideListQuerySchema, overrideListResponseSchema),
      },
    }),
    withAuth({
      method: 'DELETE',
      path: '/api/devices/:device_id/override',
      handler: clear,
      doc: {
        operationId: 'clearOverride',
        summary: "End a device's development override on every replica",
        description: `The device gets the next layer (its rollout assignment, else its registry settings) as a new, higher
version on every replica, also on one that starts later (design §3.6). \`cleared\` false: it had no override, and
its settings are unchanged. Answers after the clear committed.
`,
        parameters: { device_id: { in: 'path', schema: deviceIdSchema } },
        responses: {
          200: { description: 'Cleared (or there was none).', schema: overrideClearedResponseSchema },
        },
        errors: ['unknown_device', 'backend_unavailable'],
      },
    }),
  ];
}
