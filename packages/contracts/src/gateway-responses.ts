// What the device gateway's management API answers (design §3.1, §3.8, §3.9) and the query parameters of its
// lists. Written once here; the gateway's routes name them and its OpenAPI document is generated from them
// (`npm run openapi`); its test/openapi.test.ts checks every documented answer against them.
import { deviceSettingsSchema } from './device-settings.js';
import { deviceIdSchema, rolloutPlanProperty } from './gateway.js';
import { settingsLayersSchema } from './gateway-overrides.js';
import { UUID_PATTERN } from './media-schemas.js';
import { settingsPatchSchema } from './settings-patch.js';

const timestamp = { type: 'string', format: 'date-time' } as const;
const nullableTimestamp = { oneOf: [{ type: 'null' }, timestamp] } as const;
const uuid = { type: 'string', format: 'uuid' } as const;
const transport = { enum: ['plain', 'dtls'] } as const;
const nextCursor = { type: ['string', 'null'] } as const;

/** The delivery states of design §3.8, as GET /api/devices filters them. */
export const deliveryStates = [
  'applied',
  'rejected',
  'acknowledged',
  'pending',
  'sent_unconfirmed',
  'observed_unauthenticated',
  'unobserved',
  'stale',
] as const;
/**
 * What GET /api/devices's `delivery` takes: one or more states separated by commas, or `not_applied` (every state
 * but `applied`) among them.
 */
export const deliveryFilterPattern = `^(${[...deliveryStates, 'not_applied'].join('|')})(,(${[...deliveryStates, 'not_applied'].join('|')}))*$`;
/** The rollout states of design §3.9. */
export const rolloutStates = ['active', 'paused', 'completed', 'cancelled', 'rolled_back'] as const;

/**
 * The body of a route that reads no field of it (the reloads, the rollout actions): none, or any JSON object or
 * array, which must still be well-formed JSON within the body limit.
 */
export const gatewayUnusedBodySchema = {
  $id: 'https://platform.example/schemas/gateway-unused-body.json',
  description: 'Not read: send no body, or any JSON object or array.',
  type: ['object', 'array'],
} as const;

/** An API key's keyed fingerprint, as /api/config and the reload's log line show it. */
const keyFingerprint = {
  type: 'string',
  pattern: '^hmac-sha256:[0-9a-f]{12}$',
  description:
    "The key's HMAC-SHA-256 under a key the process draws at start (first 12 hex digits): names a key within one replica's life, and cannot be computed or checked outside it.",
} as const;
/** A scope of a named key: uuids, or null (not limited that way). */
const scopeList = {
  oneOf: [
    { type: 'null' },
    {
      type: 'array',
      minItems: 1,
      uniqueItems: true,
      items: { type: 'string', pattern: UUID_PATTERN, patternMessage: 'must be a UUID' },
    },
  ],
} as const;

/**
 * GET /api/config: the effective configuration, secrets redacted. The key file may hold only named keys
 * (design §3.1), so the anonymous keys' count may be 0; the gateway refuses to start with no key of either kind.
 */
