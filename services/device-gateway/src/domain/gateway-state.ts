import { isDeviceId } from '@platform/contracts';
import {
  prepareSettings,
  recordDocument,
  settingsContentKey,
  settingsDocument,
  settingsDocumentSizes,
  type DeviceRecord,
  type PreparedSettings,
  type Settings,
  type SettingsSource,
  type VisibleDocument,
} from './documents.js';
import type { VersionClock } from './version-clock.js';

export class UnknownDeviceError extends Error {
  constructor(readonly deviceId: string) {
    super(`device ${deviceId} is unknown or disabled`);
    this.name = 'UnknownDeviceError';
  }
}

/** The settings document would not fit one CoAP datagram (design §3.3): rejected, never truncated. */
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

/**
 * `ref`: the device's entry, on which the listener may keep a number of its own across reloads (the delivery
 * recorder's slot, a DeliveryRef: design §3.8), so the event needs no map lookup.
 */
export type SettingsListener = (
  record: DeviceRecord,
  doc: VisibleDocument,
  ref: { deliverySlot: number },
) => void;

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

/**
 * An override checked once and prepared once (canonical settings, their JSON and size bounds): what the edge
 * hands on after validation, and what replicas apply. Built by `GatewayState.prepareOverride`.
 */
export interface Override {
  readonly deviceId: string;
  readonly settings: PreparedSettings;
  /** `contentKey` of every settings document of this override. */
  readonly contentKey: string;
}

/**
 * What a rollout assigned one device (design §3.9): served between a development override and the registry's
 * settings (precedence, design §3.3). Prepared once, like an override.
 */
export interface Assignment {
  readonly deviceId: string;
  readonly rolloutId: string;
  readonly settings: PreparedSettings;
  readonly contentKey: string;
}

interface Entry {
  record: DeviceRecord;
  recordDoc: VisibleDocument;
  settingsDoc: VisibleDocument;
  /** The settings listener's number for the device (the delivery recorder's slot; -1: none), kept across reloads. */
  deliverySlot: number;
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
  private readonly overrides = new Map<string, Override>();
  /** Rollout assignments, also of devices not (yet) visible: they apply when the device is. */
  private readonly assignments = new Map<string, Assignment>();
  private readonly listeners: ((changes: DeviceChange[]) => void)[] = [];
  private settingsListener: SettingsListener | undefined;
  private loadedOnce = false;
  /**
   * What a registry settings object was found to be: its prepared form and its validation problem (if any).
   * Settings are immutable, and loadRegistry hands devices with equal settings one shared object, so a reload
   * of many devices on the same settings validates and canonicalises them once. Weak: an object no registry
   * row holds any more is forgotten with it.
   */
  private readonly settingsFacts = new WeakMap<
    Settings,
    { prepared: PreparedSettings; problem: string | undefined }
  >();

  constructor(private readonly options: GatewayStateOptions) {}

  private factsOf(settings: Settings): { prepared: PreparedSettings; problem: string | undefined } {
    let facts = this.settingsFacts.get(settings);
    if (facts === undefined) {
      let problem: string | undefined;
      if (Object.keys(settings).length > 0) {
        const result = this.options.validateSettings(settings);
        if (!result.ok)
          problem = `desired_settings invalid: ${result.errors.map((e) => `${e.path || '/'} ${e.message}`).join('; ')}`;
      }
      facts = { prepared: prepareSettings(settings), problem };
      this.settingsFacts.set(settings, facts);
    }
    return facts;
  }

  get loaded(): boolean {
    return this.loadedOnce;
  }

  get deviceCount(): number {
    return this.entries.size;
  }

  get overrideCount(): number {
    return this.overrides.size;
  }

  get assignmentCount(): number {
    return this.assignments.size;
  }

  /** The rollout assignment this replica holds for the device (served unless an override wins). */
  assignmentOf(deviceId: string): Assignment | undefined {
    return this.assignments.get(deviceId);
  }

  onChange(listener: (changes: DeviceChange[]) => void): void {
    this.listeners.push(listener);
  }

  /**
   * Called with every settings document a device is given: each device's at the first load and when it enters
   * the registry, and every new one after (a reload or an override). The delivery record's `desired` (§3.8).
   */
  onSettings(listener: SettingsListener): void {
    this.settingsListener = listener;
  }

  /** The device's public registry record (visible devices only). */
  deviceRecord(deviceId: string): DeviceRecord | undefined {
    return this.entries.get(deviceId)?.record;
  }

