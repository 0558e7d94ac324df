import {
  recordDocument,
  settingsDocument,
  type DeviceRecord,
  type Settings,
  type SettingsSource,
  type VisibleDocument,
} from './documents.js';
import type { VersionClock } from './version-clock.js';

/** A device id as DESIGN 3.2 defines it. */
export const DEVICE_ID_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;

export class UnknownDeviceError extends Error {
  constructor(readonly deviceId: string) {
    super(`device ${deviceId} is unknown or disabled`);
    this.name = 'UnknownDeviceError';
  }
}

/** The settings document would not fit one CoAP datagram (DESIGN 3.3): rejected, never truncated. */
export class DocumentTooLargeError extends Error {
  constructor(
    readonly encodedBytes: number,
    readonly limitBytes: number,
  ) {
    super(
      `the settings document would take ${encodedBytes} bytes; one CoAP datagram carries at most ${limitBytes}`,
    );
    this.name = 'DocumentTooLargeError';
  }
}

/** What a reload or override changed for one device. `removed`: the device is no longer visible. */
export interface DeviceChange {
  deviceId: string;
  settings: boolean;
  record: boolean;
  removed: boolean;
}

export interface RejectedRecord {
  deviceId: string;
  reason: string;
}

export interface ReloadSummary {
  devices: number;
  visible: number;
  changed: number;
  removed: number;
  rejected: RejectedRecord[];
}

export type SettingsValidator = (
  data: unknown,
) => { ok: true } | { ok: false; errors: { path: string; message: string }[] };

interface Entry {
  record: DeviceRecord;
  recordDoc: VisibleDocument;
  settingsDoc: VisibleDocument;
}

export interface GatewayStateOptions {
  clock: VersionClock;
  /** Largest encoded document (JSON or CBOR) one notification can carry, in bytes. */
  maxDocumentBytes: number;
  /** The contracts' Device Settings validator (registry rows may also hold `{}`). */
  validateSettings: SettingsValidator;
}

/**
 * The registry as devices see it: visible (enabled, valid) devices, their in-memory overrides and the
 * versioned documents served over CoAP. Transport free: the CoAP edge subscribes to changes.
 */
export class GatewayState {
  private entries = new Map<string, Entry>();
  private sortedIds: string[] = [];
  private readonly overrides = new Map<string, Settings>();
  private readonly listeners: ((changes: DeviceChange[]) => void)[] = [];
  private loadedOnce = false;

  constructor(private readonly options: GatewayStateOptions) {}

  get loaded(): boolean {
    return this.loadedOnce;
  }

  get deviceCount(): number {
    return this.entries.size;
  }

  get overrideCount(): number {
    return this.overrides.size;
  }

  onChange(listener: (changes: DeviceChange[]) => void): void {
    this.listeners.push(listener);
  }

  settingsDocument(deviceId: string): VisibleDocument | undefined {
    return this.entries.get(deviceId)?.settingsDoc;
  }

  recordDocument(deviceId: string): VisibleDocument | undefined {
    return this.entries.get(deviceId)?.recordDoc;
  }

