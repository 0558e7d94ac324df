// The rollouts' SQL (migration 0006, design §3.9): the SECURITY DEFINER functions the login may call, and the
// reads of the API and of the replicas. Nothing here knows HTTP.
import { errorMessage, type Logger } from '@platform/service-kit';
import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import { notifyChannel } from '../cluster/channels.js';
import { ROLLOUT_CHANNEL } from '../cluster/messages.js';
import type { GatewayDatabase } from '../db/tables.js';

type Db = Kysely<GatewayDatabase> | Transaction<GatewayDatabase>;

/** A caller's site scope (names.ts siteScopeOf). */
export interface SiteScope {
  /** A condition on a site id column (Principal.siteCondition). */
  site(column: RawBuilder<unknown>): RawBuilder<boolean>;
  /** `<site>/<company>` for each site the caller sees, with the company it belongs to now (SiteCatalogue). */
  pairs: readonly string[];
}

/**
 * Who the rollout events of this transaction name (migration 0030): `set_config(..., true)` lasts until the
 * transaction ends; the functions write `device_gateway.rollout_actor()`, this value when it has the audit's
 * principal shape, else `api`.
 */
export async function setRolloutActor(trx: Transaction<GatewayDatabase>, actor: string): Promise<void> {
  await sql`SELECT pg_catalog.set_config('device_gateway.actor', ${actor}, true)`.execute(trx);
}

/**
 * The sites a rollout reaches or names, sorted: its targets' as the registry places them now, those its selector
 * names, and those of the devices its selector names (design §3.9). Its audit rows carry them, so that a reader
 * limited to sites sees a row's detail (the selector) and rollout only when it may see the rollout (withinScope).
 */
export async function rolloutSites(db: Db, rolloutId: string): Promise<string[]> {
  const { rows } = await sql<{ site_id: string }>`
    SELECT r.site_id::text AS site_id FROM device_gateway.rollout_targets t
    JOIN device_gateway.device_registry r ON r.device_id = t.device_id
    WHERE t.rollout_id = ${rolloutId}::uuid
    UNION
    SELECT named.site_id FROM device_gateway.rollouts ro,
      jsonb_array_elements_text(coalesce(ro.selector->'site_ids', '[]')) named(site_id)
    WHERE ro.rollout_id = ${rolloutId}::uuid
    UNION
    SELECT nr.site_id::text FROM device_gateway.rollouts ro,
      jsonb_array_elements_text(coalesce(ro.selector->'device_ids', '[]')) named(device_id)
    JOIN device_gateway.device_registry nr ON nr.device_id = named.device_id
    WHERE ro.rollout_id = ${rolloutId}::uuid
    ORDER BY 1`.execute(db);
  return rows.map((r) => r.site_id);
}

/**
 * Whether everything the rollout reaches or names is at a site of `scope` (issue 42 §3, design §3.9): every target
 * as the registry places it now, every site its selector names, and the site of every device its selector names
 * (a target or named device that left the registry has no site, and counts as outside); and each site it reached or
 * named at its creation belonged then to the company it belongs to now (0041's pairs: a site the portal handed to
 * another company does not bring the old company's rollouts, whose events name its people, to the new one).
 * `rollout` is the alias of a `device_gateway.rollouts` row in the query. Such a rollout is the caller's to see; any
 * other is never named to it (names.ts), since its detail, audit rows and events would name what lies outside.
 */
function withinScope(rollout: string, scope: SiteScope): RawBuilder<boolean> {
  const id = sql.ref(`${rollout}.rollout_id`);
  const selector = sql.ref(`${rollout}.selector`);
  const stamped = sql.ref(`${rollout}.site_companies`);
  return sql<boolean>`((cardinality(${stamped}) = 0 OR ${stamped} <@ ${[...scope.pairs]}::text[])
    AND NOT EXISTS (SELECT 1 FROM device_gateway.rollout_targets t
      LEFT JOIN device_gateway.device_registry r ON r.device_id = t.device_id
      WHERE t.rollout_id = ${id} AND (r.site_id IS NULL OR NOT (${scope.site(sql.ref('r.site_id'))})))
    AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(coalesce(${selector}->'site_ids', '[]')) named(site_id)
      WHERE NOT (${scope.site(sql`named.site_id::uuid`)}))
    AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(coalesce(${selector}->'device_ids', '[]')) named(device_id)
      LEFT JOIN device_gateway.device_registry nr ON nr.device_id = named.device_id
      WHERE nr.site_id IS NULL OR NOT (${scope.site(sql.ref('nr.site_id'))})))`;
}

