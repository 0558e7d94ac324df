// Bodies of the device gateway: the management API (design §3.1) and the CoAP settings document (3.4).
import type { FromSchema } from 'json-schema-to-ts';
import { deviceSettingsSchema, desiredSettingsSchema } from './device-settings.js';
import { UUID_PATTERN } from './media-schemas.js';
import { settingsPatchSchema } from './settings-patch.js';
import { compileValidator } from './validation.js';

/** A registry device id (design §3.2): 1–128 characters of `[A-Za-z0-9._:-]`. */
export const DEVICE_ID_PATTERN = '^[A-Za-z0-9._:-]{1,128}$';
const deviceIdRegExp = new RegExp(DEVICE_ID_PATTERN);

// Embedded as is in other schemas (an `$id` may be registered only once, so the property has none).
const deviceIdProperty = {
  type: 'string',
  minLength: 1,
  maxLength: 128,
  // Characters only: the length keywords report length on their own, so one mistake gives one error.
  pattern: '^[A-Za-z0-9._:-]*$',
  patternMessage: 'must be 1-128 characters of A-Z, a-z, 0-9, ".", "_", ":", "-"',
} as const;

export const deviceIdSchema = {
  $id: 'https://platform.example/schemas/device-id.json',
  ...deviceIdProperty,
} as const;

export function isDeviceId(value: unknown): value is string {
  return typeof value === 'string' && deviceIdRegExp.test(value);
}

export const notifySettingsRequestSchema = {
  $id: 'https://platform.example/schemas/notify-settings-request.json',
  type: 'object',
  additionalProperties: false,
  required: ['device_id', 'settings'],
  properties: {
    device_id: deviceIdProperty,
    settings: { $ref: deviceSettingsSchema.$id },
  },
} as const;

export type NotifySettingsRequest = FromSchema<
  typeof notifySettingsRequestSchema,
  { references: [typeof deviceSettingsSchema] }
>;

/** The settings document served at CoAP `/devices/{device_id}/settings` (design §3.4). */
export const settingsDocumentSchema = {
  $id: 'https://platform.example/schemas/settings-document.json',
  type: 'object',
  additionalProperties: false,
  required: ['device_id', 'version', 'source', 'settings'],
  properties: {
    device_id: deviceIdProperty,
    version: {
      type: 'integer',
      minimum: 0,
      maximum: Number.MAX_SAFE_INTEGER,
      description: 'strictly increases with every change a device could see',
    },
    source: { type: 'string', enum: ['override', 'rollout', 'registry'] },
    settings: { $ref: desiredSettingsSchema.$id },
  },
} as const;

export type SettingsDocument = FromSchema<
  typeof settingsDocumentSchema,
  { references: [typeof desiredSettingsSchema] }
>;

function statusResponseSchema<S extends string, I extends string>(id: I, status: S) {
  return {
    $id: id,
    type: 'object',
    additionalProperties: false,
    required: ['status'],
    properties: { status: { type: 'string', const: status } },
  } as const;
}

/** `{"status":"ok"}` */
export const gatewayOkResponseSchema = statusResponseSchema(
  'https://platform.example/schemas/gateway-ok-response.json',
  'ok',
);
/** `{"status":"reloaded"}` */
export const gatewayReloadedResponseSchema = statusResponseSchema(
  'https://platform.example/schemas/gateway-reloaded-response.json',
  'reloaded',
);
/**
 * `{"status":"updated", "version": …, "relations_notified": …}`: the version the replica that took the call serves
 * the device now, and how many of its relations to the device's settings were notified (0 when nobody observes
 * the device there: another replica may hold its relations; the device view says).
 */
export const gatewayUpdatedResponseSchema = {
  $id: 'https://platform.example/schemas/gateway-updated-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['status', 'version', 'relations_notified'],
  properties: {
    status: { type: 'string', const: 'updated' },
    version: { type: 'integer', description: "the settings document's version this replica serves now" },
    relations_notified: {
      type: 'integer',
      minimum: 0,
      description: "relations to the device's settings on the replica that took the call that were notified",
    },
  },
} as const;

