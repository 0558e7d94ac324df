// The HTTP edge: parses and validates requests, authenticates, calls the domain, shapes responses.
// Statuses come from DomainError codes; nothing below this file knows about HTTP.
import {
  isUuid,
  validateCompleteUploadRequest,
  validateDecisionRequest,
  validatePartUrlsRequest,
  validateObjectCreatedEvent,
  validateUploadIntentRequest,
} from '@platform/contracts';
import { metricsHandler, requireValid } from '@platform/service-kit';
import type { RouteDefinition, SecretSet } from '@platform/service-kit';
import type { Request, RequestHandler, Response } from 'express';
import type { TokenVerifier } from '../auth/token-verifier.js';
import type { UserScope, WorkflowContext } from '../domain/context.js';
import { decideWorkItem } from '../domain/work-item-decisions.js';
import { ERRORS } from '../domain/errors.js';
import { getDownload } from '../domain/downloads.js';
import { abortUpload, completeUpload, listStoredParts, presignParts } from '../domain/multipart-uploads.js';
import { handleObjectCreated } from '../domain/object-created.js';
import { createUploadIntent } from '../domain/upload-intents.js';
import { portalUser, requireUser, requireWebhookToken, WEBHOOK_PATH } from './auth.js';

export interface RouteDeps {
  ctx: WorkflowContext;
  verifier: TokenVerifier;
  /** The webhook tokens valid now (SIGHUP may replace them). */
  webhookTokens: () => SecretSet;
  /** Readiness: database reachable, signing keys loaded. */
  checkReady: () => Promise<Record<string, 'ok' | 'failed'>>;
}

/** Express 5 forwards rejected promises to the error handler; this only narrows the types. */
type AsyncHandler = (req: Request, res: Response) => Promise<void>;
const handle =
  (fn: AsyncHandler): RequestHandler =>
  (req, res, next) => {
    fn(req, res).catch(next);
  };

/**
 * A path id that is not a UUID cannot name anything: answer as for an unknown resource (404),
 * before touching the database, exactly like an existing id outside the caller's sites.
 */
const notFound = {
  site_id: ERRORS.siteNotFound,
  media_id: ERRORS.mediaNotFound,
  item_id: ERRORS.workItemNotFound,
};

function pathId(req: Request, name: 'site_id' | 'media_id' | 'item_id'): string {
  const value = req.params[name];
  if (!isUuid(value)) throw notFound[name]();
  return value.toLowerCase();
}

/** The caller of a portal route, for the domain: the user requireUser verified, the request's id and log. */
function userScope(req: Request, res: Response): UserScope {
  return { user: portalUser(res), requestId: req.id, log: req.log };
}

/** RFC draft "The Idempotency-Key HTTP Header Field": a quoted or bare string, kept short. */
const IDEMPOTENCY_KEY = /^"?([\x21\x23-\x7e]{1,255})"?$/;

function idempotencyKey(req: Request): string | undefined {
  const raw = req.get('Idempotency-Key');
  if (raw === undefined) return undefined;
  const match = IDEMPOTENCY_KEY.exec(raw.trim());
  if (match === null) throw ERRORS.malformedIdempotencyKey();
  return match[1];
}