export async function rolloutWithinScope(db: Db, rolloutId: string, scope: SiteScope): Promise<boolean> {
  const { rows } = await sql<{ ok: boolean }>`
    SELECT EXISTS (SELECT 1 FROM device_gateway.rollouts ro WHERE ro.rollout_id = ${rolloutId}::uuid
      AND ${withinScope('ro', scope)}) AS ok`.execute(db);
  return rows[0]?.ok === true;
}

/**
 * Of `ids`, the rollouts whose every target is at a site of `scope`: the ones a caller limited to sites may see and
 * name (issue 42 §3). Any other rollout is never named to it, wherever it would appear (design §4.5).
 */
export async function rolloutsWithinScope(
  db: Db,
  ids: readonly string[],
  scope: SiteScope,
): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const { rows } = await sql<{ id: string }>`
    SELECT ro.rollout_id::text AS id FROM device_gateway.rollouts ro
    WHERE ro.rollout_id = ANY(${[...new Set(ids)]}::uuid[])
      AND ${withinScope('ro', scope)}`.execute(db);
  return new Set(rows.map((r) => r.id));
}

export type RolloutState = 'active' | 'paused' | 'completed' | 'cancelled' | 'rolled_back';
export type RolloutAction = 'pause' | 'resume' | 'cancel' | 'rollback';

export interface RolloutPlan {
  first_wave_count?: number;
  first_wave_percent?: number;
  growth_factor: number;
  max_per_minute?: number;
  success_share: number;
  abort_share: number;
  deadline_s: number;
}

export type CreateResult =
  | { rollout_id: string; targets: number; waves: number }
  | { conflict: string; devices: number }
  | { error: 'no_targets' }
  | { error: 'too_many_targets'; targets: number; max: number };

/** A creation of at most `maxTargets` devices (migration 0018: counted before any lock is taken). */
export async function createRollout(
  db: Db,
  selector: Record<string, unknown>,
  settingsJson: string,
  content: string,
  plan: RolloutPlan,
  maxTargets: number,
): Promise<CreateResult> {
  const { rows } = await sql<{ r: CreateResult }>`
    SELECT device_gateway.rollout_create(${JSON.stringify(selector)}::jsonb, ${settingsJson}::jsonb, ${content},
      ${JSON.stringify(plan)}::jsonb, ${maxTargets}::integer) AS r`.execute(db);
  return rows[0]!.r;
}

/** What a patch rollout's creation gives each device (rollout_create_patch, migration 0024). */
export type PatchDocument =
  | { base_md5: string; settings: unknown; content: string }
  | { base_md5: string; reason: 'patch_invalid'; detail: string };

/**
 * A patch rollout's creation (migration 0024): `devices[i]` gets `docs[doc[i]]`, each checked against what the
 * creation records as the device's settings before (by md5 of its text); a difference fails with 40001.
 */
export async function createPatchRollout(
  db: Db,
  selector: Record<string, unknown>,
  patch: Record<string, unknown>,
  plan: RolloutPlan,
  maxTargets: number,
  devices: string[],
  doc: number[],
  docs: PatchDocument[],
): Promise<CreateResult & { skipped?: number }> {
  const { rows } = await sql<{ r: CreateResult & { skipped?: number } }>`
    SELECT device_gateway.rollout_create_patch(${JSON.stringify(selector)}::jsonb, ${JSON.stringify(patch)}::jsonb,
      ${JSON.stringify(plan)}::jsonb, ${maxTargets}::integer, ${devices}::text[], ${doc}::integer[],
      ${JSON.stringify(docs)}::jsonb) AS r`.execute(db);
  return rows[0]!.r;
}

/** A device a patch rollout would target, with the settings the patch merges into (as rollout_create records them). */
export interface PatchBase {
  device_id: string;
  /** JSON text of its rollout assignment's settings, else of its registry settings. */
  base: string;
  base_md5: string;
}

