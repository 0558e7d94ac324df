// Development overrides in the open (design §3.3, §3.6): the list of every override, their clearing on every
// replica, and a device's settings layers as this replica holds them. With the replica bus the list is the bus's
// retained rows (what every replica converges to), without it this replica's memory.
import type { Kysely } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';
import type { SettingsSource } from '../domain/documents.js';
import { UnknownDeviceError, type GatewayState } from '../domain/gateway-state.js';
import { listOverrides } from './bus-sql.js';

/** The layers GatewayState serves from, in precedence order (design §3.3). */
export type LayerState = Pick<
  GatewayState,
  | 'deviceRecord'
  | 'overrideOf'
  | 'assignmentOf'
  | 'settingsDocument'
  | 'overrideIds'
  | 'hasDevice'
  | 'clearOverride'
>;

interface LayerRef {
  source: SettingsSource;
  rollout_id?: string;
}

/**
 * The device's settings layers (the device view, design §3.8): its development override, its rollout assignment and
 * its registry settings, those present, in precedence order; the first is effective and hides the others.
 * Undefined for a device this replica does not serve.
 */
export function settingsLayers(
  state: Pick<LayerState, 'deviceRecord' | 'overrideOf' | 'assignmentOf'>,
  deviceId: string,
): { effective: SettingsSource; layers: Record<string, unknown>[] } | undefined {
  const record = state.deviceRecord(deviceId);
  if (record === undefined) return undefined;
  const override = state.overrideOf(deviceId);
  const assignment = state.assignmentOf(deviceId);
  const layers: (LayerRef & { settings: unknown })[] = [];
  if (override !== undefined) layers.push({ source: 'override', settings: override.settings.value });
  if (assignment !== undefined)
    layers.push({ source: 'rollout', rollout_id: assignment.rolloutId, settings: assignment.settings.value });
  layers.push({ source: 'registry', settings: record.desiredSettings });
  const top = layers[0]!;
  const effective: LayerRef =
    top.rollout_id === undefined
      ? { source: top.source }
      : { source: top.source, rollout_id: top.rollout_id };
  return {
    effective: top.source,
    layers: layers.map((layer, i) => ({
      ...layer,
      effective: i === 0,
      ...(i === 0 ? {} : { hidden_by: effective }),
    })),
  };
}

/** GET /api/overrides's cursor: the last device id of the page, opaque (base64url of "o:<device id>"). */
export function encodeOverrideCursor(deviceId: string): string {
  return Buffer.from(`o:${deviceId}`).toString('base64url');
}

export function decodeOverrideCursor(cursor: string): string | undefined {
  if (!/^[A-Za-z0-9_-]{1,200}$/.test(cursor)) return undefined;
  const m = /^o:([A-Za-z0-9._:-]{1,128})$/.exec(Buffer.from(cursor, 'base64url').toString('latin1'));
  return m?.[1];
}

export interface OverridesOptions {
  state: LayerState;
  /** The replica bus, when replicas share overrides (GATEWAY_CLUSTER_BUS). */
  bus: { clearOverride(deviceId: string): Promise<{ cleared: boolean }> } | undefined;
  db: Kysely<GatewayDatabase>;
}

/** What the override routes call (http/override-routes.ts). */
export class Overrides {
  constructor(private readonly options: OverridesOptions) {}

  /** One page by device id after `after`; with the bus, from its retained rows (throws the database's errors). */
  async list(q: { limit: number; after?: string }): Promise<{
    items: Record<string, unknown>[];
    next_cursor: string | null;
  }> {
    const { state, bus, db } = this.options;
    let page: {
      device_id: string;
      settings: unknown;
      version: number;
      origin: string | null;
      set_at: string | null;
    }[];
    if (bus !== undefined) {
      const rows = await listOverrides(db, q.after, q.limit + 1);
      page = rows.map((r) => ({
        device_id: r.device_id,
        settings: r.settings,
        version: Number(r.version),
        origin: r.origin,
        set_at: r.published_at.toISOString(),
      }));
    } else {
      // Without the bus the overrides live here alone; a few, set by hand: sorted whole for each page.
      const ids = [...state.overrideIds()]
        .filter((id) => q.after === undefined || id > q.after)
        .sort()
        .slice(0, q.limit + 1);
      page = ids.map((id) => ({
        device_id: id,
        settings: state.overrideOf(id)?.settings.value ?? {},
        version: state.settingsDocument(id)?.version ?? 0,
        origin: null,
        set_at: null,
      }));
    }
    const items = page.slice(0, q.limit).map((o) => ({ ...o, hides: hidden(state, o.device_id) }));
    const last = items.at(-1);
    return {
      items,
      next_cursor: page.length > q.limit && last !== undefined ? encodeOverrideCursor(last.device_id) : null,
    };
  }

  /**
   * Ends the device's override on every replica (design §3.3): it gets the next layer as a new, higher version.
   * Throws UnknownDeviceError for a device this replica does not serve; with the bus, BusPublishError.
   */
  async clear(deviceId: string): Promise<Record<string, unknown>> {
    const { state, bus } = this.options;
    if (!state.hasDevice(deviceId)) throw new UnknownDeviceError(deviceId);
    const cleared =
      bus === undefined ? state.clearOverride(deviceId) : (await bus.clearOverride(deviceId)).cleared;
    const doc = state.settingsDocument(deviceId);
    if (doc === undefined) throw new UnknownDeviceError(deviceId);
    const body = doc.body as { source: SettingsSource };
    return { device_id: deviceId, cleared, settings: { version: doc.version, source: body.source } };
  }
}

/** The layers an override hides on this replica: the device's rollout assignment, its registry settings. */
function hidden(state: Pick<LayerState, 'assignmentOf' | 'deviceRecord'>, deviceId: string): LayerRef[] {
  const assignment = state.assignmentOf(deviceId);
  return [
    ...(assignment === undefined ? [] : [{ source: 'rollout' as const, rollout_id: assignment.rolloutId }]),
    ...(state.deviceRecord(deviceId) === undefined ? [] : [{ source: 'registry' as const }]),
  ];
}
