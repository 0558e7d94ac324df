import { Encoder } from 'cbor-x';

/** Settings as the registry or an override holds them (validated against the contracts schema before use). */
export type Settings = Readonly<Record<string, unknown>>;

export type SettingsSource = 'override' | 'registry';

/** The public part of a registry record (DESIGN 3.2): no secrets, nothing but what a device may see. */
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

  constructor(
    readonly version: number,
    /** What is serialised, with keys in canonical order so equal content gives equal bytes. */
    readonly body: Readonly<Record<string, unknown>>,
    /** Canonical JSON of everything visible except `version`: two documents are the same change iff equal. */
    readonly contentKey: string,
  ) {}

  get json(): Buffer {
    return (this.jsonBytes ??= Buffer.from(JSON.stringify(this.body)));
  }

  get cbor(): Buffer {
    return (this.cborBytes ??= encodeCbor(this.body));
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

export function settingsDocument(
  deviceId: string,
  version: number,
  source: SettingsSource,
  settings: Settings,
): VisibleDocument {
  const canonicalSettings = canonical(settings) as Settings;
  const contentKey = JSON.stringify([source, canonicalSettings]);
  return new VisibleDocument(
    version,
    { device_id: deviceId, version, source, settings: canonicalSettings },
    contentKey,
  );
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
