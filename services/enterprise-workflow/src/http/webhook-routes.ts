// The object store's webhook (design §4.4), with its entries in the API document.
import {
  objectCreatedEventSchema,
  validateObjectCreatedEvent,
  webhookResultSchema,
} from '@platform/contracts';
import { requireValid } from '@platform/service-kit';
import type { RouteDefinition, SecretSet } from '@platform/service-kit';
import type { WorkflowContext } from '../domain/context.js';
import { handleObjectCreated } from '../domain/object-created.js';
import { requireWebhookToken, WEBHOOK_PATH } from './auth.js';
import { handle } from './request-parts.js';

export function webhookRoutes(ctx: WorkflowContext, tokens: () => SecretSet): RouteDefinition[] {
  return [
    {
      method: 'HEAD',
      path: WEBHOOK_PATH,
      // Internal: the store calls it straight, not through the Ingress (design §5), so X-Forwarded-For on it
      // is whatever the caller wrote; the log names the connection's peer.
      direct: true,
      // Older MinIO releases probe the target with HEAD when it is configured (design §4.4); the
      // probe carries no token, and answering it reveals nothing.
      handler: (_req, res) => {
        res.status(200).end();
      },
      doc: {
        tags: ['internal'],
        operationId: 'probeObjectCreatedWebhook',
        summary: 'Reachability probe (older MinIO releases send HEAD when the target is configured)',
        responses: { 200: { description: 'The webhook is served here.' } },
      },
    },
    {
      method: 'POST',
      path: WEBHOOK_PATH,
      direct: true,
      authenticate: requireWebhookToken(tokens),
      body: 'json',
      handler: handle(async (req, res) => {
        const event = requireValid(validateObjectCreatedEvent(req.body));
        const result = await handleObjectCreated(ctx, { requestId: req.id, log: req.log }, event);
        res.status(200).json(result);
      }),
      doc: {
        tags: ['internal'],
        operationId: 'objectCreated',
        summary: 'Object-store notification webhook (MinIO webhook body or S3 event records)',
        description: `For each ObjectCreated record of a pending media item: marks it \`available\` (size and type
match the intent) or \`rejected\` (and deletes the object). Redeliveries change nothing
(\`duplicate\`); unknown keys (including keys no media item can have, such as one containing
NUL), other buckets and other events are acknowledged with 200 and logged. An \`eTag\` or
\`contentType\` with control characters, or a \`size\` above 2^53 - 1, is a malformed body (400).
Any outage of the database or object store, and a refusal of the service's own lookup (HEAD)
by the store, answers 503 so the store retries (MinIO only retries with a \`queue_dir\`).
Tokens: \`WEBHOOK_TOKENS\` / \`WEBHOOK_TOKENS_FILE\`, several valid at once.
`,
        security: ['webhookToken'],
        requestBody: objectCreatedEventSchema,
        responses: { 200: { description: 'Every record handled.', schema: webhookResultSchema } },
        errors: ['unauthorized', 'backend_unavailable'],
      },
    },
  ];
}