  settingsDocument(deviceId: string): VisibleDocument | undefined {
    return this.entries.get(deviceId)?.settingsDoc;
  }

  recordDocument(deviceId: string): VisibleDocument | undefined {
    return this.entries.get(deviceId)?.recordDoc;
  }

  /**
   * Replaces the whole registry. Builds the new map aside and swaps it in one assignment, so readers never see
   * a half-loaded registry. Unchanged documents keep their version; changed ones get a new one.
   * Cost (a reload of 100,000 rows must take under a second): a row equal to the one loaded before keeps its
   * entry without any check or allocation (it was checked when it first came); a changed row is validated,
   * and only the documents that changed are built; sizes are checked without encoding CBOR (`widestWithin`).
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
      const previous = old.get(record.deviceId);
      if (previous !== undefined && samePublicRecord(previous.record, record)) {
        if (sameJson(previous.record.desiredSettings, record.desiredSettings)) {
          next.set(record.deviceId, previous);
          continue;
        }
      }
      // Precedence (design §3.3): development override > rollout assignment > registry.
      const override = this.overrides.get(record.deviceId);
      const assignment = override === undefined ? this.assignments.get(record.deviceId) : undefined;
      const chosen = override ?? assignment;
      const source: SettingsSource =
        override !== undefined ? 'override' : assignment !== undefined ? 'rollout' : 'registry';
      const settings = chosen?.settings.value ?? record.desiredSettings;
      const recordChanged = previous === undefined || !samePublicRecord(previous.record, record);
      const settingsChanged =
        previous === undefined ||
        previous.settingsDoc.body.source !== source ||
        !sameJson(previous.settingsDoc.body.settings, settings);
      // Built before the checks so the size checks measure them (a rejected row only skips a version number).
      const recordDoc = recordChanged
        ? recordDocument(record, this.options.clock.next())
        : previous.recordDoc;
      const settingsDoc = settingsChanged
        ? settingsDocument(
            record.deviceId,
            this.options.clock.next(),
            source,
            settings,
            chosen?.settings ?? this.factsOf(settings).prepared,
          )
        : previous.settingsDoc;
      const problem = this.checkRecord(
        record,
        recordChanged ? recordDoc : undefined,
        settingsChanged && chosen === undefined ? settingsDoc : undefined,
      );
      if (problem !== undefined) {
        rejected.push({ deviceId: record.deviceId, reason: problem });
        continue;
      }
      const entry: Entry = {
        record,
        recordDoc,
        settingsDoc,
        deliverySlot: previous === undefined ? -1 : previous.deliverySlot,
      };
      next.set(record.deviceId, entry);
      if (previous === undefined || settingsChanged || recordChanged)
        this.settingsListener?.(record, settingsDoc, entry);
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

  hasDevice(deviceId: string): boolean {
    return this.entries.has(deviceId);
  }

  /**
   * Checks an override's size (it must fit one datagram, design §3.3) and prepares it: the only place its
   * settings are canonicalised. The settings must be valid Device Settings already (checked at the edge, or on
   * arrival from another replica). Does not look at the registry: see `hasDevice`, `applyOverride`.
   */
  prepareOverride(deviceId: string, settings: Settings): Override {
    const prepared = prepareSettings(settings);
    this.assertSettingsFit(deviceId, prepared);
    return { deviceId, settings: prepared, contentKey: settingsContentKey('override', prepared) };
  }

  /**
   * Stores an in-memory override that replaces (never merges with) the registry settings. Returns whether
   * anything visible changed; an identical override issues no new version and no notification.
   */
  applyOverride(
    override: Override,
    /**
     * A version stamped by the replica that accepted the override (design §3.6): used as is when it is above the
     * device's current version, so every replica shows the same version for the same override; otherwise
     * (this replica already issued a higher one, e.g. in a reload) a fresh local version.
     */
    stampedVersion?: number,
  ): { changed: boolean; document: VisibleDocument } {
    const deviceId = override.deviceId;
    const entry = this.entries.get(deviceId);
    if (entry === undefined) throw new UnknownDeviceError(deviceId);
    this.overrides.set(deviceId, override);
    if (override.contentKey === entry.settingsDoc.contentKey)
      return { changed: false, document: entry.settingsDoc };
    let version: number;
    // A stamp the clock refuses (out of step, see VersionClock.observe) is not served: a fresh local version is.
    if (
      stampedVersion !== undefined &&
      stampedVersion > entry.settingsDoc.version &&
      this.options.clock.observe(stampedVersion)
    ) {
      version = stampedVersion;
    } else version = this.options.clock.next();
    const document = settingsDocument(
      deviceId,
      version,
      'override',
      override.settings.value,
      override.settings,
    );
    entry.settingsDoc = document;
    this.settingsListener?.(entry.record, document, entry);
    this.emit([{ deviceId, settings: true, record: false, removed: false }]);
    return { changed: true, document };
  }

