// The gateway's audit (design §3.1, issue 42 §4): GET /api/audit's query and page.

const uuid = { type: 'string', format: 'uuid' } as const;

/** Who made a change, as the audit names them: `user:<sub>`, `key:<name>`, `api-key`, `driver`, `command:<user>`. */
export const AUDIT_PRINCIPAL_PATTERN = '^[A-Za-z0-9._:@-]{1,300}$';

/** GET /api/audit's query parameters (read by the gateway's http/list-query.ts, like GET /api/devices's). */
export const auditListQuerySchema = {
  $id: 'https://platform.example/schemas/audit-list-query.json',
  type: 'object',
  additionalProperties: false,
  properties: {
    principal: {
      type: 'string',
      pattern: AUDIT_PRINCIPAL_PATTERN,
      maxLength: 300,
      description: 'only changes by this principal (e.g. user:<sub>, key:<name>, api-key, driver)',
    },
    device_id: {
      type: 'string',
      pattern: '^[A-Za-z0-9._:-]{1,128}$',
      maxLength: 128,
      description: 'only changes of this device',
    },
    rollout_id: { ...uuid, description: 'only changes of this rollout' },
    since: { type: 'string', format: 'date-time', description: 'changes at or after this time (RFC 3339)' },
    until: { type: 'string', format: 'date-time', description: 'changes before this time (RFC 3339)' },
    limit: { type: 'integer', minimum: 1, maximum: 500, default: 100 },
    cursor: { type: 'string', description: 'next_cursor of the previous page' },
  },
} as const;

/** One row of the audit (inlined in the page's schema). */
export const auditEventSchema = {
  type: 'object',
  additionalProperties: false,
  required: [
    'id',
    'at',
    'principal',
    'principal_kind',
    'principal_name',
    'role',
    'request_id',
    'source_address',
    'action',
    'device_id',
    'rollout_id',
    'site_ids',
    'detail',
  ],
  properties: {
    id: {
      type: 'string',
      pattern: '^[A-Za-z0-9_-]{22}$',
      description:
        "the row's id: opaque and stable (the same row always has the same id); also the cursor after it",
    },
    at: { type: 'string', format: 'date-time' },
    principal: { type: 'string' },
    principal_kind: { enum: ['user', 'api_key', 'anonymous_key', 'driver', 'command'] },
    principal_name: { type: ['string', 'null'] },
    role: { type: ['string', 'null'] },
    request_id: { type: ['string', 'null'] },
    source_address: { type: ['string', 'null'] },
    action: {
      type: 'string',
      description:
        'registry.reloaded, settings.notified, override.cleared, rollout.created|paused|resumed|cancelled|rolled_back|promoted|completed, device_key.issued|revoked',
    },
    device_id: { type: ['string', 'null'] },
    rollout_id: {
      type: ['string', 'null'],
      description:
        'null for a caller limited to sites when the row also touched other sites (a rollout it may not see is never named to it)',
    },
    site_ids: {
      type: 'array',
      items: uuid,
      description: 'the sites the change touched (for a caller limited to sites: those of its sites only)',
    },
    detail: {
      type: 'object',
      description: 'what changed; empty for a caller limited to sites when the change reached other sites',
    },
  },
} as const;

export const auditListResponseSchema = {
  $id: 'https://platform.example/schemas/audit-list-response.json',
  type: 'object',
  additionalProperties: false,
  required: ['items', 'next_cursor'],
  properties: {
    items: { type: 'array', items: auditEventSchema },
    next_cursor: { type: ['string', 'null'] },
  },
} as const;
