// The device gateway's development overrides in the open (design §3.3, §3.6): GET /api/overrides, DELETE
// /api/devices/{device_id}/override, and the settings layers the device view shows.
import { deviceIdSchema } from './gateway.js';

const timestamp = { type: 'string', format: 'date-time' } as const;
const layerSource = { enum: ['override', 'rollout', 'registry'] } as const;

/**
 * In place of `rollout_id`: the rollout reaches sites outside the caller's scope, or was created while one of its sites
 * belonged to another company, and is not named to it.
 */
const rollout_outside_scope = {
  const: true,
  description:
    "in place of rollout_id: the rollout also reaches sites outside the caller's scope, or was created while one of its sites belonged to another company",
} as const;

/** What a layer hides or what hides it: a source and, for a rollout's assignment, the rollout. */
const layerRef = {
  type: 'object',
  additionalProperties: false,
  required: ['source'],
  properties: { source: layerSource, rollout_id: { type: 'string', format: 'uuid' }, rollout_outside_scope },
} as const;

/**
 * A device's settings layers as this replica holds them (design §3.3): its development override, its rollout
 * assignment, its registry settings; the first present is effective and hides the others.
 */
export const settingsLayersSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['effective', 'layers'],
  properties: {
    effective: layerSource,
    layers: {
      type: 'array',
      description: 'In precedence order: override, rollout, registry (those present; registry always).',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['source', 'effective', 'settings'],
        properties: {
          source: layerSource,
          rollout_id: { type: 'string', format: 'uuid', description: 'the rollout that assigned it' },
          rollout_outside_scope,
          effective: { type: 'boolean' },
          hidden_by: { ...layerRef, description: 'the effective layer, when this one is not' },
          settings: { type: 'object' },
        },
      },
    },
  },
} as const;

/** GET /api/overrides's query parameters (read like GET /api/devices's). */
export const overrideListQuerySchema = {
  $id: 'https://platform.example/schemas/override-list-query.json',
  type: 'object',
  additionalProperties: false,
  properties: {
    limit: { type: 'integer', minimum: 1, maximum: 500, default: 100 },
    cursor: { type: 'string', description: 'next_cursor of the previous page' },
  },
} as const;

/** GET /api/overrides: one page of the development overrides, by device id. */
export const overrideListResponseSchema = {
  $id: 'https://platform.example/schemas/override-list-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['items', 'next_cursor'],
  properties: {
    items: {
      type: 'array',
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['device_id', 'settings', 'version', 'origin', 'set_at', 'hides'],
        properties: {
          device_id: { $ref: deviceIdSchema.$id },
          settings: { type: 'object' },
          version: { type: 'integer', description: 'the version the accepting replica stamped it with' },
          origin: { type: ['string', 'null'], description: 'the replica that accepted it (its bus origin)' },
          set_at: { oneOf: [{ type: 'null' }, timestamp], description: 'null without the replica bus' },
          hides: {
            type: 'array',
            description: 'the layers it hides on this replica: a rollout assignment, the registry settings',
            items: layerRef,
          },
        },
      },
    },
    next_cursor: { type: ['string', 'null'] },
  },
} as const;

/** DELETE /api/devices/{device_id}/override. */
export const overrideClearedResponseSchema = {
  $id: 'https://platform.example/schemas/override-cleared-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['device_id', 'cleared', 'settings'],
  properties: {
    device_id: { $ref: deviceIdSchema.$id },
    cleared: { type: 'boolean', description: 'false: the device had no override (nothing changed)' },
    settings: {
      type: 'object',
      additionalProperties: false,
      required: ['version', 'source'],
      description: 'what this replica serves the device now',
      properties: { version: { type: 'integer' }, source: layerSource },
    },
  },
} as const;
