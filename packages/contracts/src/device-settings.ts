// Device Settings v1 (design §3.3): what the gateway pushes to a device over CoAP.
import type { FromSchema } from 'json-schema-to-ts';
import { MAX_TIME_ZONE_LENGTH } from './time-zone.js';
import { compileValidator, registerSchema } from './validation.js';

/** Most entries in `thresholds`. */
export const MAX_THRESHOLDS = 16;

const thresholdSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    // ajv rejects NaN and ±Infinity for `type: number` (strictNumbers), so bounds are finite.
    min: { type: 'number' },
    max: { type: 'number' },
  },
  // Custom keyword (validation.ts): min <= max when both are present, reported at `.../min`.
  minNotAboveMax: true,
} as const;

const deviceSettingsProperties = {
  reporting_interval_s: {
    type: 'integer',
    minimum: 10,
    maximum: 86400,
    description: 'seconds between telemetry reports',
  },
  sampling_interval_s: { type: 'integer', minimum: 1, maximum: 3600, description: 'seconds between samples' },
  telemetry_enabled: { type: 'boolean' },
  maintenance_mode: { type: 'boolean' },
  firmware_channel: { type: 'string', enum: ['stable', 'beta'] },
  timezone: {
    type: 'string',
    minLength: 1,
    maxLength: MAX_TIME_ZONE_LENGTH,
    format: 'iana-time-zone',
    description: 'IANA time zone name (zone or link) known to the ICU data of the runtime',
  },
  thresholds: {
    type: 'object',
    maxProperties: MAX_THRESHOLDS,
    propertyNames: {
      type: 'string',
      pattern: '^[a-z][a-z0-9_]{0,31}$',
      patternMessage: 'must be a lower-case letter followed by at most 31 of a-z, 0-9, "_"',
    },
    additionalProperties: thresholdSchema,
  },
} as const;

/** Device Settings v1: a non-empty object of the fields above (a notification must change something). */
export const deviceSettingsSchema = {
  $id: 'https://platform.example/schemas/device-settings.v1.json',
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  properties: deviceSettingsProperties,
} as const;

/**
 * The registry's `desired_settings` (design §3.2) and the `settings` of the CoAP settings document: the
 * same fields, but `{}` is allowed (a device with nothing configured yet).
 */
export const desiredSettingsSchema = {
  $id: 'https://platform.example/schemas/desired-settings.v1.json',
  type: 'object',
  additionalProperties: false,
  properties: deviceSettingsProperties,
} as const;

export type DeviceSettings = FromSchema<typeof deviceSettingsSchema>;
export type DesiredSettings = FromSchema<typeof desiredSettingsSchema>;
export type Threshold = FromSchema<typeof thresholdSchema>;

registerSchema(deviceSettingsSchema);
registerSchema(desiredSettingsSchema);

export const validateDeviceSettings = compileValidator<DeviceSettings>(deviceSettingsSchema);
export const validateDesiredSettings = compileValidator<DesiredSettings>(desiredSettingsSchema);
