import {
  isDeviceId,
  validateGatewayOkResponse,
  validateGatewayReloadedResponse,
  validateGatewayUpdatedResponse,
  validateNotifySettingsRequest,
  validateSettingsDocument,
  type Validator,
} from '@platform/contracts';
import { errorsOf, pathsOf } from './helpers.js';

describe('notify-settings request', () => {
  it('accepts a device id and Device Settings', () => {
    const body = { device_id: 'acme-hq-hvac-01', settings: { reporting_interval_s: 60, timezone: 'UTC' } };
    expect(validateNotifySettingsRequest(body)).toEqual({ ok: true, value: body });
  });

  it.each(['a', 'A.b_c:d-e', '0'.repeat(128), 'urn:dev:mac:0024befffe804ff1'])(
    'accepts the device id %j',
    (id) => {
      expect(isDeviceId(id)).toBe(true);
      expect(validateNotifySettingsRequest({ device_id: id, settings: { maintenance_mode: true } }).ok).toBe(
        true,
      );
    },
  );

  it.each(['', 'has space', 'slash/inside', 'ümlaut', '0'.repeat(129), 'semi;colon', 'new\nline'])(
    'rejects the device id %j at /device_id',
    (id) => {
      expect(isDeviceId(id)).toBe(false);
      expect(
        pathsOf(validateNotifySettingsRequest({ device_id: id, settings: { maintenance_mode: true } })),
      ).toEqual(['/device_id']);
    },
  );

  it('rejects a non-string device id', () => {
    expect(isDeviceId(42)).toBe(false);
    expect(
      pathsOf(validateNotifySettingsRequest({ device_id: 42, settings: { maintenance_mode: true } })),
    ).toEqual(['/device_id']);
  });

  it('names missing members at their own path', () => {
    expect(errorsOf(validateNotifySettingsRequest({}))).toEqual([
      { path: '/device_id', message: 'is required' },
      { path: '/settings', message: 'is required' },
    ]);
  });

  it('validates the settings with their paths below /settings', () => {
    const result = validateNotifySettingsRequest({
      device_id: 'd1',
      settings: { timezone: 'Mars/Phobos', thresholds: { temp_c: { min: 5, max: 1 } }, colour: 'red' },
    });
    expect(pathsOf(result).sort()).toEqual([
      '/settings/colour',
      '/settings/thresholds/temp_c/min',
      '/settings/timezone',
    ]);
  });

  it('rejects empty settings and extra members', () => {
    expect(errorsOf(validateNotifySettingsRequest({ device_id: 'd1', settings: {}, force: true }))).toEqual([
      { path: '/force', message: 'is not an allowed property' },
      { path: '/settings', message: 'must have at least one property' },
    ]);
  });
});

describe('gateway success responses', () => {
  it.each<{ status: string; validate: Validator<{ status: string }> }>([
    { status: 'ok', validate: validateGatewayOkResponse },
    { status: 'reloaded', validate: validateGatewayReloadedResponse },
  ])('accept exactly {"status": "$status"}', ({ validate, status }) => {
    expect(validate({ status }).ok).toBe(true);
    expect(errorsOf(validate({ status: 'other' }))).toEqual([
      { path: '/status', message: `must be "${status}"` },
    ]);
    expect(pathsOf(validate({ status, extra: 1 }))).toEqual(['/extra']);
    expect(pathsOf(validate({}))).toEqual(['/status']);
  });
});

describe('the notify answer (issue 40 §6)', () => {
  it('keeps {"status": "updated"} and says the version and the relations notified', () => {
    expect(validateGatewayUpdatedResponse({ status: 'updated', version: 5, relations_notified: 0 }).ok).toBe(
      true,
    );
    expect(
      errorsOf(validateGatewayUpdatedResponse({ status: 'other', version: 5, relations_notified: 0 })),
    ).toEqual([{ path: '/status', message: 'must be "updated"' }]);
    expect(pathsOf(validateGatewayUpdatedResponse({ status: 'updated' })).sort()).toEqual([
      '/relations_notified',
      '/version',
    ]);
    expect(
      pathsOf(validateGatewayUpdatedResponse({ status: 'updated', version: 1, relations_notified: -1 })),
    ).toEqual(['/relations_notified']);
    expect(
      pathsOf(
        validateGatewayUpdatedResponse({ status: 'updated', version: 1, relations_notified: 0, extra: 1 }),
      ),
    ).toEqual(['/extra']);
  });
});

describe('CoAP settings document', () => {
  const doc = {
    device_id: 'acme-hq-hvac-01',
    version: 1_733_000_000_123,
    source: 'registry',
    settings: { reporting_interval_s: 300 },
  };

  it('accepts registry and override documents, including empty registry settings', () => {
    expect(validateSettingsDocument(doc).ok).toBe(true);
    expect(validateSettingsDocument({ ...doc, source: 'override' }).ok).toBe(true);
    expect(validateSettingsDocument({ ...doc, settings: {} }).ok).toBe(true);
    expect(validateSettingsDocument({ ...doc, version: 0 }).ok).toBe(true);
  });

  it.each([
    [{ version: -1 }, '/version'],
    [{ version: 1.5 }, '/version'],
    [{ version: 2 ** 53 }, '/version'],
    [{ version: '7' }, '/version'],
    [{ source: 'merged' }, '/source'],
    [{ device_id: 'no spaces allowed' }, '/device_id'],
    [{ settings: { reporting_interval_s: 1 } }, '/settings/reporting_interval_s'],
    [{ settings: null }, '/settings'],
    [{ etag: 'x' }, '/etag'],
  ])('rejects %j at %s', (change, path) => {
    expect(pathsOf(validateSettingsDocument({ ...doc, ...change }))).toEqual([path]);
  });
});
