// Rollouts as the management API uses them (design §3.9): create, read, list, and the four actions. The rules
// that need the registry as this replica holds it (the settings document fits one datagram) are checked here;
// what needs every replica's view (the targets, overlaps, states) is decided in one database function each.
import { validateDeviceSettings, type RolloutCreateRequest } from '@platform/contracts';
import { sqlState, type Logger } from '@platform/service-kit';
import type { Kysely, Transaction } from 'kysely';
import { audit, type AuditOrigin } from '../audit/writer.js';
import type { GatewayDatabase } from '../db/tables.js';
import type { SiteCatalogue } from '../sites/catalogue.js';
import { contentHash } from '../delivery/recorder.js';
import { mergePatch, prepareSettings, settingsDocument, type Settings } from '../domain/documents.js';
import { DocumentTooLargeError, type GatewayState } from '../domain/gateway-state.js';
import { siteScopeOf } from './names.js';
import {
  controlRollout,
  createPatchRollout,
  createRollout,
  readPatchBases,
  rolloutWithinScope,
  setRolloutActor,
  rolloutSites,
  targetsAmong,
  type SiteScope,
  type PatchDocument,
  type RolloutPlan,
  listRollouts,
  patchSkipped,
  readRollout,
  rolloutEvents,
  waveCounts,
  type ControlResult,
  type CreateResult,
  type RolloutAction,
  type RolloutRow,
  type RolloutState,
  wakeRolloutReplicas,
} from './sql.js';

/** The longest device id (design §3.2): a rollout's document must fit one datagram for any target. */
const LONGEST_DEVICE_ID = 'd'.repeat(128);

/** The selector matched no enabled device of the registry. */
export class NoTargetsError extends Error {
  constructor() {
    super('the selector matches no enabled device');
    this.name = 'NoTargetsError';
  }
}

/**
 * The rollout would share devices with an open (active or paused) one: named, unless the caller may not see it
 * (undefined: names.ts).
 */
export class RolloutOverlapError extends Error {
  constructor(
    readonly conflictingRollout: string | undefined,
    readonly devices: number,
  ) {
    super(`${devices} of its devices belong to ${openRollout(conflictingRollout)}`);
    this.name = 'RolloutOverlapError';
  }
}

/**
 * An open rollout in a message: by id, or, when the caller may not see it, without it. Such a rollout reaches sites
 * outside the caller's scope, or was created while one of its sites belonged to another company (design §3.9): only
 * an unscoped principal sees it.
 */
export function openRollout(id: string | undefined): string {
  return id === undefined
    ? 'an open rollout that also reaches sites outside your scope, or was created while one of its sites belonged to another company (you may not see it; an unscoped operator can pause, cancel or roll it back)'
    : `the open rollout ${id}`;
}

/**
 * The request is well-formed but the rollout cannot take it: `path` (a JSON pointer into the body) says what.
 * A deadline shorter than the delivery record's lag bound, or a bound of the rollouts table (a CHECK of
 * migration 0006) that the schema does not express.
 */
export class RolloutInvalidError extends Error {
  constructor(
    readonly path: string,
    message: string,
  ) {
    super(message);
    this.name = 'RolloutInvalidError';
  }
}

export class UnknownRolloutError extends Error {
  constructor(readonly rolloutId: string) {
    super(`rollout ${rolloutId} is unknown`);
    this.name = 'UnknownRolloutError';
  }
}

/** The action does not apply to the rollout's state, or a rollback would undo an open rollout's devices. */
export class RolloutStateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RolloutStateError';
  }
}

/**
 * Who asks (issue 42 §3, §4): the principal and where from (the audit's origin), and the platform's sites its scope
 * is read through. A principal limited to sites sees and changes only rollouts whose targets are all at its sites;
 * its creations must name their sites. Without a caller (the service's own tests): unscoped, not audited.
 */
export interface RolloutCaller {
  origin: AuditOrigin;
  sites: SiteCatalogue;
}