export const gatewayPublicConfigSchema = {
  $id: 'https://platform.example/schemas/gateway-public-config.json',
  type: 'object',
  required: ['http_port', 'coap_port', 'database_url', 'api_keys', 'named_api_keys', 'oidc', 'coap'],
  properties: {
    http_port: { type: 'integer' },
    coap_port: { type: 'integer' },
    coap_host: { type: 'string' },
    database_url: { type: 'string', description: 'password replaced by ***' },
    api_keys: {
      type: 'object',
      description: "The specification's anonymous keys (each an unscoped admin, audited as `api-key`).",
      additionalProperties: false,
      required: ['count', 'fingerprints'],
      properties: {
        count: { type: 'integer', minimum: 0 },
        fingerprints: { type: 'array', items: keyFingerprint },
      },
    },
    named_api_keys: {
      type: 'array',
      description:
        'The named keys of the key file (design §3.1): name, role, scope and fingerprint, never the key.',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['name', 'role', 'sites', 'companies', 'fingerprint'],
        properties: {
          name: {
            type: 'string',
            pattern: '^[a-z0-9][a-z0-9._-]{0,63}$',
            description: 'audited as `key:<name>`',
          },
          role: { enum: ['viewer', 'operator', 'admin'] },
          sites: { ...scopeList, description: 'limited to these sites (null: not limited by site)' },
          companies: {
            ...scopeList,
            description: "limited to these companies' sites (null: not limited by company)",
          },
          fingerprint: keyFingerprint,
        },
      },
    },
    api_keys_file: { type: ['string', 'null'] },
    oidc: {
      description: "People's access tokens (GATEWAY_OIDC_*); null: API keys only.",
      oneOf: [
        { type: 'null' },
        {
          type: 'object',
          additionalProperties: false,
          required: ['issuer_url', 'client_id'],
          properties: {
            issuer_url: { type: 'string', description: "the platform realm's issuer (the tokens' iss)" },
            client_id: {
              type: 'string',
              description: 'the operations client the tokens are issued to (azp)',
            },
          },
        },
      ],
    },
    coap: { type: 'object' },
  },
} as const;

/** A device's delivery record (design §3.8), shared by every replica. */
export const deviceDeliverySchema = {
  $id: 'https://platform.example/schemas/device-delivery.json',
  description: 'The delivery record (design §3.8); versions are document versions (settings `version`).',
  type: 'object',
  additionalProperties: false,
  required: [
    'state',
    'desired',
    'sent',
    'acknowledged',
    'reported',
    'heard_at',
    'observed_by',
    'observed_unauthenticated_by',
    'updated_at',
  ],
  properties: {
    state: {
      enum: deliveryStates,
      description:
        'design §3.8; observed_unauthenticated: no relation that speaks for the device, and a replica holds one that cannot (plain CoAP for a keyed device)',
    },
    desired: {
      type: 'object',
      additionalProperties: false,
      required: ['version', 'source', 'since', 'digest'],
      properties: {
        version: { type: ['integer', 'null'] },
        source: { enum: ['registry', 'override', 'rollout', null] },
        since: timestamp,
        digest: {
          type: ['string', 'null'],
          description: "the desired content's 64-bit digest (16 hex digits), the same on every replica",
        },
      },
    },
    sent: {
      oneOf: [
        { type: 'null' },
        {
          type: 'object',
          additionalProperties: false,
          required: ['version', 'at', 'replica', 'transport', 'type', 'is_desired', 'acknowledged'],
          properties: {
            version: { type: 'integer' },
            at: timestamp,
            replica: { type: 'string', description: 'the replica that sent it (its bus origin)' },
            transport,
            type: { enum: ['CON', 'NON'], description: 'NON: sent, unconfirmed' },
            is_desired: { type: 'boolean' },
            acknowledged: { type: 'boolean' },
          },
        },
      ],
    },
    acknowledged: {
      oneOf: [
        { type: 'null' },
        {
          type: 'object',
          additionalProperties: false,
          required: ['version', 'at', 'replica', 'transport', 'is_desired'],
          properties: {
            version: { type: 'integer' },
            at: timestamp,
            replica: { type: 'string' },
            transport,
            is_desired: { type: 'boolean' },
          },
        },
      ],
    },
    reported: {
      description:
        "the device's own word (POST /devices/{id}/reported over CoAP): the newest version it reported on",
      oneOf: [
        { type: 'null' },
        {
          type: 'object',
          additionalProperties: false,
          required: [
            'version',
            'outcome',
            'reason',
            'at',
            'replica',
            'transport',
            'is_desired',
            'settings',
            'delta',
          ],
          properties: {
            version: { type: 'integer' },
            outcome: { enum: ['applied', 'rejected'] },
            reason: { type: ['string', 'null'], description: 'why it rejected the version' },
            at: timestamp,
            replica: { type: 'string', description: 'the replica the report reached' },
            transport,
            is_desired: { type: 'boolean', description: 'the reported version carries the desired content' },
            settings: { type: ['object', 'null'], description: 'the settings the device says it runs' },
            delta: {
              type: ['object', 'null'],
              description:
                'what the device would change to run the desired settings: an RFC 7396 merge patch of `settings` ({} when equal; null when unknown here)',
            },
          },
        },
      ],
    },
    heard_at: nullableTimestamp,
    observed_by: {
      type: 'array',
      items: { type: 'string' },
      description: 'replicas holding a relation to its settings that speaks for the device',
    },
    observed_unauthenticated_by: {
      type: 'array',
      items: { type: 'string' },
      description:
        'replicas holding relations to its settings none of which speaks for the device (plain CoAP for a keyed device)',
    },
    updated_at: timestamp,
  },
} as const;

