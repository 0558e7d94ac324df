// Work-item decisions (design §4.4), with the route's entry in the API document.
import { decisionRequestSchema, decisionResponseSchema, validateDecisionRequest } from '@platform/contracts';
import { requireValid } from '@platform/service-kit';
import type { RouteDefinition } from '@platform/service-kit';
import type { RequestHandler } from 'express';
import type { WorkflowContext } from '../domain/context.js';
import { decideWorkItem } from '../domain/work-item-decisions.js';
import { IDEMPOTENCY_KEY_HEADER, idempotencyKey, PATH_IDS, pathId, portalRoute } from './request-parts.js';

export function decisionRoutes(ctx: WorkflowContext, user: RequestHandler): RouteDefinition[] {
  return [
    portalRoute(user, {
      method: 'POST',
      path: '/sites/:site_id/work-items/:item_id/decision',
      body: 'json',
      handle: async (req, res, scope) => {
        const siteId = pathId(req, 'site_id');
        const itemId = pathId(req, 'item_id');
        const body = requireValid(validateDecisionRequest(req.body));
        const key = idempotencyKey(req);
        const result = await decideWorkItem(ctx, scope, siteId, itemId, body, key);
        if (result.replayed) res.setHeader('Idempotent-Replayed', 'true');
        res.status(200).json(result.item);
      },
      doc: {
        tags: ['work-items'],
        operationId: 'decideWorkItem',
        summary: 'Accept, defer or decline a proposed work item',
        description: `\`proposed\` → \`accepted\` | \`deferred\` | \`declined\`; a \`deferred\` item may be decided again;
\`accepted\` and \`declined\` are final: the same decision again answers 200 unchanged, another one
409 (\`work_item_final\`). \`defer_until\` is required for \`defer\` (and must lie in the future), refused
otherwise. A leap second (RFC 3339 second 60, e.g. \`2030-06-30T23:59:60Z\`) is read as PostgreSQL reads
it, as the first instant of the next minute (\`2030-07-01T00:00:00Z\`), with or without \`Idempotency-Key\`.
An instant that falls in year 10000 in UTC (\`9999-12-31T23:59:60Z\`, \`9999-12-31T23:00:00-05:00\`) is refused
(400, \`/defer_until\`): answers are in UTC, and RFC 3339 has four-digit years.
Each change is appended to the decision audit in the same transaction. Concurrent decisions on
one item are serialised. With \`Idempotency-Key\` the first answer is stored for 24 h
(\`IDEMPOTENCY_TTL_S\`) and replayed to retries (\`Idempotent-Replayed: true\`); the same key with
a different request is a 409 (\`idempotency_key_reused\`; \`conflict\` when a concurrent first use of the key
for another item won).
`,
        parameters: {
          site_id: PATH_IDS.site_id,
          item_id: PATH_IDS.item_id,
          'Idempotency-Key': IDEMPOTENCY_KEY_HEADER,
        },
        requestBody: decisionRequestSchema,
        responses: {
          200: {
            description: "The work item's state after the decision.",
            schema: decisionResponseSchema,
            headers: {
              'Idempotent-Replayed': {
                description: '`true` when this is a stored answer replayed for a repeated Idempotency-Key.',
              },
            },
          },
        },
        errors: ['work_item_final', 'idempotency_key_reused', 'conflict'],
      },
    }),
  ];
}