/** The caller's scope as a site condition; undefined: it sees every site. */
function scopeOf(caller: RolloutCaller | undefined): SiteScope | undefined {
  return caller === undefined ? undefined : siteScopeOf(caller.origin.principal, caller.sites);
}

/**
 * The actor the rollout events name (migration 0030): the principal's id; nothing for the anonymous key, whose
 * events say `api` as they did before principals existed.
 */
function actorOf(caller: RolloutCaller | undefined): string | undefined {
  const principal = caller?.origin.principal;
  return principal === undefined || principal.kind === 'anonymous_key' ? undefined : principal.id;
}

/**
 * The selector's sites as the caller may name them (issue 42 §1, §3): each must be a site of the platform and, for
 * a caller limited to sites, one of its own; such a caller must name its sites (the selector then reaches no device
 * elsewhere, whatever its device ids or models say). The refusal names only the caller's own input.
 */
function checkSelectorSites(
  selector: RolloutCreateRequest['selector'],
  caller: RolloutCaller | undefined,
): void {
  if (caller === undefined) return;
  const { principal } = caller.origin;
  const siteIds = selector.site_ids;
  if (siteIds === undefined) {
    if (!principal.unscoped)
      throw new RolloutInvalidError(
        '/selector/site_ids',
        'is required: the caller is limited to sites, and a rollout names the sites it may reach',
      );
    return;
  }
  siteIds.forEach((siteId, i) => {
    if (!caller.sites.knows(siteId) || !principal.seesSite(siteId, caller.sites))
      throw new RolloutInvalidError(`/selector/site_ids/${i}`, 'is not a site known to the caller');
  });
}

/**
 * The selector as its audit row keeps it: each list's first items and, when it had more, its length (the row's
 * detail holds at most 4 KiB; 20 site ids, 10 models of at most 100 characters and 10 device ids of at most 128
 * fit with room to spare).
 */
const AUDITED_ITEMS = { site_ids: 20, models: 10, device_ids: 10 } as const;
function auditedSelector(selector: RolloutCreateRequest['selector']): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(AUDITED_ITEMS) as (keyof typeof AUDITED_ITEMS)[]) {
    const list = selector[key];
    if (list === undefined) continue;
    out[key] = list.slice(0, AUDITED_ITEMS[key]);
    if (list.length > AUDITED_ITEMS[key]) out[`${key}_count`] = list.length;
  }
  return out;
}

const CHANGE_OF: Readonly<Record<RolloutAction, 'paused' | 'resumed' | 'cancelled' | 'rolled_back'>> = {
  pause: 'paused',
  resume: 'resumed',
  cancel: 'cancelled',
  rollback: 'rolled_back',
};

export interface RolloutServiceOptions {
  db: Kysely<GatewayDatabase>;
  /**
   * Where a creation runs (default `db`): one statement of a row per target, on a connection whose statement
   * timeout is GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS rather than the pool's (design §3.9).
   */
  createDb?: Kysely<GatewayDatabase>;
  state: Pick<GatewayState, 'prepareAssignment' | 'overrideIds'>;
  /** After an action that changed assignments: this replica reads them (the bus tells the others). */
  afterChange: () => Promise<void>;
  /** Wakes the driver (a creation or a resume need not wait for its next tick). */
  wake: () => void;
  /**
   * The shortest deadline a plan may have (ms): the delivery record's lag bound (design §3.8, §3.9). A shorter
   * one could only judge devices on a record that has not caught up.
   */
  minDeadlineMs: number;
  /** The most devices a rollout may target (GATEWAY_ROLLOUT_MAX_TARGETS as config.ts bounds it). */
  maxTargets: number;
  /** Where a wake-up of the replicas that could not be sent is logged. */
  logger: Pick<Logger, 'warn'>;
}

const EVENTS_SHOWN = 50;
/** Devices named in a creation's answer (skipped, overridden), at most. */
const NAMED = 100;
/** A patch rollout's creation is tried again this often when devices changed under it (40001). */
const PATCH_ATTEMPTS = 3;

