import {
  MAX_THRESHOLDS,
  isIanaTimeZone,
  validateDesiredSettings,
  validateDeviceSettings,
} from '@platform/contracts';
import { errorsOf, pathsOf } from './helpers.js';

const complete = {
  reporting_interval_s: 300,
  sampling_interval_s: 10,
  telemetry_enabled: true,
  maintenance_mode: false,
  firmware_channel: 'stable',
  timezone: 'Europe/Berlin',
  thresholds: { temp_c: { min: -10.5, max: 35 }, humidity_pct: { max: 80 }, co2_ppm: { min: 0 } },
};

describe('Device Settings v1', () => {
  it('accepts a document with every field and returns it unchanged', () => {
    const result = validateDeviceSettings(complete);
    expect(result).toEqual({ ok: true, value: complete });
    expect(result.ok && result.value).toBe(complete);
  });

  it.each([
    [{ reporting_interval_s: 10 }],
    [{ reporting_interval_s: 86400 }],
    [{ sampling_interval_s: 1 }],
    [{ sampling_interval_s: 3600 }],
    [{ telemetry_enabled: false }],
    [{ maintenance_mode: true }],
    [{ firmware_channel: 'beta' }],
    [{ thresholds: {} }],
    [{ thresholds: { t: { min: 5, max: 5 } } }],
    [{ thresholds: { t: {} } }],
    [{ thresholds: { ['a' + 'b'.repeat(31)]: { min: 1 } } }],
  ])('accepts the single field %j', (doc) => {
    expect(validateDeviceSettings(doc).ok).toBe(true);
  });

  it('requires at least one property', () => {
    expect(errorsOf(validateDeviceSettings({}))).toEqual([
      { path: '', message: 'must have at least one property' },
    ]);
  });

  it.each([null, [], 'settings', 42, true])('rejects the non-object %j at the root', (doc) => {
    expect(pathsOf(validateDeviceSettings(doc))).toEqual(['']);
  });

  it.each([
    ['reporting_interval_s', 9],
    ['reporting_interval_s', 86401],
    ['reporting_interval_s', 60.5],
    ['reporting_interval_s', '60'],
    ['sampling_interval_s', 0],
    ['sampling_interval_s', 3601],
    ['sampling_interval_s', null],
    ['telemetry_enabled', 'true'],
    ['maintenance_mode', 1],
    ['firmware_channel', 'nightly'],
    ['firmware_channel', 'Stable'],
    ['timezone', 42],
  ])('rejects %s = %j with its path', (field, value) => {
    expect(pathsOf(validateDeviceSettings({ [field]: value }))).toContain(`/${field}`);
  });

  it('rejects unknown properties at their own path', () => {
    expect(errorsOf(validateDeviceSettings({ telemetry_enabled: true, colour: 'red' }))).toEqual([
      { path: '/colour', message: 'is not an allowed property' },
    ]);
  });

  it('reports every failing field at once', () => {
    const paths = pathsOf(
      validateDeviceSettings({
        reporting_interval_s: 1,
        sampling_interval_s: 0,
        firmware_channel: 'x',
        extra: 1,
      }),
    );
    expect(paths).toEqual(
      expect.arrayContaining([
        '/reporting_interval_s',
        '/sampling_interval_s',
        '/firmware_channel',
        '/extra',
      ]),
    );
  });

  describe('timezone', () => {
    it.each([
      'UTC',
      'Europe/Berlin',
      'Europe/Kyiv',
      'Europe/Kiev',
      'US/Eastern',
      'America/Argentina/Buenos_Aires',
      'America/Port-au-Prince',
      'Etc/GMT+5',
      'Asia/Kolkata',
    ])('accepts the zone or link %s', (timezone) => {
      expect(validateDeviceSettings({ timezone }).ok).toBe(true);
    });

    it.each([
      'Mars/Phobos',
      'Europe/Atlantis',
      '',
      'utc',
      'europe/london',
      'EUROPE/LONDON',
      '+01:00',
      'UTC+1',
      'Europe//Berlin',
      '/Europe/Berlin',
      'Europe/Berlin ',
      `Europe/${'A'.repeat(58)}`,
    ])('rejects %j at /timezone', (timezone) => {
      expect(pathsOf(validateDeviceSettings({ timezone }))).toContain('/timezone');
    });

    it('explains the failure', () => {
      expect(errorsOf(validateDeviceSettings({ timezone: 'Mars/Phobos' }))).toEqual([
        { path: '/timezone', message: 'must be an IANA time zone name such as "Europe/Berlin"' },
      ]);
    });

    it('limits names to 64 characters', () => {
      expect(isIanaTimeZone('America/Argentina/ComodRivadavia')).toBe(true);
      const tooLong = 'A'.repeat(65);
      expect(errorsOf(validateDeviceSettings({ timezone: tooLong })).map((e) => e.message)).toContain(
        'must NOT have more than 64 characters',
      );
    });

    it('gives the same answer on repeated checks (cached valid names)', () => {
      expect(isIanaTimeZone('Europe/Paris')).toBe(true);
      expect(isIanaTimeZone('Europe/Paris')).toBe(true);
      expect(isIanaTimeZone('Europe/Pariss')).toBe(false);
      expect(isIanaTimeZone('Europe/Pariss')).toBe(false);
    });
  });

  describe('thresholds', () => {
    it('points at the offending min when min > max', () => {
      expect(
        errorsOf(validateDeviceSettings({ thresholds: { temp_c: { min: 30, max: 20 }, rh: { min: 1 } } })),
      ).toEqual([{ path: '/thresholds/temp_c/min', message: 'must not be greater than max (20)' }]);
    });

    it('reports every inverted entry', () => {
      const paths = pathsOf(
        validateDeviceSettings({
          thresholds: { a: { min: 2, max: 1 }, b: { min: 0, max: 1 }, c: { min: 9, max: -9 } },
        }),
      );
      expect(paths).toEqual(['/thresholds/a/min', '/thresholds/c/min']);
    });

    it(`allows ${MAX_THRESHOLDS} entries, not ${MAX_THRESHOLDS + 1}`, () => {
      const entries = (n: number) =>
        Object.fromEntries(Array.from({ length: n }, (_, i) => [`t${i}`, { max: i }]));
      expect(validateDeviceSettings({ thresholds: entries(MAX_THRESHOLDS) }).ok).toBe(true);
      expect(errorsOf(validateDeviceSettings({ thresholds: entries(MAX_THRESHOLDS + 1) }))).toEqual([
        { path: '/thresholds', message: 'must NOT have more than 16 properties' },
      ]);
    });

    it.each(['Temp', '1temp', '_temp', 'temp-c', 'temp c', '', 'a'.repeat(33), 'tempé'])(
      'rejects the key %j at its own path',
      (key) => {
        const [error, ...rest] = errorsOf(validateDeviceSettings({ thresholds: { [key]: { min: 1 } } }));
        expect(rest).toEqual([]);
        expect(error?.path).toBe(`/thresholds/${key}`);
        expect(error?.message).toMatch(/^property name /);
      },
    );

    it('escapes "/" and "~" in keys per RFC 6901', () => {
      expect(pathsOf(validateDeviceSettings({ thresholds: { 'a/b~c': { min: 1 } } }))).toEqual([
        '/thresholds/a~1b~0c',
      ]);
    });

    it.each([
      [{ min: '1' }, '/thresholds/t/min'],
      [{ max: null }, '/thresholds/t/max'],
      [{ min: Number.POSITIVE_INFINITY }, '/thresholds/t/min'],
      [{ max: Number.NaN }, '/thresholds/t/max'],
      [{ min: 1, avg: 2 }, '/thresholds/t/avg'],
      [5, '/thresholds/t'],
      [null, '/thresholds/t'],
    ])('rejects the entry %j at %s', (entry, path) => {
      expect(pathsOf(validateDeviceSettings({ thresholds: { t: entry } }))).toEqual([path]);
    });

    it('rejects a non-object thresholds value', () => {
      expect(pathsOf(validateDeviceSettings({ thresholds: [] }))).toEqual(['/thresholds']);
    });
  });
});

describe('desired settings (registry)', () => {
  it('accepts {} and full documents', () => {
    expect(validateDesiredSettings({}).ok).toBe(true);
    expect(validateDesiredSettings(complete).ok).toBe(true);
  });

  it('applies the same field rules', () => {
    expect(
      pathsOf(validateDesiredSettings({ timezone: 'Mars/Phobos', thresholds: { t: { min: 2, max: 1 } } })),
    ).toEqual(['/timezone', '/thresholds/t/min']);
  });
});