/** GET /api/devices: one page of the fleet's delivery. */
export const deviceListResponseSchema = {
  $id: 'https://platform.example/schemas/device-list-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['items', 'next_cursor'],
  properties: {
    items: {
      type: 'array',
      items: {
        allOf: [{ $ref: deviceDeliverySchema.$id }],
        type: 'object',
        required: ['device_id', 'site_id', 'name', 'model'],
        properties: {
          device_id: { $ref: deviceIdSchema.$id },
          site_id: { type: ['string', 'null'], format: 'uuid' },
          name: { type: 'string' },
          model: { type: 'string' },
        },
      },
    },
    next_cursor: nextCursor,
  },
} as const;

/** GET /api/devices/{device_id}: one device, as on-call needs it. */
export const deviceViewResponseSchema = {
  $id: 'https://platform.example/schemas/device-view-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['device', 'settings', 'delivery', 'replicas', 'credentials'],
  properties: {
    device: {
      type: 'object',
      additionalProperties: false,
      required: ['device_id', 'site_id', 'name', 'model', 'enabled'],
      properties: {
        device_id: { $ref: deviceIdSchema.$id },
        site_id: uuid,
        name: { type: 'string' },
        model: { type: 'string' },
        enabled: { type: 'boolean' },
      },
    },
    settings: {
      description: "The settings document this replica serves (its `version` is this replica's).",
      type: 'object',
      required: ['device_id', 'version', 'source', 'settings'],
      properties: {
        device_id: { $ref: deviceIdSchema.$id },
        version: { type: 'integer' },
        source: { enum: ['registry', 'override', 'rollout'] },
        settings: { type: 'object' },
      },
    },
    settings_layers: settingsLayersSchema,
    delivery: { oneOf: [{ type: 'null' }, { $ref: deviceDeliverySchema.$id }] },
    replicas: {
      type: 'array',
      items: {
        type: 'object',
        required: ['replica', 'self', 'answered'],
        properties: {
          replica: { type: 'string' },
          self: { type: 'boolean' },
          answered: { type: 'boolean', description: 'false when it did not answer within the deadline' },
          relations: {
            type: 'array',
            items: {
              type: 'object',
              properties: {
                resource: { enum: ['settings', 'record'] },
                transport,
                type: { enum: ['CON', 'NON'] },
                address: { type: 'string' },
                port: { type: 'integer' },
                since: timestamp,
                last_version: { type: ['integer', 'null'] },
                con_in_flight: { type: 'boolean' },
                speaks_for_device: {
                  type: 'boolean',
                  description:
                    'false for plain CoAP to a device with a DTLS key: listed, but it moves nothing in the record',
                },
                last_confirmed_at: timestamp,
              },
            },
          },
          relations_total: { type: 'integer' },
          dtls_sessions: {
            type: 'array',
            items: {
              type: 'object',
              properties: {
                identity: { type: 'string', description: 'the PSK identity (sent in clear by the device)' },
                address: { type: 'string' },
                port: { type: 'integer' },
                established_at: timestamp,
                last_record_at: timestamp,
              },
            },
          },
          dtls_sessions_total: { type: 'integer' },
        },
      },
    },
    credentials: {
      type: 'object',
      additionalProperties: false,
      required: ['valid_keys', 'future_keys', 'next_expiry', 'keys'],
      properties: {
        valid_keys: { type: 'integer' },
        future_keys: { type: 'integer' },
        next_expiry: nullableTimestamp,
        keys: {
          type: 'array',
          items: {
            type: 'object',
            additionalProperties: false,
            required: ['identity', 'valid', 'not_before', 'not_after'],
            properties: {
              identity: { type: 'string' },
              valid: { type: 'boolean' },
              not_before: timestamp,
              not_after: nullableTimestamp,
            },
          },
        },
      },
    },
  },
} as const;