/** POST /api/rollouts's answer (design §3.9). */
export interface RolloutCreated {
  rollout_id: string;
  targets: number;
  waves: number;
  /** Targets skipped at the creation: the patch makes their settings invalid. */
  skipped?: number;
  skipped_devices?: { device_id: string; reason: string }[];
  /** Targets holding a development override now (their assignment ends it, design §3.3). */
  overridden: number;
  overridden_devices: string[];
}

export class RolloutService {
  constructor(private readonly options: RolloutServiceOptions) {}

  /**
   * `request` is valid (the edge checked it). Throws DocumentTooLargeError, NoTargetsError, RolloutOverlapError,
   * RolloutInvalidError (also for a selector matching more than maxTargets devices).
   */
  async create(request: RolloutCreateRequest, caller?: RolloutCaller): Promise<RolloutCreated> {
    checkSelectorSites(request.selector, caller);
    const minDeadlineS = Math.ceil(this.options.minDeadlineMs / 1000);
    if (request.plan.deadline_s < minDeadlineS)
      throw new RolloutInvalidError(
        '/plan/deadline_s',
        `must be at least ${minDeadlineS} s here: the delivery record lags a device by up to ${this.options.minDeadlineMs} ms`,
      );
    const plan = request.plan;
    const rolloutPlan: RolloutPlan = {
      ...(plan.first_wave_count === undefined ? {} : { first_wave_count: plan.first_wave_count }),
      ...(plan.first_wave_percent === undefined ? {} : { first_wave_percent: plan.first_wave_percent }),
      growth_factor: plan.growth_factor ?? 2,
      ...(plan.max_per_minute === undefined ? {} : { max_per_minute: plan.max_per_minute }),
      success_share: plan.success_share,
      abort_share: plan.abort_share,
      deadline_s: plan.deadline_s,
    };
    let created: { rollout_id: string; targets: number; waves: number };
    let skipped: Pick<RolloutCreated, 'skipped' | 'skipped_devices'> = {};
    try {
      if (request.settings_patch !== undefined) {
        ({ created, skipped } = await this.createPatch(
          request.selector,
          request.settings_patch,
          rolloutPlan,
          caller,
        ));
      } else {
        // The schema's oneOf: a body without a patch has its settings.
        created = await this.createWhole(request.selector, request.settings as Settings, rolloutPlan, caller);
      }
    } catch (err) {
      if (err instanceof RolloutOverlapError && err.conflictingRollout !== undefined)
        throw new RolloutOverlapError(await this.nameFor(err.conflictingRollout, caller), err.devices);
      throw err;
    }
    // After the commit, in a statement of its own (migration 0021): a full NOTIFY queue cannot fail the creation.
    await wakeRolloutReplicas(this.options.db, 'r', this.options.logger);
    this.options.wake();
    // Named so that nobody is surprised: with the replica bus their assignment ends their override (§3.3).
    const overridden = await targetsAmong(this.options.db, created.rollout_id, [
      ...this.options.state.overrideIds(),
    ]);
    return {
      ...created,
      ...skipped,
      overridden: overridden.length,
      overridden_devices: overridden.slice(0, NAMED),
    };
  }

  /** A rollout of one whole document (valid Device Settings) for every target. */
  private async createWhole(
    selector: RolloutCreateRequest['selector'],
    settings: Settings,
    plan: RolloutPlan,
    caller: RolloutCaller | undefined,
  ): Promise<{ rollout_id: string; targets: number; waves: number }> {
    const assignment = this.options.state.prepareAssignment(LONGEST_DEVICE_ID, 'new', settings);
    const content = contentHash(
      settingsDocument(LONGEST_DEVICE_ID, 0, 'rollout', assignment.settings.value, assignment.settings),
    );
    const result = await this.creation(selector, caller, (trx) =>
      createRollout(trx, selector, assignment.settings.json, content, plan, this.options.maxTargets),
    );
    return this.created(result);
  }