/** The enabled devices the selector matches (as rollout_create resolves them), at most `limit`, with their bases. */
export async function readPatchBases(
  db: Db,
  selector: { site_ids?: readonly string[]; models?: readonly string[]; device_ids?: readonly string[] },
  limit: number,
): Promise<PatchBase[]> {
  const sites = selector.site_ids ?? null;
  const models = selector.models ?? null;
  const ids = selector.device_ids ?? null;
  const { rows } = await sql<PatchBase>`
    SELECT r.device_id, coalesce(a.settings, r.desired_settings)::text AS base,
           md5(coalesce(a.settings, r.desired_settings)::text) AS base_md5
    FROM device_gateway.device_registry r
    LEFT JOIN device_gateway.rollout_assignments a ON a.device_id = r.device_id AND a.settings IS NOT NULL
    WHERE r.enabled
      AND (${sites}::uuid[] IS NULL OR r.site_id = ANY (${sites}::uuid[]))
      AND (${models}::text[] IS NULL OR r.model = ANY (${models}::text[]))
      AND (${ids}::text[] IS NULL OR r.device_id = ANY (${ids}::text[]))
    LIMIT ${limit}`.execute(db);
  return rows;
}

/** The first `limit` targets (by device id) a patch rollout skipped at its creation, with why. */
export async function patchSkipped(
  db: Db,
  rolloutId: string,
  limit: number,
): Promise<{ device_id: string; reason: string }[]> {
  const { rows } = await sql<{ device_id: string; reason: string }>`
    SELECT device_id, coalesce(outcome_detail, outcome_reason) AS reason FROM device_gateway.rollout_targets
    WHERE rollout_id = ${rolloutId}::uuid AND outcome_reason = 'patch_invalid'
    ORDER BY device_id COLLATE "C" LIMIT ${limit}`.execute(db);
  return rows;
}

/** Which of `deviceIds` the rollout targets. */
export async function targetsAmong(db: Db, rolloutId: string, deviceIds: string[]): Promise<string[]> {
  if (deviceIds.length === 0) return [];
  const { rows } = await sql<{ device_id: string }>`
    SELECT device_id FROM device_gateway.rollout_targets
    WHERE rollout_id = ${rolloutId}::uuid AND device_id = ANY (${deviceIds}::text[])
    ORDER BY device_id`.execute(db);
  return rows.map((r) => r.device_id);
}

export type ControlResult =
  | { state: RolloutState; returned: number }
  | { error: 'unknown' }
  | { error: 'state'; state: RolloutState }
  | { conflict: string };

export async function controlRollout(
  db: Db,
  rolloutId: string,
  action: RolloutAction,
): Promise<ControlResult> {
  const { rows } = await sql<{ r: ControlResult }>`
    SELECT device_gateway.rollout_control(${rolloutId}::uuid, ${action}) AS r`.execute(db);
  return rows[0]!.r;
}

/**
 * The wake-up on the rollout channel after a commit that created a rollout (`r`) or changed assignments (`a`), in
 * a statement of its own (migration 0021: the functions no longer NOTIFY in their transaction). PostgreSQL's
 * NOTIFY queue is the whole cluster's, so another database's session can fill it, and a NOTIFY then fails at its
 * commit: here that costs the replicas a timer's delay (AssignmentSync reads every second), never the caller.
 * Best-effort: a failure is logged, never thrown. The payload is what the functions sent; replicas ignore it.
 */
export async function wakeRolloutReplicas(
  db: Db,
  kind: 'r' | 'a',
  logger: Pick<Logger, 'warn'>,
): Promise<void> {
  try {
    await notifyChannel(db, ROLLOUT_CHANNEL, JSON.stringify({ k: kind }));
  } catch (err) {
    logger.warn('rollouts: wake-up not sent; the replicas read the assignments on their timer', {
      error: errorMessage(err),
    });
  }
}

export async function takeLease(db: Db, replica: string, ttlMs: number): Promise<boolean> {
  const { rows } = await sql<{ ok: boolean }>`
    SELECT device_gateway.rollout_lease(${replica}, ${ttlMs}) AS ok`.execute(db);
  return rows[0]?.ok === true;
}

export async function releaseLease(db: Db, replica: string): Promise<void> {
  await sql`SELECT device_gateway.rollout_release(${replica})`.execute(db);
}

export interface StepResult {
  driver: boolean;
  assigned?: number;
  open?: number;
  term?: number;
}

/**
 * Pauses, as the driver, each active rollout that reaches a site the portal handed to another company since its
 * creation (migration 0043: a site it reached or named then belongs now to a company that is neither the one 0041
 * stamped for it nor one an earlier such pause accepted); the ids paused. Checks the lease as `rollout_step` does (none when this
 * replica does not hold it). Its `paused` events are the driver's, audited with its other halts (driverDecisions).
 */
