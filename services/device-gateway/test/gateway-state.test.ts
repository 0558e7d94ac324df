// Reload change detection (the fast paths of GatewayState.replaceRegistry): equal content keeps its documents and
// versions whatever the key order, a change issues versions only for the documents that changed, and the size
// check still rejects a row whose document cannot fit one datagram.
import { cborSlack, canonical, settingsDocument } from '../src/domain/documents.js';
import type { DeviceChange } from '../src/domain/gateway-state.js';
import { device, newState } from './support/harness.js';

describe('GatewayState.replaceRegistry change detection', () => {
  it('keeps documents and versions of rows whose content is equal, in any key order', () => {
    const state = newState();
    const changes: DeviceChange[][] = [];
    state.onChange((c) => changes.push(c));
    state.replaceRegistry([
      device('d1', { desiredSettings: { reporting_interval_s: 60, telemetry_enabled: true } }),
    ]);
    const settings = state.settingsDocument('d1')!;
    const record = state.recordDocument('d1')!;
    state.replaceRegistry([
      device('d1', { desiredSettings: { telemetry_enabled: true, reporting_interval_s: 60 } }),
    ]);
    expect(state.settingsDocument('d1')).toBe(settings);
    expect(state.recordDocument('d1')).toBe(record);
    expect(changes).toHaveLength(0);
  });

  it('issues a new version only for the document that changed', () => {
    const state = newState();
    state.replaceRegistry([device('d1'), device('d2')]);
    const before = { s: state.settingsDocument('d1')!, r: state.recordDocument('d1')! };
    const changes: DeviceChange[][] = [];
    state.onChange((c) => changes.push(c));
    const summary = state.replaceRegistry([
      device('d1', { desiredSettings: { reporting_interval_s: 61 } }),
      device('d2', { name: 'Renamed' }),
    ]);
    expect(summary.changed).toBe(2);
    expect(state.settingsDocument('d1')!.version).toBeGreaterThan(before.s.version);
    expect(state.recordDocument('d1')).toBe(before.r);
    expect(changes).toEqual([
      [
        { deviceId: 'd1', settings: true, record: false, removed: false },
        { deviceId: 'd2', settings: false, record: true, removed: false },
      ],
    ]);
  });

  it('rejects a row whose settings document would not fit one datagram, and one with invalid settings', () => {
    const state = newState();
    const thresholds: Record<string, { min: number; max: number }> = {};
    for (let i = 0; i < 16; i++)
      thresholds[`threshold_${String(i).padStart(2, '0')}_${'x'.repeat(18)}`] = {
        min: -1.2345678901234567e300,
        max: 1.2345678901234567e300,
      };
    const summary = state.replaceRegistry([
      device('big', { desiredSettings: { thresholds } }),
      device('bad', { desiredSettings: { reporting_interval_s: 1 } }),
      device('ok'),
    ]);
    expect(summary.rejected.map((r) => r.deviceId).sort()).toEqual(['bad', 'big']);
    expect(summary.rejected.find((r) => r.deviceId === 'big')!.reason).toMatch(/at most \d+/);
    expect(state.settingsDocument('big')).toBeUndefined();
    expect(state.settingsDocument('ok')).toBeDefined();
  });
});

describe('settings documents: sizes known without encoding', () => {
  // The size check of a reload uses these instead of serialising every document; they must be exact.
  it.each([
    ['plain', 'acme-hq-hvac-01', 'registry', { reporting_interval_s: 60 }],
    ['empty settings', 'd', 'override', {}],
    [
      'nested, unsorted, non-ASCII',
      'x.y:z-1_2',
      'registry',
      { timezone: 'Europe/Zürich', a: { z: [1, 2.5, -3e300], b: 'ü€' } },
    ],
    ['longest id', 'd'.repeat(128), 'override', { maintenance_mode: true, firmware_channel: 'beta' }],
    ['id JSON must escape', 'a"b\\c', 'registry', { note: 'line\nbreak "quoted"' }],
  ] as const)('%s', (_name, deviceId, source, settings) => {
    for (const version of [1, 1_700_000_000_000_123, Number.MAX_SAFE_INTEGER]) {
      const doc = settingsDocument(deviceId, version, source, settings);
      expect(doc.jsonLength).toBe(Buffer.byteLength(JSON.stringify(doc.body)));
      // Assembled from the settings' JSON, the text is JSON.stringify's, byte for byte.
      expect(doc.jsonText()).toBe(JSON.stringify(doc.body));
      expect(doc.cborSlack).toBe(cborSlack(doc.body));
      expect(doc.contentKey).toBe(JSON.stringify([source, canonical(settings)]));
      // The cached encoding, once built, is what jsonLength reports.
      expect(doc.json.length).toBe(doc.jsonLength);
      expect(doc.cbor.length).toBeLessThanOrEqual(doc.jsonLength + doc.cborSlack);
    }
  });

  it('devices sharing one settings object get equal, separately versioned documents', () => {
    const state = newState();
    const shared = { reporting_interval_s: 120, telemetry_enabled: true };
    state.replaceRegistry([
      device('a', { desiredSettings: shared }),
      device('b', { desiredSettings: shared }),
    ]);
    const [a, b] = [state.settingsDocument('a')!, state.settingsDocument('b')!];
    expect(a.body.settings).toEqual(b.body.settings);
    expect(a.body.device_id).toBe('a');
    expect(b.body.device_id).toBe('b');
    expect(a.version).not.toBe(b.version);
    // A shared object that is invalid rejects every row that holds it.
    const invalid = { reporting_interval_s: 1 };
    const summary = state.replaceRegistry([
      device('a', { desiredSettings: invalid }),
      device('b', { desiredSettings: invalid }),
    ]);
    expect(summary.rejected.map((r) => r.deviceId)).toEqual(['a', 'b']);
  });

  it("hands the settings listener the device's own ref, kept across reloads (the delivery recorder's slot)", () => {
    const state = newState();
    const seen: { deviceId: string; slot: number }[] = [];
    let next = 0;
    state.onSettings((record, _doc, ref) => {
      seen.push({ deviceId: record.deviceId, slot: ref.deliverySlot });
      if (ref.deliverySlot < 0) ref.deliverySlot = next++;
    });
    state.replaceRegistry([device('d1'), device('d2')]);
    // Both settings change: each device's event carries the number its first event left on it.
    state.replaceRegistry([
      device('d1', { desiredSettings: { reporting_interval_s: 61 } }),
      device('d2', { desiredSettings: { reporting_interval_s: 61 } }),
    ]);
    expect(seen).toEqual([
      { deviceId: 'd1', slot: -1 },
      { deviceId: 'd2', slot: -1 },
      { deviceId: 'd1', slot: 0 },
      { deviceId: 'd2', slot: 1 },
    ]);
  });
});