  /** Visible device ids starting with `prefix`, in order, at most `limit` (binary search: no full scan). */
  deviceIdsWithPrefix(prefix: string, limit: number): string[] {
    const ids = this.sortedIds;
    let lo = 0;
    let hi = ids.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (ids[mid]! < prefix) lo = mid + 1;
      else hi = mid;
    }
    const out: string[] = [];
    for (let i = lo; i < ids.length && out.length < limit && ids[i]!.startsWith(prefix); i++)
      out.push(ids[i]!);
    return out;
  }

  /**
   * Replaces the whole registry. Builds the new map aside and swaps it in one assignment, so readers never see
   * a half-loaded registry. Unchanged documents keep their version; changed ones get a new one.
   */
  replaceRegistry(records: readonly DeviceRecord[]): ReloadSummary {
    const old = this.entries;
    const next = new Map<string, Entry>();
    const changes: DeviceChange[] = [];
    const rejected: RejectedRecord[] = [];
    let devices = 0;
    for (const record of records) {
      devices++;
      if (!record.enabled) continue;
      const problem = this.checkRecord(record);
      if (problem !== undefined) {
        rejected.push({ deviceId: record.deviceId, reason: problem });
        continue;
      }
      const previous = old.get(record.deviceId);
      const override = this.overrides.get(record.deviceId);
      const source: SettingsSource = override === undefined ? 'registry' : 'override';
      const settings = override ?? record.desiredSettings;
      let recordDoc = recordDocument(record, 0);
      let settingsDoc = settingsDocument(record.deviceId, 0, source, settings);
      const recordChanged = previous === undefined || previous.recordDoc.contentKey !== recordDoc.contentKey;
      const settingsChanged =
        previous === undefined || previous.settingsDoc.contentKey !== settingsDoc.contentKey;
      recordDoc = recordChanged ? recordDocument(record, this.options.clock.next()) : previous.recordDoc;
      settingsDoc = settingsChanged
        ? settingsDocument(record.deviceId, this.options.clock.next(), source, settings)
        : previous.settingsDoc;
      next.set(record.deviceId, { record, recordDoc, settingsDoc });
      if (previous !== undefined && (recordChanged || settingsChanged)) {
        changes.push({
          deviceId: record.deviceId,
          settings: settingsChanged,
          record: recordChanged,
          removed: false,
        });
      }
    }
    for (const deviceId of old.keys()) {
      if (!next.has(deviceId)) changes.push({ deviceId, settings: true, record: true, removed: true });
    }
    for (const deviceId of this.overrides.keys()) {
      if (!next.has(deviceId)) this.overrides.delete(deviceId);
    }
    this.entries = next;
    this.sortedIds = [...next.keys()].sort();
    this.loadedOnce = true;
    this.emit(changes);
    return {
      devices,
      visible: next.size,
      changed: changes.filter((c) => !c.removed).length,
      removed: changes.filter((c) => c.removed).length,
      rejected,
    };
  }

  /**
   * Stores an in-memory override that replaces (never merges with) the registry settings. Returns whether
   * anything visible changed; an identical override issues no new version and no notification.
   */
  setOverride(
    deviceId: string,
    settings: Settings,
    /**
     * A version stamped by the replica that accepted the override (issue 8): used as is when it is above the
     * device's current version, so every replica shows the same version for the same override; otherwise
     * (this replica already issued a higher one, e.g. in a reload) a fresh local version.
     */
    stampedVersion?: number,
  ): { changed: boolean; document: VisibleDocument } {
    const entry = this.entries.get(deviceId);
    if (entry === undefined) throw new UnknownDeviceError(deviceId);
    this.assertFits(deviceId, 'override', settings);
    const candidate = settingsDocument(deviceId, 0, 'override', settings);
    if (candidate.contentKey === entry.settingsDoc.contentKey) {
      this.overrides.set(deviceId, settings);
      return { changed: false, document: entry.settingsDoc };
    }
    let version: number;
    if (stampedVersion !== undefined && stampedVersion > entry.settingsDoc.version) {
      this.options.clock.observe(stampedVersion);
      version = stampedVersion;
    } else version = this.options.clock.next();
    const document = settingsDocument(deviceId, version, 'override', settings);
    this.overrides.set(deviceId, settings);
    entry.settingsDoc = document;
    this.emit([{ deviceId, settings: true, record: false, removed: false }]);
    return { changed: true, document };
  }

  /** Throws what setOverride would throw (unknown device, too large) without changing anything. */
  checkOverride(deviceId: string, settings: Settings): void {
    if (!this.entries.has(deviceId)) throw new UnknownDeviceError(deviceId);
    this.assertFits(deviceId, 'override', settings);
  }

  private checkRecord(record: DeviceRecord): string | undefined {
    if (!DEVICE_ID_PATTERN.test(record.deviceId))
      return 'device_id is not 1-128 characters of [A-Za-z0-9._:-]';
    const settings = record.desiredSettings;
    if (Object.keys(settings).length > 0) {
      const result = this.options.validateSettings(settings);
      if (!result.ok) {
        return `desired_settings invalid: ${result.errors.map((e) => `${e.path || '/'} ${e.message}`).join('; ')}`;
      }
    }
    try {
      this.assertFits(record.deviceId, 'override', settings);
      const recordSize = widest(recordDocument(record, Number.MAX_SAFE_INTEGER));
      if (recordSize > this.options.maxDocumentBytes)
        return `record document too large (${recordSize} bytes)`;
    } catch (err) {
      if (err instanceof DocumentTooLargeError) return err.message;
      throw err;
    }
    return undefined;
  }

  /** Checks the widest form of the settings document ('override' is the longer source name). */
  private assertFits(deviceId: string, source: SettingsSource, settings: Settings): void {
    const size = widest(settingsDocument(deviceId, Number.MAX_SAFE_INTEGER, source, settings));
    if (size > this.options.maxDocumentBytes)
      throw new DocumentTooLargeError(size, this.options.maxDocumentBytes);
  }

  private emit(changes: DeviceChange[]): void {
    if (changes.length === 0) return;
    for (const listener of this.listeners) listener(changes);
  }
}

/** Bytes of the larger encoding: CBOR can exceed JSON (a float such as 1.5 takes 9 bytes in CBOR, 3 in JSON). */
function widest(doc: VisibleDocument): number {
  return Math.max(doc.json.length, doc.cbor.length);
}
