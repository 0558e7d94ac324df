import { hash } from 'node:crypto';
import { Encoder } from 'cbor-x';

/** Settings as the registry or an override holds them (validated against the contracts schema before use). */
export type Settings = Readonly<Record<string, unknown>>;

/** Where a device's settings come from, in precedence order (design §3.3). */
export type SettingsSource = 'override' | 'rollout' | 'registry';

/** The public part of a registry record (design §3.2): no secrets, nothing but what a device may see. */
export interface DeviceRecord {
  deviceId: string;
  siteId: string;
  name: string;
  model: string;
  enabled: boolean;
  desiredSettings: Settings;
}

// cbor-x's default encoder would write numbers above 2^32 as float64 and may use its record extension;
// plain maps with minimal headers and integer versions as CBOR unsigned integers are what devices expect.
const cbor = new Encoder({ useRecords: false, variableMapSize: true });

/**
 * One immutable, versioned document a device can see. Its JSON and CBOR encodings are computed on first use
 * and cached: a reload of 100,000 rows builds documents but encodes only those somebody observes or reads.
 */
export class VisibleDocument {
  private jsonBytes: Buffer | undefined;
  private cborBytes: Buffer | undefined;
  private digest: string | undefined;

  constructor(
    readonly version: number,
    /** What is serialised, with keys in canonical order so equal content gives equal bytes. */
    readonly body: Readonly<Record<string, unknown>>,
    /** Canonical JSON of everything visible except `version`: two documents are the same change iff equal. */
    readonly contentKey: string,
    /**
     * What is known without serialising the body (settings documents): sizes (see `jsonLength` and `cborSlack`)
     * and the settings' JSON text, from which `jsonText` assembles the document's.
     */
    private readonly known?: { jsonLength: number; cborSlack: number; settingsJson?: string },
  ) {}

  get json(): Buffer {
    return (this.jsonBytes ??= Buffer.from(this.jsonText()));
  }

  /**
   * 16 hex digits of SHA-256 of `contentKey`: what replicas, which number versions each on its own clock, compare
   * to tell whether a device has the content it should (the delivery record, design §3.8). Kept per document,
   * and per content key across documents, so a fleet on the same settings costs one hash.
   */
  get contentDigest(): string {
    return (this.digest ??= contentDigestOf(this.contentKey));
  }

  /**
   * `JSON.stringify(body)`, not kept: for a settings document it is assembled from the settings' JSON text, which
   * was produced once when the settings were prepared (every notify builds one notification from it).
   */
  jsonText(): string {
    const settingsJson = this.known?.settingsJson;
    if (settingsJson === undefined) return JSON.stringify(this.body);
    const body = this.body as { device_id: string; source: SettingsSource };
    // The keys in the body's order, as JSON.stringify writes them (the sizes test checks the bytes are equal).
    return `{"device_id":${jsonString(body.device_id)},"version":${this.version},"source":"${body.source}","settings":${settingsJson}}`;
  }

  get cbor(): Buffer {
    return (this.cborBytes ??= encodeCbor(this.body));
  }

  /** Bytes of the JSON encoding, without encoding it when the size is known. */
  get jsonLength(): number {
    return this.jsonBytes?.length ?? this.known?.jsonLength ?? Buffer.byteLength(JSON.stringify(this.body));
  }

  /** `cborSlack(body)`: how much longer than the JSON the CBOR encoding can be. */
  get cborSlack(): number {
    return this.known?.cborSlack ?? cborSlack(this.body);
  }
}

/**
 * How many bytes the CBOR encoding of JSON data can exceed its JSON text by. Per value: a number takes at most
 * 9 bytes in CBOR (float64 or a 64-bit integer) and at least 1 character in JSON (+8); a string, object key or
 * array takes a header of at most 3 bytes for up to 65,535 bytes against 2 quotes or brackets in JSON (+1);
 * a map header (1-3 bytes) is never longer than its braces, colons and commas; true, false and null shrink.
 */
export function cborSlack(value: unknown): number {
  switch (typeof value) {
    case 'number':
    case 'bigint':
      return 8;
    case 'string':
      return 1;
    case 'object': {
      if (value === null) return 0;
      let slack = 0;
      if (Array.isArray(value)) {
        slack = 1;
        for (const item of value) slack += cborSlack(item);
        return slack;
      }
      // for…in rather than Object.entries: this runs for every override, and JSON data has no inherited keys.
      for (const key in value) {
        if (Object.hasOwn(value, key)) slack += 1 + cborSlack((value as Record<string, unknown>)[key]);
      }
      return slack;
    }
    case 'boolean':
    case 'undefined':
    case 'function':
    case 'symbol':
      return 0;
  }
}

function encodeCbor(body: Readonly<Record<string, unknown>>): Buffer {
  // Versions exceed 2^32; as BigInt they are written as CBOR major type 0 (exact integer), not float64.
  const withIntegers = { ...body, version: BigInt(body.version as number) };
  return cbor.encode(withIntegers);
}

/** Recursively sorts object keys; arrays keep their order. Input is JSON data (validated settings). */
export function canonical(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(canonical);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort())
      out[key] = canonical((value as Record<string, unknown>)[key]);
    return out;
  }
  return value;
}

/**
 * Settings in the form every document of them shares: canonical (sorted keys), with their JSON text and CBOR
 * slack. A reload where many devices carry the same settings object prepares it once (see GatewayState).
 */
export interface PreparedSettings {
  readonly value: Settings;
  readonly json: string;
  readonly jsonLength: number;
  readonly cborSlack: number;
}

export function prepareSettings(settings: Settings): PreparedSettings {
  const value = canonical(settings) as Settings;
  const json = JSON.stringify(value);
  return { value, json, jsonLength: Buffer.byteLength(json), cborSlack: cborSlack(value) };
}

