// Uploads in parts (design §4.4): part URLs, stored parts, completion, abort, with their API document entries.
import {
  completeUploadRequestSchema,
  completeUploadResponseSchema,
  partUrlsRequestSchema,
  partUrlsResponseSchema,
  storedPartsResponseSchema,
  validateCompleteUploadRequest,
  validatePartUrlsRequest,
} from '@platform/contracts';
import { requireValid } from '@platform/service-kit';
import type { RouteDefinition } from '@platform/service-kit';
import type { RequestHandler } from 'express';
import type { WorkflowContext } from '../domain/context.js';
import { abortUpload, completeUpload, listStoredParts, presignParts } from '../domain/multipart-uploads.js';
import { mediaIds, PATH_IDS, portalRoute } from './request-parts.js';

const ITEM = { site_id: PATH_IDS.site_id, media_id: PATH_IDS.media_id };
const NO_STORE = {
  'Cache-Control': { description: 'Always `no-store` (the URLs are credentials).', required: true },
};

export function multipartRoutes(ctx: WorkflowContext, user: RequestHandler): RouteDefinition[] {
  return [
    portalRoute(user, {
      method: 'POST',
      path: '/sites/:site_id/media/:media_id/multipart/part-urls',
      body: 'json',
      handle: async (req, res, scope) => {
        const { siteId, mediaId } = mediaIds(req);
        const body = requireValid(validatePartUrlsRequest(req.body));
        const urls = await presignParts(ctx, scope, siteId, mediaId, body);
        // The URLs are short-lived credentials.
        res.setHeader('Cache-Control', 'no-store');
        res.json(urls);
      },
      doc: {
        tags: ['media'],
        operationId: 'presignUploadParts',
        summary: 'Presigned PUT URLs for parts of an upload in parts',
        description: `For an item whose intent answered a \`multipart\` plan: one URL per requested part (at most 100 per
request), each signed for the part's exact length (\`size_bytes\`: \`part_size_bytes\`, the last part
the rest) and, when \`checksum_sha256\` is given, for that SHA-256 (the store refuses other bytes).
PUT the part's bytes with the returned \`headers\`; keep each answer's \`ETag\` header for the
completion (a browser needs the bucket's CORS rule to expose it). A URL lives \`UPLOAD_URL_TTL_S\`
seconds and never past the plan's \`expires_at\`. 404 for unknown items, items outside the
caller's sites, items uploaded with one PUT and another user's upload (an upload in parts, like a
single PUT URL, is only ever its intent's creator's); 409 \`upload_not_pending\` once the item is no longer
pending, \`upload_expired\` once its intent expired; 400 for part numbers above \`part_count\`.
`,
        parameters: ITEM,
        requestBody: partUrlsRequestSchema,
        responses: {
          200: {
            description: 'One URL per requested part.',
            schema: partUrlsResponseSchema,
            headers: NO_STORE,
          },
        },
        errors: ['upload_not_pending', 'upload_expired'],
      },
    }),
    portalRoute(user, {
      method: 'GET',
      path: '/sites/:site_id/media/:media_id/multipart/parts',
      handle: async (req, res, scope) => {
        const { siteId, mediaId } = mediaIds(req);
        const parts = await listStoredParts(ctx, scope, siteId, mediaId);
        res.setHeader('Cache-Control', 'no-store');
        res.json(parts);
      },
      doc: {
        tags: ['media'],
        operationId: 'listStoredParts',
        summary: 'The parts the store already holds (resume after a crash or on another device)',
        description: `The store's own list (ListParts), in part-number order with each part's size and ETag: a client
resuming an upload sends only the parts missing here. 404 and 409 as for part URLs; 409 \`upload_gone\` when
the store no longer has the upload.
`,
        parameters: ITEM,
        responses: {
          200: {
            description: 'The stored parts and the plan.',
            schema: storedPartsResponseSchema,
            headers: { 'Cache-Control': { description: 'Always `no-store`.', required: true } },
          },
        },
        errors: ['upload_not_pending', 'upload_expired', 'upload_gone'],
      },
    }),
    portalRoute(user, {
      method: 'POST',
      path: '/sites/:site_id/media/:media_id/multipart/complete',
      body: 'json',
      handle: async (req, res, scope) => {
        const { siteId, mediaId } = mediaIds(req);
        const body = requireValid(validateCompleteUploadRequest(req.body));
        const done = await completeUpload(ctx, scope, siteId, mediaId, body);
        // Accepted: the item becomes available when the store reports the assembled object.
        res.status(202).location(`/sites/${siteId}/media/${mediaId}/download`).json(done);
      },
      doc: {
        tags: ['media'],
        operationId: 'completeUpload',
        summary: 'Assemble the uploaded parts into the file',
        description: `Only the intent's creator may complete it (404 for anyone else, as for part URLs). Name every part
1..\`part_count\` once with the ETag its PUT answered (else 400). Before asking the
store to assemble them the service checks the store's list: each part stored with that ETag and
exactly its planned length, so the total is the declared \`size_bytes\` (else 409 \`parts_mismatch\` naming
the part). 202: the store assembled the file; like a single PUT, the item becomes available (or rejected)
when the store reports the object and the service has inspected and secured it, which the download
resource shows. A repeated completion of an upload already assembled is 202 again: while its item is
pending (\`status: pending_upload\`), once it is available (\`status: available\`), and after a
completion that timed out at a slow store (a 503) that assembled it anyway.
`,
        parameters: ITEM,
        requestBody: completeUploadRequestSchema,
        responses: {
          202: {
            description: "Assembled; acceptance follows the store's event.",
            schema: completeUploadResponseSchema,
            headers: { Location: { description: "The item's download resource.", required: true } },
          },
        },
        errors: ['upload_not_pending', 'upload_expired', 'upload_gone', 'parts_mismatch'],
      },
    }),
    portalRoute(user, {
      method: 'DELETE',
      path: '/sites/:site_id/media/:media_id/multipart',
      handle: async (req, res, scope) => {
        const { siteId, mediaId } = mediaIds(req);
        await abortUpload(ctx, scope, siteId, mediaId);
        res.status(204).end();
      },
      doc: {
        tags: ['media'],
        operationId: 'abortUpload',
        summary: 'Abort an upload in parts',
        description: `The store discards the upload and its parts; the item becomes \`abandoned\` (final; its download is
404). 404 and 409 as for part URLs; 409 \`upload_assembled\` once the store has assembled the file (a
completion came first): the item is then accepted like any upload. Uploads never completed nor aborted are
aborted by the service's sweep once their intent expired (\`MULTIPART_UPLOAD_TTL_S\`, default 24 h), with the
same outcome.
`,
        parameters: ITEM,
        responses: { 204: { description: 'Aborted.' } },
        errors: ['upload_not_pending', 'upload_assembled'],
      },
    }),
  ];
}