/** A rollout's plan as the gateway answers it: as it was given, `growth_factor` filled in, no limit a null. */
export const rolloutPlanSchema = {
  $id: 'https://platform.example/schemas/rollout-plan.json',
  ...rolloutPlanProperty,
  properties: {
    ...rolloutPlanProperty.properties,
    growth_factor: { ...rolloutPlanProperty.properties.growth_factor, default: 2 },
    max_per_minute: { ...rolloutPlanProperty.properties.max_per_minute, type: ['integer', 'null'] },
  },
} as const;

/** POST /api/rollouts, 201. */
export const rolloutCreatedResponseSchema = {
  $id: 'https://platform.example/schemas/rollout-created-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['rollout_id', 'targets', 'waves', 'state'],
  properties: {
    rollout_id: uuid,
    targets: { type: 'integer', description: 'devices the selector resolved to' },
    waves: { type: 'integer' },
    state: { const: 'active' },
    skipped: { type: 'integer', description: 'targets skipped: the patch makes their settings invalid' },
    skipped_devices: {
      type: 'array',
      description: 'the first 100 skipped targets, with why',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['device_id', 'reason'],
        properties: { device_id: { type: 'string' }, reason: { type: 'string' } },
      },
    },
    overridden: {
      type: 'integer',
      description: 'targets holding a development override now: their assignment will end it (design §3.3)',
    },
    overridden_devices: { type: 'array', items: { type: 'string' }, description: 'the first 100 of them' },
  },
} as const;

/** A rollout in GET /api/rollouts's list, and the common part of GET /api/rollouts/{rollout_id}. */
export const rolloutSummarySchema = {
  $id: 'https://platform.example/schemas/rollout-summary.json',
  type: 'object',
  required: [
    'rollout_id',
    'state',
    'reason',
    'aborted',
    'targets',
    'waves',
    'current_wave',
    'created_at',
    'updated_at',
  ],
  properties: {
    rollout_id: uuid,
    state: { enum: rolloutStates },
    reason: {
      type: ['string', 'null'],
      description: 'why it paused (an operator, the abort or success criterion)',
    },
    aborted: { type: 'boolean', description: 'paused by the abort criterion' },
    targets: { type: 'integer' },
    waves: { type: 'integer' },
    current_wave: { type: 'integer' },
    created_at: timestamp,
    updated_at: timestamp,
  },
} as const;

/** A wave's device counts, or a rollout's totals. */
export const rolloutWaveCountsSchema = {
  $id: 'https://platform.example/schemas/rollout-wave-counts.json',
  type: 'object',
  additionalProperties: false,
  required: ['targeted', 'notified', 'acknowledged', 'failed', 'skipped', 'pending'],
  properties: {
    wave: { type: 'integer' },
    targeted: { type: 'integer' },
    notified: { type: 'integer' },
    acknowledged: { type: 'integer' },
    failed: { type: 'integer' },
    skipped: { type: 'integer' },
    pending: { type: 'integer', description: 'notified, no outcome yet' },
  },
} as const;