export async function pauseHandedOver(db: Db, replica: string): Promise<string[]> {
  const { rows } = await sql<{ ids: string[] }>`
    SELECT device_gateway.rollout_pause_handed_over(${replica})::text[] AS ids`.execute(db);
  return rows[0]?.ids ?? [];
}

/**
 * `judge`: read outcomes from the delivery record in this step (not within a busy streak, design §3.9).
 * `lagMs`: how far the delivery record may lag a device; no device is judged failed before its deadline plus this.
 */
export async function step(
  db: Db,
  replica: string,
  maxAssign: number,
  judge: boolean,
  lagMs: number,
): Promise<StepResult> {
  const { rows } = await sql<{ r: StepResult }>`
    SELECT device_gateway.rollout_step(${replica}, ${maxAssign}, ${judge}, ${lagMs}) AS r`.execute(db);
  return rows[0]!.r;
}

/**
 * How far behind the delivery record is (ms, 0: not behind): the oldest unwritten event among the replicas
 * whose bus session is up, as they last reported it (`delivery_lag_ms`, migration 0014).
 */
export async function deliveryLagMs(db: Db): Promise<number> {
  const { rows } = await sql<{ ms: number }>`SELECT device_gateway.delivery_lag_ms() AS ms`.execute(db);
  return rows[0]?.ms ?? 0;
}

export interface RolloutRow {
  rollout_id: string;
  seq: string;
  state: RolloutState;
  /** `settings` is an RFC 7396 merge patch (migration 0024). */
  patch: boolean;
  reason: string | null;
  aborted: boolean;
  selector: Record<string, unknown>;
  settings: Record<string, unknown>;
  first_wave_count: number | null;
  first_wave_percent: number | null;
  growth_factor: number;
  max_per_minute: number | null;
  success_share: number;
  abort_share: number;
  deadline_s: number;
  targets: number;
  waves: number;
  current_wave: number;
  created_at: Date;
  updated_at: Date;
}

const ROLLOUT_COLUMNS = sql`rollout_id::text AS rollout_id, seq::text AS seq, state, patch, reason, aborted, selector,
  settings, first_wave_count, first_wave_percent, growth_factor, max_per_minute, success_share, abort_share,
  deadline_s, targets, waves, current_wave, created_at, updated_at`;

export async function readRollout(db: Db, rolloutId: string): Promise<RolloutRow | undefined> {
  const { rows } = await sql<RolloutRow>`
    SELECT ${ROLLOUT_COLUMNS} FROM device_gateway.rollouts WHERE rollout_id = ${rolloutId}::uuid`.execute(db);
  return rows[0];
}

export interface WaveCounts {
  wave: number;
  targeted: number;
  notified: number;
  acknowledged: number;
  failed: number;
  skipped: number;
  pending: number;
}

export async function waveCounts(db: Db, rolloutId: string): Promise<WaveCounts[]> {
  const { rows } = await sql<WaveCounts>`
    SELECT wave, count(*)::int AS targeted, count(notified_at)::int AS notified,
      count(*) FILTER (WHERE outcome = 'acknowledged')::int AS acknowledged,
      count(*) FILTER (WHERE outcome = 'failed')::int AS failed,
      count(*) FILTER (WHERE outcome = 'skipped')::int AS skipped,
      count(*) FILTER (WHERE notified_at IS NOT NULL AND outcome IS NULL)::int AS pending
    FROM device_gateway.rollout_targets WHERE rollout_id = ${rolloutId}::uuid
    GROUP BY wave ORDER BY wave`.execute(db);
  return rows;
}

export interface RolloutEvent {
  kind: string;
  wave: number | null;
  actor: string;
  detail: string | null;
  at: Date;
}

/** The rollout's newest `limit` events, oldest first. */
export async function rolloutEvents(db: Db, rolloutId: string, limit: number): Promise<RolloutEvent[]> {
  const { rows } = await sql<RolloutEvent>`
    SELECT kind, wave, actor, detail, at FROM (
      SELECT event_id, kind, wave, actor, detail, at FROM device_gateway.rollout_events
      WHERE rollout_id = ${rolloutId}::uuid ORDER BY event_id DESC LIMIT ${limit}) e
    ORDER BY event_id`.execute(db);
  return rows;
}