  /**
   * Prepares a rollout's settings for a device (valid Device Settings, checked by the caller). Throws
   * DocumentTooLargeError when its document would not fit one datagram.
   */
  prepareAssignment(
    deviceId: string,
    rolloutId: string,
    settings: Settings,
    /** The same settings prepared for another device already (a wave shares one document). */
    preparedBefore?: PreparedSettings,
  ): Assignment {
    const prepared = preparedBefore ?? prepareSettings(settings);
    this.assertSettingsFit(deviceId, prepared);
    return { deviceId, rolloutId, settings: prepared, contentKey: settingsContentKey('rollout', prepared) };
  }

  /**
   * Sets (an Assignment) or removes (a device id) rollout assignments, and gives every visible device whose
   * effective settings changed a new document under a new version, in one change set: a wave of thousands is
   * one fan-out. A device under a development override keeps it (the assignment waits underneath). A removal
   * returns the device to the registry's settings, as a new, higher version.
   */
  applyAssignments(updates: readonly (Assignment | string)[]): number {
    const changes: DeviceChange[] = [];
    for (const update of updates) {
      const deviceId = typeof update === 'string' ? update : update.deviceId;
      if (typeof update === 'string') this.assignments.delete(deviceId);
      else this.assignments.set(deviceId, update);
      const entry = this.entries.get(deviceId);
      if (entry === undefined || this.overrides.has(deviceId)) continue;
      const document =
        typeof update === 'string'
          ? this.registryDocument(entry)
          : update.contentKey === entry.settingsDoc.contentKey
            ? undefined
            : settingsDocument(
                deviceId,
                this.options.clock.next(),
                'rollout',
                update.settings.value,
                update.settings,
              );
      if (document === undefined) continue;
      entry.settingsDoc = document;
      this.settingsListener?.(entry.record, document, entry);
      changes.push({ deviceId, settings: true, record: false, removed: false });
    }
    this.emit(changes);
    return changes.length;
  }

  /** The registry's settings document for an entry, or undefined when it serves that content already. */
  private registryDocument(entry: Entry): VisibleDocument | undefined {
    const settings = entry.record.desiredSettings;
    const prepared = this.factsOf(settings).prepared;
    if (settingsContentKey('registry', prepared) === entry.settingsDoc.contentKey) return undefined;
    return settingsDocument(entry.record.deviceId, this.options.clock.next(), 'registry', settings, prepared);
  }

  /** `prepareOverride` then `applyOverride`: an override accepted by this process alone. */
  setOverride(deviceId: string, settings: Settings): { changed: boolean; document: VisibleDocument } {
    if (!this.hasDevice(deviceId)) throw new UnknownDeviceError(deviceId);
    return this.applyOverride(this.prepareOverride(deviceId, settings));
  }

  /** The development override this replica serves the device, if any (design §3.3). */
  overrideOf(deviceId: string): Override | undefined {
    return this.overrides.get(deviceId);
  }

  /** The devices holding an override here, in no order. */
  overrideIds(): IterableIterator<string> {
    return this.overrides.keys();
  }

  /**
   * Ends the device's override (design §3.3): it is served the next layer, its rollout assignment or else the
   * registry's settings, as a new document. `stampedVersion`: the clear's version from the bus (cluster/bus.ts),
   * used as `applyOverride` uses an override's, so every replica shows the same version; it is above the
   * override's. Returns whether the device had an override here.
   */
  clearOverride(deviceId: string, stampedVersion?: number): boolean {
    if (!this.overrides.delete(deviceId)) return false;
    const entry = this.entries.get(deviceId);
    if (entry === undefined) return true;
    const assignment = this.assignments.get(deviceId);
    const prepared = assignment?.settings ?? this.factsOf(entry.record.desiredSettings).prepared;
    const version =
      stampedVersion !== undefined &&
      stampedVersion > entry.settingsDoc.version &&
      this.options.clock.observe(stampedVersion)
        ? stampedVersion
        : this.options.clock.next();
    const document = settingsDocument(
      deviceId,
      version,
      assignment === undefined ? 'registry' : 'rollout',
      prepared.value,
      prepared,
    );
    entry.settingsDoc = document;
    this.settingsListener?.(entry.record, document, entry);
    this.emit([{ deviceId, settings: true, record: false, removed: false }]);
    return true;
  }