/** GET /api/rollouts/{rollout_id}. */
export const rolloutResponseSchema = {
  $id: 'https://platform.example/schemas/rollout-response.json',
  allOf: [{ $ref: rolloutSummarySchema.$id }],
  type: 'object',
  required: ['selector', 'plan', 'totals', 'wave_counts', 'events'],
  oneOf: [{ required: ['settings'] }, { required: ['settings_patch'] }],
  properties: {
    selector: { type: 'object' },
    settings: { $ref: deviceSettingsSchema.$id },
    settings_patch: settingsPatchSchema,
    skipped_devices: {
      type: 'array',
      description:
        'a patch rollout: the first 100 targets (by device id) it skipped at its creation, with why',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['device_id', 'reason'],
        properties: { device_id: { type: 'string' }, reason: { type: 'string' } },
      },
    },
    plan: { $ref: rolloutPlanSchema.$id },
    totals: { $ref: rolloutWaveCountsSchema.$id },
    wave_counts: { type: 'array', items: { $ref: rolloutWaveCountsSchema.$id } },
    events: {
      description: 'The latest 50, oldest first.',
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['kind', 'wave', 'actor', 'detail', 'at'],
        properties: {
          kind: {
            enum: [
              'created',
              'wave_started',
              'wave_completed',
              'paused',
              'aborted',
              'resumed',
              'cancelled',
              'rolled_back',
              'completed',
              'overrides_ended',
              'patch_skipped',
            ],
          },
          wave: { type: ['integer', 'null'] },
          actor: { type: 'string', description: "'api', or the driver replica and its lease term" },
          detail: { type: ['string', 'null'] },
          at: timestamp,
        },
      },
    },
  },
} as const;

/** GET /api/rollouts: one page, newest first. */
export const rolloutListResponseSchema = {
  $id: 'https://platform.example/schemas/rollout-list-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['items', 'next_cursor'],
  properties: {
    items: { type: 'array', items: { $ref: rolloutSummarySchema.$id } },
    next_cursor: nextCursor,
  },
} as const;

/** POST /api/rollouts/{rollout_id}/{pause,resume,cancel,rollback}. */
export const rolloutActionResponseSchema = {
  $id: 'https://platform.example/schemas/rollout-action-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['rollout_id', 'state', 'devices_returned'],
  properties: {
    rollout_id: uuid,
    state: { enum: rolloutStates },
    devices_returned: { type: 'integer', description: 'devices a rollback gave their previous settings' },
  },
} as const;

const cursorParameter = { type: 'string', description: 'next_cursor of the previous page' } as const;

/**
 * GET /api/devices's query parameters. The gateway reads the query by these (http/list-query.ts): the enum,
 * the integer range and the default below are the rules it applies.
 */
export const deviceListQuerySchema = {
  $id: 'https://platform.example/schemas/device-list-query.json',
  type: 'object',
  additionalProperties: false,
  properties: {
    site_id: uuid,
    delivery: {
      type: 'string',
      pattern: deliveryFilterPattern,
      description: `one or more of ${deliveryStates.join(', ')} separated by commas; not_applied: every state but applied`,
    },
    acknowledged_for_s: {
      type: 'integer',
      minimum: 0,
      maximum: 31536000,
      description:
        'of the devices in state acknowledged, only those acknowledged at least this many seconds ago (acknowledged, not applied after N s)',
    },
    limit: { type: 'integer', minimum: 1, maximum: 500, default: 100 },
    cursor: cursorParameter,
  },
} as const;

/** GET /api/rollouts's query parameters (read like GET /api/devices's). */
export const rolloutListQuerySchema = {
  $id: 'https://platform.example/schemas/rollout-list-query.json',
  type: 'object',
  additionalProperties: false,
  properties: {
    state: { enum: rolloutStates },
    limit: { type: 'integer', minimum: 1, maximum: 100, default: 20 },
    cursor: cursorParameter,
  },
} as const;

/** The schemas above that others `$ref` by `$id` (the API document's components). */
export const gatewayReferencedSchemas = [
  deviceIdSchema,
  deviceSettingsSchema,
  deviceDeliverySchema,
  rolloutPlanSchema,
  rolloutSummarySchema,
  rolloutWaveCountsSchema,
] as const;