  /**
   * One creation in a transaction on the creation's connection: the caller named as the events' actor first, and
   * a creation that succeeded audited in it with its targets' sites (issue 42 §4), so the rollout and its audit
   * row commit together.
   */
  private async creation<R extends CreateResult>(
    selector: RolloutCreateRequest['selector'],
    caller: RolloutCaller | undefined,
    create: (trx: Transaction<GatewayDatabase>) => Promise<R>,
  ): Promise<R> {
    const actor = actorOf(caller);
    return (this.options.createDb ?? this.options.db)
      .transaction()
      .execute(async (trx) => {
        if (actor !== undefined) await setRolloutActor(trx, actor);
        const result = await create(trx);
        if (caller !== undefined && 'rollout_id' in result)
          await audit.rolloutCreated(trx, caller.origin, {
            rolloutId: result.rollout_id,
            siteIds: await rolloutSites(trx, result.rollout_id),
            targets: result.targets,
            selector: auditedSelector(selector),
          });
        return result;
      })
      .catch(checkViolation);
  }

  /**
   * A rollout of an RFC 7396 merge patch (design §3.9): merged here into each target's settings as the creation
   * records them (its rollout assignment, else its registry settings: what a rollback gives back), each result
   * checked as Device Settings and against one datagram for that device; a device whose result fails is skipped
   * with the reason. The creation checks every base again under its lock; when a device changed in between it is
   * undone (40001) and merged again.
   */
  private async createPatch(
    selector: RolloutCreateRequest['selector'],
    patch: Record<string, unknown>,
    plan: RolloutPlan,
    caller: RolloutCaller | undefined,
  ): Promise<{
    created: { rollout_id: string; targets: number; waves: number };
    skipped: Pick<RolloutCreated, 'skipped' | 'skipped_devices'>;
  }> {
    const max = this.options.maxTargets;
    for (let attempt = 1; ; attempt++) {
      // On the creation's connection: a read of up to maxTargets rows, bounded by its timeout, not the pool's.
      const bases = await readPatchBases(this.options.createDb ?? this.options.db, selector, max + 1);
      if (bases.length === 0) throw new NoTargetsError();
      if (bases.length > max)
        throw new RolloutInvalidError(
          '/selector',
          `matches more than ${max} enabled devices; a rollout here targets at most ${max}`,
        );
      const merged = mergeEach(bases, patch, this.options.state);
      // A rollout that could send nothing is the caller's mistake, not a rollout.
      if (merged.skipped.length === bases.length)
        throw new RolloutInvalidError(
          '/settings_patch',
          `makes the settings of every target invalid (${bases.length}); the first: ${merged.skipped[0]!.reason}`,
        );
      try {
        const result = await this.creation(selector, caller, (trx) =>
          createPatchRollout(trx, selector, patch, plan, max, merged.devices, merged.doc, merged.docs),
        );
        const created = this.created(result);
        return {
          created,
          skipped: { skipped: result.skipped ?? 0, skipped_devices: merged.skipped.slice(0, NAMED) },
        };
      } catch (err) {
        if (sqlState(err) !== '40001' || attempt >= PATCH_ATTEMPTS) throw err;
      }
    }
  }

  /** A creation function's answer, or the error it names. */
  private created(result: CreateResult): { rollout_id: string; targets: number; waves: number } {
    if ('error' in result) {
      if (result.error === 'no_targets') throw new NoTargetsError();
      // One statement writes a row per target and must end within the statement timeout (design §3.9).
      throw new RolloutInvalidError(
        '/selector',
        `matches ${result.targets} enabled devices; a rollout here targets at most ${result.max}`,
      );
    }
    if ('conflict' in result) throw new RolloutOverlapError(result.conflict, result.devices);
    return { rollout_id: result.rollout_id, targets: result.targets, waves: result.waves };
  }

  /** The rollout's id when the caller may see it; undefined when it reaches outside the caller's scope. */
  private async nameFor(rolloutId: string, caller: RolloutCaller | undefined): Promise<string | undefined> {
    const scope = scopeOf(caller);
    if (scope === undefined) return rolloutId;
    return (await rolloutWithinScope(this.options.db, rolloutId, scope)) ? rolloutId : undefined;
  }