  /**
   * Why a registry row cannot be served, if it cannot. `recordDoc` / `registrySettingsDoc`: the row's documents
   * when they were just built from it (their size is measured directly); absent, an unchanged document (it fit
   * when built) or, for the settings under an override, a probe built from the registry's settings.
   */
  private checkRecord(
    record: DeviceRecord,
    recordDoc?: VisibleDocument,
    registrySettingsDoc?: VisibleDocument,
  ): string | undefined {
    if (!isDeviceId(record.deviceId)) return 'device_id is not 1-128 characters of [A-Za-z0-9._:-]';
    const settings = record.desiredSettings;
    const facts = this.factsOf(settings);
    if (facts.problem !== undefined) return facts.problem;
    const limit = this.options.maxDocumentBytes;
    try {
      if (registrySettingsDoc === undefined) this.assertSettingsFit(record.deviceId, facts.prepared);
      else {
        // 'registry' and 'override' are both 8 characters: the document's size does not depend on its source.
        const size = widestWithin(registrySettingsDoc, limit, () =>
          settingsDocument(record.deviceId, Number.MAX_SAFE_INTEGER, 'override', settings, facts.prepared),
        );
        if (size > limit) throw new DocumentTooLargeError(size, limit);
      }
      if (recordDoc !== undefined) {
        const recordSize = widestWithin(recordDoc, limit, () =>
          recordDocument(record, Number.MAX_SAFE_INTEGER),
        );
        if (recordSize > limit) return `record document too large (${recordSize} bytes)`;
      }
    } catch (err) {
      if (err instanceof DocumentTooLargeError) return err.message;
      throw err;
    }
    return undefined;
  }

  /**
   * Throws DocumentTooLargeError unless every settings document of `prepared` (at the largest version, in
   * either format) fits one datagram. Decided from the sizes alone: a document is built only when the bound
   * comes near the limit.
   */
  private assertSettingsFit(deviceId: string, prepared: PreparedSettings): void {
    const limit = this.options.maxDocumentBytes;
    const sizes = settingsDocumentSizes(deviceId, Number.MAX_SAFE_INTEGER, prepared);
    if (sizes.jsonLength + sizes.cborSlack <= limit) return;
    const size = widest(
      settingsDocument(deviceId, Number.MAX_SAFE_INTEGER, 'override', prepared.value, prepared),
    );
    if (size > limit) throw new DocumentTooLargeError(size, limit);
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

/** Digits of Number.MAX_SAFE_INTEGER: the longest version a document can carry in JSON. */
const MAX_VERSION_DIGITS = 16;

/**
 * The size of `doc`'s larger encoding at the largest version, `widest(atMaxVersion())`, when that is above
 * `limit`; otherwise some size at most `limit`. Avoids encoding CBOR (and caching either encoding in the
 * document) for documents far from the limit, which is every document of a normal reload: the JSON length is
 * taken with the version widened to 16 digits, and CBOR is bounded from it by `cborSlack`.
 */
function widestWithin(doc: VisibleDocument, limit: number, atMaxVersion: () => VisibleDocument): number {
  const json = doc.jsonLength + MAX_VERSION_DIGITS - String(doc.version).length;
  if (json + doc.cborSlack <= limit) return json;
  return widest(atMaxVersion());
}

/** What a device sees of a record besides its settings (the fields of its record document). */
function samePublicRecord(a: DeviceRecord, b: DeviceRecord): boolean {
  return a.siteId === b.siteId && a.name === b.name && a.model === b.model && a.enabled === b.enabled;
}

/** Deep equality of JSON data, key order ignored: what `canonical` + JSON.stringify compare, without allocating. */
function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameJson(a[i], b[i])) return false;
    return true;
  }
  const ra = a as Record<string, unknown>;
  const rb = b as Record<string, unknown>;
  let count = 0;
  for (const key in ra) {
    if (!Object.hasOwn(ra, key)) continue;
    if (!Object.hasOwn(rb, key) || !sameJson(ra[key], rb[key])) return false;
    count++;
  }
  for (const key in rb) if (Object.hasOwn(rb, key)) count--;
  return count === 0;
}