export type GatewayOkResponse = FromSchema<typeof gatewayOkResponseSchema>;
export type GatewayReloadedResponse = FromSchema<typeof gatewayReloadedResponseSchema>;
export type GatewayUpdatedResponse = FromSchema<typeof gatewayUpdatedResponseSchema>;

/**
 * A rollout's plan (design §3.9), as POST /api/rollouts takes it; the gateway answers it with the defaults
 * applied (gateway-responses.ts rolloutPlanSchema).
 */
export const rolloutPlanProperty = {
  type: 'object',
  additionalProperties: false,
  required: ['success_share', 'abort_share', 'deadline_s'],
  properties: {
    first_wave_count: { type: 'integer', minimum: 1, maximum: 10000000 },
    first_wave_percent: { type: 'number', exclusiveMinimum: 0, maximum: 100 },
    // Default 2 (applied by the gateway; a schema default would make the derived type require it).
    growth_factor: { type: 'number', minimum: 1, maximum: 100 },
    max_per_minute: {
      type: 'integer',
      minimum: 1,
      maximum: 100000000,
      description: 'notifications a minute at most; absent: no limit',
    },
    success_share: {
      type: 'number',
      minimum: 0,
      maximum: 1,
      description: 'share of a wave that must acknowledge',
    },
    abort_share: {
      type: 'number',
      exclusiveMinimum: 0,
      maximum: 1,
      description: 'share of a wave whose failure aborts',
    },
    deadline_s: {
      type: 'integer',
      minimum: 1,
      maximum: 86400,
      description:
        "per device, from its notification; at least the delivery record's lag (2 x GATEWAY_DELIVERY_FLUSH_MS + 1 s, in whole seconds), else 400",
    },
  },
  oneOf: [{ required: ['first_wave_count'] }, { required: ['first_wave_percent'] }],
} as const;

/**
 * POST /api/rollouts (design §3.9): which devices (every criterion given must match; at least one), the settings
 * (validated exactly like a notify body's) or a settings patch (RFC 7396, merged into each device's settings), and
 * the plan. Shares are fractions from 0 to 1.
 */
export const rolloutCreateRequestSchema = {
  $id: 'https://platform.example/schemas/rollout-create-request.json',
  type: 'object',
  additionalProperties: false,
  required: ['selector', 'plan'],
  oneOf: [{ required: ['settings'] }, { required: ['settings_patch'] }],
  properties: {
    selector: {
      type: 'object',
      additionalProperties: false,
      minProperties: 1,
      properties: {
        site_ids: {
          type: 'array',
          minItems: 1,
          maxItems: 1000,
          uniqueItems: true,
          items: { type: 'string', pattern: UUID_PATTERN, patternMessage: 'must be a UUID' },
        },
        models: {
          type: 'array',
          minItems: 1,
          maxItems: 1000,
          uniqueItems: true,
          items: { type: 'string', minLength: 1, maxLength: 100 },
        },
        device_ids: {
          type: 'array',
          minItems: 1,
          maxItems: 10000,
          uniqueItems: true,
          items: deviceIdProperty,
        },
      },
    },
    settings: { $ref: deviceSettingsSchema.$id },
    settings_patch: settingsPatchSchema,
    plan: rolloutPlanProperty,
  },
} as const;

export type RolloutCreateRequest = FromSchema<
  typeof rolloutCreateRequestSchema,
  { references: [typeof deviceSettingsSchema] }
>;

export const validateRolloutCreateRequest =
  compileValidator<RolloutCreateRequest>(rolloutCreateRequestSchema);

export const validateNotifySettingsRequest =
  compileValidator<NotifySettingsRequest>(notifySettingsRequestSchema);
export const validateSettingsDocument = compileValidator<SettingsDocument>(settingsDocumentSchema);
export const validateGatewayOkResponse = compileValidator<GatewayOkResponse>(gatewayOkResponseSchema);
export const validateGatewayReloadedResponse = compileValidator<GatewayReloadedResponse>(
  gatewayReloadedResponseSchema,
);
export const validateGatewayUpdatedResponse = compileValidator<GatewayUpdatedResponse>(
  gatewayUpdatedResponseSchema,
);