  /** A rollout the caller may see, else UnknownRolloutError (outside its scope reads as absent). */
  private async requireSeen(rolloutId: string, caller: RolloutCaller | undefined): Promise<void> {
    const scope = scopeOf(caller);
    if (scope !== undefined && !(await rolloutWithinScope(this.options.db, rolloutId, scope)))
      throw new UnknownRolloutError(rolloutId);
  }

  /** Throws UnknownRolloutError. */
  async get(rolloutId: string, caller?: RolloutCaller): Promise<Record<string, unknown>> {
    await this.requireSeen(rolloutId, caller);
    const row = await readRollout(this.options.db, rolloutId);
    if (row === undefined) throw new UnknownRolloutError(rolloutId);
    const [waves, events, skipped] = await Promise.all([
      waveCounts(this.options.db, rolloutId),
      rolloutEvents(this.options.db, rolloutId, EVENTS_SHOWN),
      row.patch ? patchSkipped(this.options.db, rolloutId, NAMED) : [],
    ]);
    const totals = { targeted: 0, notified: 0, acknowledged: 0, failed: 0, skipped: 0, pending: 0 };
    for (const w of waves) for (const k of Object.keys(totals) as (keyof typeof totals)[]) totals[k] += w[k];
    return {
      ...summary(row),
      selector: row.selector,
      ...(row.patch
        ? { settings_patch: row.settings, skipped_devices: skipped }
        : { settings: row.settings }),
      plan: plan(row),
      totals,
      wave_counts: waves,
      events: events.map((e) => ({
        kind: e.kind,
        wave: e.wave,
        actor: e.actor,
        detail: e.detail,
        at: e.at.toISOString(),
      })),
    };
  }

  async list(
    q: {
      limit: number;
      cursor?: string;
      state?: RolloutState;
    },
    caller?: RolloutCaller,
  ): Promise<{ items: Record<string, unknown>[]; next_seq: string | null }> {
    const scope = scopeOf(caller);
    const rows = await listRollouts(this.options.db, {
      limit: q.limit,
      ...(scope === undefined ? {} : { scope }),
      ...(q.cursor === undefined ? {} : { beforeSeq: q.cursor }),
      ...(q.state === undefined ? {} : { state: q.state }),
    });
    const page = rows.slice(0, q.limit);
    const last = page.at(-1);
    return {
      items: page.map(summary),
      // The route seals it (http/cursor-seal.ts): a sequence number shown would count other sites' rollouts.
      next_seq: rows.length > q.limit && last !== undefined ? last.seq : null,
    };
  }

  /** Throws UnknownRolloutError, RolloutStateError. */
  async control(
    rolloutId: string,
    action: RolloutAction,
    caller?: RolloutCaller,
  ): Promise<{ state: RolloutState; returned: number }> {
    await this.requireSeen(rolloutId, caller);
    const actor = actorOf(caller);
    // The action, its events' actor and its audit row in one transaction (issue 42 §4).
    const result: ControlResult = await this.options.db.transaction().execute(async (trx) => {
      if (actor !== undefined) await setRolloutActor(trx, actor);
      const r = await controlRollout(trx, rolloutId, action);
      if (caller !== undefined && !('error' in r) && !('conflict' in r))
        await audit.rolloutChanged(trx, caller.origin, {
          rolloutId,
          siteIds: await rolloutSites(trx, rolloutId),
          change: CHANGE_OF[action],
        });
      return r;
    });
    if ('conflict' in result)
      throw new RolloutStateError(
        `devices of this rollout now belong to ${openRollout(await this.nameFor(result.conflict, caller))}; finish or cancel it first`,
      );
    if ('error' in result) {
      if (result.error === 'unknown') throw new UnknownRolloutError(rolloutId);
      throw new RolloutStateError(`a ${result.state} rollout cannot be asked to ${action}`);
    }
    if (result.returned > 0) {
      // A rollback that returned devices changed assignments: the other replicas are woken after the commit.
      await wakeRolloutReplicas(this.options.db, 'a', this.options.logger);
      await this.options.afterChange();
    }
    this.options.wake();
    return result;
  }
}

