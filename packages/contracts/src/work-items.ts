// Work-item decisions of the workflow service (design §4.4).
import type { FromSchema } from 'json-schema-to-ts';
import { UUID_PATTERN } from './media-schemas.js';
import { compileValidator } from './validation.js';

export const decisions = ['accept', 'defer', 'decline'] as const;
export type Decision = (typeof decisions)[number];

export const workItemStatuses = ['proposed', 'accepted', 'deferred', 'declined'] as const;
export type WorkItemStatus = (typeof workItemStatuses)[number];

/** Longest decision note, in characters. */
export const MAX_DECISION_NOTE_LENGTH = 2000;

export const decisionRequestSchema = {
  $id: 'https://platform.example/schemas/decision-request.json',
  type: 'object',
  additionalProperties: false,
  required: ['decision'],
  properties: {
    decision: { type: 'string', enum: decisions },
    note: { type: 'string', maxLength: MAX_DECISION_NOTE_LENGTH },
    defer_until: {
      type: 'string',
      format: 'date-time',
      description: 'RFC 3339 with offset; whether it lies in the future is a rule of the service',
    },
  },
  // `defer_until` is required for "defer" and meaningless (so rejected) for the other decisions.
  if: { required: ['decision'], properties: { decision: { const: 'defer' } } },
  then: { required: ['defer_until'] },
  else: { properties: { defer_until: false } },
} as const;

export type DecisionRequest = FromSchema<typeof decisionRequestSchema, { parseIfThenElseKeywords: true }>;

/** The work item's state after a decision (the 200 body of the decision endpoint). */
export const decisionResponseSchema = {
  $id: 'https://platform.example/schemas/decision-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['work_item_id', 'site_id', 'status', 'defer_until', 'decided_at', 'decided_by', 'note'],
  properties: {
    work_item_id: { type: 'string', pattern: UUID_PATTERN, patternMessage: 'must be a UUID' },
    site_id: { type: 'string', pattern: UUID_PATTERN, patternMessage: 'must be a UUID' },
    status: { type: 'string', enum: workItemStatuses },
    defer_until: { type: ['string', 'null'], format: 'date-time' },
    decided_at: { type: ['string', 'null'], format: 'date-time' },
    decided_by: { type: ['string', 'null'], description: 'the `sub` of the deciding user' },
    note: { type: ['string', 'null'], maxLength: MAX_DECISION_NOTE_LENGTH },
  },
} as const;

export type DecisionResponse = FromSchema<typeof decisionResponseSchema>;

export const validateDecisionRequest = compileValidator<DecisionRequest>(decisionRequestSchema);
export const validateDecisionResponse = compileValidator<DecisionResponse>(decisionResponseSchema);