/**
 * One page of rollouts, newest first, after the cursor's `seq`; `limit + 1` rows. Ordered by the column
 * (`rollouts.seq`, a bigint), not by the output's `seq`, which is its text: a bare `ORDER BY seq` names the output
 * column, and text order listed 9 8 7 63 62 … and lost rollouts between pages (issue 41).
 */
export async function listRollouts(
  db: Db,
  q: { limit: number; beforeSeq?: string; state?: RolloutState; scope?: SiteScope },
): Promise<RolloutRow[]> {
  const scoped = q.scope === undefined ? sql`TRUE` : withinScope('rollouts', q.scope);
  const { rows } = await sql<RolloutRow>`
    SELECT ${ROLLOUT_COLUMNS} FROM device_gateway.rollouts
    WHERE (${q.beforeSeq ?? null}::bigint IS NULL OR seq < ${q.beforeSeq ?? null}::bigint)
      AND (${q.state ?? null}::text IS NULL OR state = ${q.state ?? null}::text)
      AND ${scoped}
    ORDER BY rollouts.seq DESC LIMIT ${q.limit + 1}`.execute(db);
  return rows;
}

/** A decision of the driver's own that the audit records (issue 42 §4): a halt by a rule, or a completion. */
export interface DriverDecision {
  event_id: string;
  rollout_id: string;
  kind: 'paused' | 'aborted' | 'completed';
  detail: string | null;
  reason: string | null;
  at: Date;
}

/**
 * The driver's halts and completions after event `afterEventId` (null: from the first), oldest first, at most
 * `limit`, with the rollout's reason (why it paused). Its events' actor is `driver <replica> term <n>` (0006).
 */
export async function driverDecisions(
  db: Db,
  afterEventId: string | null,
  limit: number,
): Promise<DriverDecision[]> {
  const { rows } = await sql<DriverDecision>`
    SELECT e.event_id::text AS event_id, e.rollout_id::text AS rollout_id, e.kind, e.detail, ro.reason, e.at
    FROM device_gateway.rollout_events e JOIN device_gateway.rollouts ro ON ro.rollout_id = e.rollout_id
    WHERE e.event_id > coalesce(${afterEventId}::bigint, 0) AND e.kind IN ('paused', 'aborted', 'completed')
      AND e.actor LIKE 'driver %'
    ORDER BY e.event_id LIMIT ${limit}`.execute(db);
  return rows;
}

/** The last driver event the audit holds (its rows' `event_id`), null when none: where the driver's audit resumes. */
export async function lastAuditedDriverEvent(db: Db): Promise<string | null> {
  const { rows } = await sql<{ event_id: string | null }>`
    SELECT detail->>'event_id' AS event_id FROM device_gateway.audit_events
    WHERE principal = 'driver' AND detail ? 'event_id' ORDER BY id DESC LIMIT 1`.execute(db);
  const id = rows[0]?.event_id;
  return id !== undefined && id !== null && /^[0-9]{1,19}$/.test(id) ? id : null;
}

/** Open rollouts by state, and those paused by their abort criterion: the metrics' gauges. */
export async function rolloutCounts(db: Db): Promise<{ state: RolloutState; aborted: boolean; n: number }[]> {
  const { rows } = await sql<{ state: RolloutState; aborted: boolean; n: number }>`
    SELECT state, aborted, count(*)::int AS n FROM device_gateway.rollouts
    WHERE state IN ('active', 'paused') GROUP BY state, aborted`.execute(db);
  return rows;
}

export interface AssignmentRow {
  device_id: string;
  rollout_id: string;
  /** JSON text, or null: the assignment was removed (back to the registry). */
  settings: string | null;
  seq: string;
}

/**
 * Assignments changed after `afterSeq`, in seq order, at most `limit`. Ordered by the column (a bigint), not by the
 * output's `seq` (its text): in text order a page's last row is not its highest seq, and a start with more than
 * a page of rows lost assignments between pages (issue 41: 20,563 rows, 20,506 read).
 */
export async function readAssignments(db: Db, afterSeq: string, limit: number): Promise<AssignmentRow[]> {
  const { rows } = await sql<AssignmentRow>`
    SELECT device_id, rollout_id::text AS rollout_id, settings::text AS settings, seq::text AS seq
    FROM device_gateway.rollout_assignments WHERE seq > ${afterSeq}::bigint
    ORDER BY rollout_assignments.seq LIMIT ${limit}`.execute(db);
  return rows;
}