/**
 * The patch merged into each device's base (RFC 7396 §2, domain/documents.ts), each distinct base merged and checked
 * as Device Settings once; the size is checked per device (its id is in the document). Devices with equal results
 * share one entry of `docs`.
 */
function mergeEach(
  bases: readonly { device_id: string; base: string; base_md5: string }[],
  patch: Record<string, unknown>,
  state: Pick<GatewayState, 'prepareAssignment'>,
): {
  devices: string[];
  doc: number[];
  docs: PatchDocument[];
  skipped: { device_id: string; reason: string }[];
} {
  const byBase = new Map<string, { settings: Settings; content: string } | { invalid: string }>();
  const index = new Map<string, number>();
  const out = {
    devices: [] as string[],
    doc: [] as number[],
    docs: [] as PatchDocument[],
    skipped: [] as { device_id: string; reason: string }[],
  };
  for (const { device_id: deviceId, base, base_md5: baseMd5 } of bases) {
    let result = byBase.get(baseMd5);
    if (result === undefined) {
      const settings = mergePatch(JSON.parse(base) as unknown, patch);
      const checked = validateDeviceSettings(settings);
      if (checked.ok) {
        const prepared = prepareSettings(settings as Settings);
        const content = contentHash(
          settingsDocument(LONGEST_DEVICE_ID, 0, 'rollout', prepared.value, prepared),
        );
        result = { settings: prepared.value, content };
      } else {
        const why = checked.errors.map((e) => `${e.path || '/'} ${e.message}`).join('; ');
        result = { invalid: `the patched settings are not valid Device Settings: ${why}` };
      }
      byBase.set(baseMd5, result);
    }
    let reason = 'invalid' in result ? result.invalid : undefined;
    if (!('invalid' in result)) {
      try {
        state.prepareAssignment(deviceId, 'new', result.settings);
      } catch (err) {
        if (!(err instanceof DocumentTooLargeError)) throw err;
        reason = `the patched settings do not fit one CoAP datagram: ${err.message}`;
      }
    }
    const key = reason === undefined ? `${baseMd5} ok` : `${baseMd5} ${reason}`;
    let i = index.get(key);
    if (i === undefined) {
      i = out.docs.length;
      index.set(key, i);
      out.docs.push(
        reason === undefined && !('invalid' in result)
          ? { base_md5: baseMd5, settings: result.settings, content: result.content }
          : { base_md5: baseMd5, reason: 'patch_invalid', detail: reason ?? '' },
      );
    }
    out.devices.push(deviceId);
    out.doc.push(i);
    if (reason !== undefined) out.skipped.push({ device_id: deviceId, reason });
  }
  return out;
}

/**
 * A CHECK of the rollouts' tables refused the creation (23514): the caller's input, never a 5xx. Only the
 * constraint's column is named (never the statement or the row, which hold the caller's settings).
 */
function checkViolation(err: unknown): never {
  if (sqlState(err) !== '23514') throw err;
  const constraint = (err as { constraint?: unknown }).constraint;
  const column =
    typeof constraint === 'string' ? /^rollouts_(selector|settings)_check$/.exec(constraint)?.[1] : undefined;
  throw new RolloutInvalidError(
    column === undefined ? '/plan' : `/${column}`,
    'is outside the bounds a rollout is stored with',
  );
}

function summary(row: RolloutRow): Record<string, unknown> {
  return {
    rollout_id: row.rollout_id,
    state: row.state,
    reason: row.reason,
    aborted: row.aborted,
    targets: row.targets,
    waves: row.waves,
    current_wave: row.current_wave,
    created_at: row.created_at.toISOString(),
    updated_at: row.updated_at.toISOString(),
  };
}

function plan(row: RolloutRow): Record<string, unknown> {
  return {
    ...(row.first_wave_count === null ? {} : { first_wave_count: row.first_wave_count }),
    ...(row.first_wave_percent === null ? {} : { first_wave_percent: row.first_wave_percent }),
    growth_factor: row.growth_factor,
    max_per_minute: row.max_per_minute,
    success_share: row.success_share,
    abort_share: row.abort_share,
    deadline_s: row.deadline_s,
  };
}