export function workflowRoutes(deps: RouteDeps): RouteDefinition[] {
  const { ctx } = deps;
  const user = requireUser(deps.verifier);

  return [
    {
      method: 'GET',
      path: '/health',
      // Liveness: the process answers; no dependency is called (a database outage must not restart pods).
      handler: (_req, res) => {
        res.json({ status: 'ok' });
      },
    },
    {
      method: 'GET',
      path: '/ready',
      handler: handle(async (_req, res) => {
        const checks = await deps.checkReady();
        const failed = Object.entries(checks)
          .filter(([, state]) => state !== 'ok')
          .map(([name]) => name);
        if (failed.length > 0) throw ERRORS.notReady(failed);
        res.json({ status: 'ready', checks });
      }),
    },
    ...(ctx.metrics === undefined
      ? []
      : [
          { method: 'GET', path: '/metrics', handler: metricsHandler(ctx.metrics) } satisfies RouteDefinition,
        ]),
    {
      method: 'POST',
      path: '/sites/:site_id/media/upload-intents',
      authenticate: user,
      body: 'json',
      handler: handle(async (req, res) => {
        const siteId = pathId(req, 'site_id');
        const body = requireValid(validateUploadIntentRequest(req.body));
        const { intent, replayed } = await createUploadIntent(
          ctx,
          userScope(req, res),
          siteId,
          body,
          idempotencyKey(req),
        );
        if (replayed) res.setHeader('Idempotent-Replayed', 'true');
        res.status(201).location(`/sites/${siteId}/media/${intent.media_id}/download`).json(intent);
      }),
    },
    {
      method: 'GET',
      path: '/sites/:site_id/media/:media_id/download',
      authenticate: user,
      handler: handle(async (req, res) => {
        const siteId = pathId(req, 'site_id');
        const mediaId = pathId(req, 'media_id');
        const download = await getDownload(ctx, userScope(req, res), siteId, mediaId);
        // The URL is a short-lived credential: keep it out of shared caches.
        res.setHeader('Cache-Control', 'no-store');
        res.json(download);
      }),
    },
    {
      method: 'POST',
      path: '/sites/:site_id/media/:media_id/multipart/part-urls',
      authenticate: user,
      body: 'json',
      handler: handle(async (req, res) => {
        const siteId = pathId(req, 'site_id');
        const mediaId = pathId(req, 'media_id');
        const body = requireValid(validatePartUrlsRequest(req.body));
        const urls = await presignParts(ctx, userScope(req, res), siteId, mediaId, body);
        // The URLs are short-lived credentials.
        res.setHeader('Cache-Control', 'no-store');
        res.json(urls);
      }),
    },
    {
      method: 'GET',
      path: '/sites/:site_id/media/:media_id/multipart/parts',
      authenticate: user,
      handler: handle(async (req, res) => {
        const siteId = pathId(req, 'site_id');
        const mediaId = pathId(req, 'media_id');
        const parts = await listStoredParts(ctx, userScope(req, res), siteId, mediaId);
        res.setHeader('Cache-Control', 'no-store');
        res.json(parts);
      }),
    },
    {
      method: 'POST',
      path: '/sites/:site_id/media/:media_id/multipart/complete',
      authenticate: user,
      body: 'json',
      handler: handle(async (req, res) => {
        const siteId = pathId(req, 'site_id');
        const mediaId = pathId(req, 'media_id');
        const body = requireValid(validateCompleteUploadRequest(req.body));
        const done = await completeUpload(ctx, userScope(req, res), siteId, mediaId, body);
        // Accepted: the item becomes available when the store reports the assembled object.
        res.status(202).location(`/sites/${siteId}/media/${mediaId}/download`).json(done);
      }),
    },
    {
      method: 'DELETE',
      path: '/sites/:site_id/media/:media_id/multipart',
      authenticate: user,
      handler: handle(async (req, res) => {
        const siteId = pathId(req, 'site_id');
        const mediaId = pathId(req, 'media_id');
        await abortUpload(ctx, userScope(req, res), siteId, mediaId);
        res.status(204).end();
      }),
    },
    {
      method: 'POST',
      path: '/sites/:site_id/work-items/:item_id/decision',
      authenticate: user,
      body: 'json',
      handler: handle(async (req, res) => {
        const siteId = pathId(req, 'site_id');
        const itemId = pathId(req, 'item_id');
        const body = requireValid(validateDecisionRequest(req.body));
        const key = idempotencyKey(req);
        const result = await decideWorkItem(ctx, userScope(req, res), siteId, itemId, body, key);
        if (result.replayed) res.setHeader('Idempotent-Replayed', 'true');
        res.status(200).json(result.item);
      }),
    },
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
    },
    {
      method: 'POST',
      path: WEBHOOK_PATH,
      direct: true,
      authenticate: requireWebhookToken(deps.webhookTokens),
      body: 'json',
      handler: handle(async (req, res) => {
        const event = requireValid(validateObjectCreatedEvent(req.body));
        const result = await handleObjectCreated(ctx, { requestId: req.id, log: req.log }, event);
        res.status(200).json(result);
      }),
    },
  ];
}
