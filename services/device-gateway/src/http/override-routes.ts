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
  encodeOverrideCursor,
  Overrides,
  type LayerState,
  type OverridesOptions,
} from '../cluster/overrides.js';
import type { GatewayDatabase } from '../db/tables.js';
import { auditRows } from '../audit/writer.js';
import type { AuditQueue } from '../audit/queue.js';
import type { Principal } from '../auth/principal.js';
import type { SiteCatalogue } from '../sites/catalogue.js';
import { confirmCompanies, withConfirmedCompanies } from '../sites/confirm.js';
import { auditWhenAnswered, principalOf } from './auth.js';
import { UnknownDeviceError } from '../domain/gateway-state.js';
import { siteScopeOf, withholdUnseenRollouts } from '../rollout/names.js';
import { readListQuery } from './list-query.js';
import { listDoc, type DocumentedRoute } from './route-parts.js';

export interface OverrideRouteDeps {
  state: LayerState;
  bus: OverridesOptions['bus'];
  db: Kysely<GatewayDatabase>;
  /** The platform's sites as of the last reload (the caller's site scope). */
  sites: () => SiteCatalogue;
  /** Where the clears' audit rows are queued. */
  audit: AuditQueue;
  /** Reads the platform's sites again (a clear found the catalogue out of date, sites/confirm.ts). */
  refreshSites?: () => void;
}

type OverridePage = Awaited<ReturnType<Overrides['list']>>;

/** The two routes, each behind `withAuth` (route-parts apiKeyStep). `deps` is read only when a request comes. */
export function overrideRoutes(
  deps: OverrideRouteDeps,
  withAuth: (route: DocumentedRoute) => DocumentedRoute,
): RouteDefinition[] {
  let overrides: Overrides | undefined;
  const service = (): Overrides => (overrides ??= new Overrides(deps));

  const list: RequestHandler = async (req, res) => {
    const { limit, cursor } = readListQuery(req, overrideListQuerySchema, decodeOverrideCursor);
    const principal = principalOf(res);
    const page = await (
      principal.unscoped
        ? service().list({ limit, ...(cursor === undefined ? {} : { after: cursor }) })
        : scopedPage(service(), limit, cursor, (id) => seenSite(deps, principal, id) !== undefined).then(
            // What each override hides may be a rollout that reaches sites outside the scope (rollout/names.ts).
            (scoped) => withholdUnseenRollouts(deps.db, scoped, siteScopeOf(principal, deps.sites())),
          )
    ).catch((err: unknown) => {
      throw mapDbError(err);
    });
    res.json(page);
  };
  const clear: RequestHandler = async (req, res) => {
    const raw: unknown = req.params.device_id;
    // Anything but a device id is as unknown as an absent device (and never echoed).
    if (!isDeviceId(raw)) throw new DomainError('unknown_device', 'The device is unknown or disabled.');
    // Outside the caller's sites: the same bytes as an absent device (issue 42 §3).
    const siteId = seenSite(deps, principalOf(res), raw);
    if (siteId === undefined)
      throw new DomainError('unknown_device', `Device ${raw} is unknown or disabled.`);
    // A caller scoped by companies: its company's site now, not as the catalogue last read it (sites/confirm.ts).
    const confirmed = await confirmCompanies(deps.db, principalOf(res), [siteId], () =>
      deps.refreshSites?.(),
    );
    if (confirmed.kind === 'outside')
      throw new DomainError('unknown_device', `Device ${raw} is unknown or disabled.`);
    deps.audit.requireRoom();
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
    // A clear that changed something is audited (cleared false changed nothing).
    if (answer.cleared === true)
      auditWhenAnswered(req, res, 'override.cleared', (origin) =>
        deps.audit.add(
          withConfirmedCompanies(auditRows.overrideCleared(origin, { deviceId: raw, siteId }), confirmed),
        ),
      );
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

/** The site of a device of this replica's registry that `principal` sees; undefined: absent or outside its scope. */
function seenSite(deps: OverrideRouteDeps, principal: Principal, deviceId: string): string | undefined {
  const siteId = deps.state.deviceRecord(deviceId)?.siteId;
  return siteId !== undefined && principal.seesSite(siteId, deps.sites()) ? siteId : undefined;
}

/** Overrides read per page of a scoped caller's list: enough that a few out-of-scope ones cost one read. */
const SCOPED_READ = 200;

/**
 * A scoped caller's page: the overrides of devices it sees, by device id, read through the whole list in pages of
 * SCOPED_READ until `limit` of them (and one more, for the cursor) are found. Development overrides are few (design
 * §3.3), so this reads at most all of them once; the cursor is the last listed device, never an unseen one.
 */
async function scopedPage(
  overrides: Overrides,
  limit: number,
  after: string | undefined,
  visible: (deviceId: string) => boolean,
): Promise<OverridePage> {
  const items: OverridePage['items'] = [];
  let from = after;
  for (;;) {
    const page = await overrides.list({ limit: SCOPED_READ, ...(from === undefined ? {} : { after: from }) });
    for (const item of page.items) {
      if (!visible(item.device_id as string)) continue;
      if (items.length === limit) {
        const last = items.at(-1)!.device_id as string;
        return { items, next_cursor: encodeOverrideCursor(last) };
      }
      items.push(item);
    }
    const last = page.items.at(-1);
    if (page.next_cursor === null || last === undefined) return { items, next_cursor: null };
    from = last.device_id as string;
  }
}