// A settings document's JSON is `{"device_id":<id>,"version":<n>,"source":"<source>","settings":<settings>}`;
// these are the bytes around the four values.
const SETTINGS_DOCUMENT_FRAME_BYTES = Buffer.byteLength('{"device_id":,"version":,"source":,"settings":}');
// cborSlack of that body: 1 per entry plus the slack of each value (string 1, number 8, string 1, settings).
const SETTINGS_DOCUMENT_FRAME_SLACK = 1 + 1 + (1 + 8) + (1 + 1) + 1;

/**
 * The JSON length and CBOR slack of a settings document of `prepared` at `version`, without building it; both
 * sources name 8 characters, so the size does not depend on the source. With the settings' JSON text: what a
 * settings document knows without serialising its body.
 */
export function settingsDocumentSizes(
  deviceId: string,
  version: number,
  prepared: PreparedSettings,
  /** Characters of the source's name: 8 ('override', 'registry', the longest), 7 for 'rollout'. */
  sourceBytes: number = SOURCE_NAME_BYTES,
): { jsonLength: number; cborSlack: number; settingsJson: string } {
  return {
    settingsJson: prepared.json,
    jsonLength:
      SETTINGS_DOCUMENT_FRAME_BYTES +
      jsonStringBytes(deviceId) +
      decimalDigits(version) +
      sourceBytes +
      2 +
      prepared.jsonLength,
    cborSlack: SETTINGS_DOCUMENT_FRAME_SLACK + prepared.cborSlack,
  };
}

/** 'override' and 'registry' alike; 'rollout' is one shorter, so 8 bounds every source. */
const SOURCE_NAME_BYTES = 8;

/** Printable ASCII without `"` and `\`: JSON writes such a string as itself between two quotes. */
const PLAIN_JSON_STRING = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

/**
 * `Buffer.byteLength(JSON.stringify(text))` without building either for the common case (a valid device id is
 * plain): this runs for every settings document, twice per notify (profiled on the notify path).
 */
function jsonStringBytes(text: string): number {
  return PLAIN_JSON_STRING.test(text) ? text.length + 2 : Buffer.byteLength(JSON.stringify(text));
}

/** `JSON.stringify(text)`, without the call for the common plain string. */
function jsonString(text: string): string {
  return PLAIN_JSON_STRING.test(text) ? `"${text}"` : JSON.stringify(text);
}

/** `String(n).length` for a non-negative safe integer, without formatting it. */
function decimalDigits(n: number): number {
  let digits = 1;
  for (let bound = 10; n >= bound && digits < 16; bound *= 10) digits++;
  return digits;
}

const digests = new Map<string, string>();
function contentDigestOf(key: string): string {
  let h = digests.get(key);
  if (h === undefined) {
    h = hash('sha256', key, 'hex').slice(0, 16);
    if (digests.size >= 4096) digests.clear();
    digests.set(key, h);
  }
  return h;
}

export function settingsDocument(
  deviceId: string,
  version: number,
  source: SettingsSource,
  settings: Settings,
  prepared: PreparedSettings = prepareSettings(settings),
): VisibleDocument {
  // JSON.stringify([source, value]) without walking the settings again: source is a plain word.
  const contentKey = settingsContentKey(source, prepared);
  return new VisibleDocument(
    version,
    { device_id: deviceId, version, source, settings: prepared.value },
    contentKey,
    settingsDocumentSizes(deviceId, version, prepared, source.length),
  );
}

/** What two settings documents compare by (`VisibleDocument.contentKey`), from the prepared settings. */
export function settingsContentKey(source: SettingsSource, prepared: PreparedSettings): string {
  return `["${source}",${prepared.json}]`;
}

export function recordDocument(record: DeviceRecord, version: number): VisibleDocument {
  const contentKey = JSON.stringify([record.siteId, record.name, record.model, record.enabled]);
  return new VisibleDocument(
    version,
    {
      device_id: record.deviceId,
      site_id: record.siteId,
      name: record.name,
      model: record.model,
      enabled: record.enabled,
      version,
    },
    contentKey,
  );
}

/**
 * RFC 7396 (JSON Merge Patch) §2, MergePatch(Target, Patch), as the RFC writes it:
 *
 *     if Patch is an Object:
 *       if Target is not an Object:
 *         Target = {} # Ignore the contents and set it to an empty Object
 *       for each Name/Value pair in Patch:
 *         if Value is null:
 *           if Name exists in Target:
 *             remove the Name/Value pair from Target
 *         else:
 *           Target[Name] = MergePatch(Target[Name], Value)
 *       return Target
 *     else:
 *       return Patch
 *
 * Pure: neither argument is changed; an object of the patch is rebuilt (its `null` members dropped, §2's recursion
 * into a missing or non-object target, Appendix A's `{"a":{"bb":{"ccc":null}}}` into `{}`). Arrays are values,
 * replaced whole (only objects merge). Members are defined, not assigned, so a name such as `__proto__` stays a
 * member and never reaches a prototype. A rollout's settings patch (design §3.9) is merged with this into each
 * device's settings; RFC 7396's Appendix A is the test (test/rollout-patch-merge.test.ts).
 */
export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isJsonObject(patch)) return patch;
  const result: Record<string, unknown> = isJsonObject(target) ? { ...target } : {};
  for (const name of Object.keys(patch)) {
    const value = patch[name];
    if (value === null) delete result[name];
    else {
      const merged = mergePatch(Object.hasOwn(result, name) ? result[name] : undefined, value);
      Object.defineProperty(result, name, {
        value: merged,
        enumerable: true,
        writable: true,
        configurable: true,
      });
    }
  }
  return result;
}

function isJsonObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
