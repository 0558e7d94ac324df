// A settings patch (design §3.9): an RFC 7396 JSON Merge Patch of Device Settings, as POST /api/rollouts takes it
// (`settings_patch`). Each member sets a setting (valid as in Device Settings) or, as null, removes it; `thresholds`
// merges by threshold name, and a threshold by `min` / `max`. The result is checked as Device Settings per device.
import type { FromSchema } from 'json-schema-to-ts';
import { deviceSettingsSchema } from './device-settings.js';

const settings = deviceSettingsSchema.properties;
const isNull = { type: 'null' } as const;

export const settingsPatchSchema = {
  type: 'object',
  additionalProperties: false,
  minProperties: 1,
  description:
    "RFC 7396 JSON Merge Patch of each device's settings: a member sets that setting, null removes it; thresholds merge by name, a threshold by min/max",
  properties: {
    reporting_interval_s: { oneOf: [isNull, settings.reporting_interval_s] },
    sampling_interval_s: { oneOf: [isNull, settings.sampling_interval_s] },
    telemetry_enabled: { oneOf: [isNull, settings.telemetry_enabled] },
    maintenance_mode: { oneOf: [isNull, settings.maintenance_mode] },
    firmware_channel: { oneOf: [isNull, settings.firmware_channel] },
    timezone: { oneOf: [isNull, settings.timezone] },
    thresholds: {
      oneOf: [
        isNull,
        {
          type: 'object',
          // Names removed and names added: up to twice the 16 a document may hold.
          maxProperties: 32,
          propertyNames: settings.thresholds.propertyNames,
          additionalProperties: {
            oneOf: [
              isNull,
              {
                type: 'object',
                additionalProperties: false,
                properties: { min: { type: ['number', 'null'] }, max: { type: ['number', 'null'] } },
              },
            ],
          },
        },
      ],
    },
  },
} as const;

export type SettingsPatch = FromSchema<typeof settingsPatchSchema>;
