// Staged rollouts (design §3.9): their routes, each with its entry in the API document.
import {
  isUuid,
  rolloutActionResponseSchema,
  rolloutCreateRequestSchema,
  rolloutCreatedResponseSchema,
  rolloutListQuerySchema,
  rolloutListResponseSchema,
  rolloutResponseSchema,
  uuidPathSchema,
  validateRolloutCreateRequest,
} from '@platform/contracts';
import { DomainError, mapDbError, requireValid, sqlState } from '@platform/service-kit';
import type { Request, RequestHandler, Response } from 'express';
import { demoSites } from '../db/seed.js';
import { DocumentTooLargeError } from '../domain/gateway-state.js';
import type { RolloutAction, RolloutState } from '../rollout/sql.js';
import {
  NoTargetsError,
  openRollout,
  RolloutInvalidError,
  RolloutOverlapError,
  RolloutStateError,
  UnknownRolloutError,
  type RolloutCaller,
} from '../rollout/service.js';
import type { GatewayService } from '../service.js';
import { auditOrigin, principalOf } from './auth.js';
import type { CursorSeal } from './cursor-seal.js';
import { readListQuery } from './list-query.js';
import { listDoc, settingsTooLarge, UNUSED_BODY, type DocumentedRoute } from './route-parts.js';

/** Create, list, read, and the four actions; every one behind the API key (`withApiKey`). */
export function rolloutRoutes(
  service: GatewayService,
  withApiKey: (route: DocumentedRoute) => DocumentedRoute,
): DocumentedRoute[] {
  // Who asks: scopes what it sees and changes, and is the audit's and the rollout events' actor (issue 42 §3, §4).
  const caller = (req: Request, res: Response): RolloutCaller => ({
    origin: auditOrigin(req, res),
    sites: service.sites,
  });
  const createRollout: RequestHandler = async (req, res) => {
    // The settings are validated exactly as a notify body's (the same Device Settings schema).
    const body = requireValid(validateRolloutCreateRequest(req.body));
    // A caller scoped by companies names its company's sites now, not as the catalogue last read them
    // (sites/confirm.ts); the same refusal as a site outside its scope (the rollout service's check).
    const confirmed = await service.confirmSites(principalOf(res), body.selector.site_ids ?? []);
    if (confirmed.kind === 'outside') {
      const path = `/selector/site_ids/${confirmed.index}`;
      throw new DomainError(
        'invalid_body',
        `The rollout cannot be created: ${path} is not a site known to the caller.`,
        {
          errors: [{ path, message: 'is not a site known to the caller' }],
        },
      );
    }
    try {
      const created = await service.rollouts.create(body, caller(req, res));
      req.log.info('rollout created', {
        rollout_id: created.rollout_id,
        targets: created.targets,
        waves: created.waves,
        skipped: created.skipped ?? 0,
        overridden: created.overridden,
      });
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
          `${err.devices} of the selected devices belong to ${openRollout(err.conflictingRollout)}; a device belongs to at most one open rollout.`,
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
    res.json(await service.rollouts.get(id, caller(req, res)).catch(rolloutProblem));
  };
  const rollouts: RequestHandler = async (req, res) => {
    await service.cursors.ready();
    const { items, next_seq } = await service.rollouts
      .list(rolloutListQuery(req, service.cursors), caller(req, res))
      .catch(rolloutProblem);
    res.json({ items, next_cursor: next_seq === null ? null : service.cursors.seal('rollouts', next_seq) });
  };
  const control =
    (action: RolloutAction): RequestHandler =>
    async (req, res) => {
      const id = rolloutId(req);
      // A scoped caller acts on the sites of now, not on a catalogue up to GATEWAY_SITES_REFRESH_MS old (fifth cold
      // review of issue 42: the old company paused, resumed and cancelled a rollout on a site just handed to another
      // company, and its resume stood past the driver's pause; the sixth: the site's own key did the same, since the
      // rollout's pairs are compared for every scoped caller). Actions are rare: one read of the sites each.
      const sites = principalOf(res).unscoped ? service.sites : await service.sitesNow();
      const outcome = await service.rollouts
        .control(id, action, { origin: auditOrigin(req, res), sites })
        .catch(rolloutProblem);
      req.log.info(`rollout ${action}`, { rollout_id: id, state: outcome.state, returned: outcome.returned });
      res.json({ rollout_id: id, state: outcome.state, devices_returned: outcome.returned });
    };

  return [
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
rollout: an overlap is 409 (\`rollout_conflict\`) naming the open rollout in \`detail\` (a caller limited to sites is
told of a rollout that reaches other sites without its id).

\`settings\` is the whole document every target gets; \`settings_patch\` instead is an RFC 7396 JSON Merge Patch merged
into each target's settings as the rollout records them (its earlier rollout's assignment, else its registry
settings: what a rollback gives back). A target whose merged settings are not valid Device Settings or do not fit
one datagram is skipped, counted in \`skipped\` and named in \`skipped_devices\`. \`overridden\` names the targets
holding a development override now: with the replica bus, their assignment ends it (design §3.3).

Each of \`selector.site_ids\` must be a site of the platform the caller may see, else 400 at
\`/selector/site_ids/<i>\`. A caller limited to sites must name its sites (400 at \`/selector/site_ids\` without
them), so its devices' ids or models never reach another site's devices. The rollout's events and its audit row
name the caller.
`,
        requestBody: {
          schema: rolloutCreateRequestSchema,
          example: {
            selector: { site_ids: [demoSites.acmeHq], models: ['hvac-rtu-4000'] },
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

/** GET /api/rollouts's query (list-query.ts, by rolloutListQuerySchema). */
function rolloutListQuery(
  req: Request,
  cursors: CursorSeal,
): { limit: number; cursor?: string; state?: RolloutState } {
  const { limit, cursor, filters } = readListQuery(req, rolloutListQuerySchema, (text) =>
    cursors.open('rollouts', text),
  );
  return {
    limit,
    ...(cursor === undefined ? {} : { cursor }),
    ...(filters.state === undefined ? {} : { state: filters.state as RolloutState }),
  };
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
