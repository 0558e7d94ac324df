// POST /sites/{site_id}/media/upload-intents (DESIGN 4.4).
import { mediaKindOf } from '@platform/contracts';
import type { UploadIntentRequest, UploadIntentResponse } from '@platform/contracts';
import { DomainError } from '@platform/service-kit';
import { inUserTransaction } from '../db/database.js';
import { insertPendingMedia, missingLinkTargets } from '../db/media.js';
import { siteIsVisible } from '../db/sites.js';
import type { UserScope, WorkflowContext } from './context.js';
import { checkIntent, newObjectKey } from './media.js';

const siteNotFound = () => new DomainError('not_found', 'No such site.');

export async function createUploadIntent(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  body: UploadIntentRequest,
): Promise<UploadIntentResponse> {
  const problems = checkIntent(body, ctx.media);
  if (problems.length > 0) {
    throw new DomainError('invalid_body', 'The upload is not allowed.', { errors: problems });
  }
  const objectKey = newObjectKey(siteId, body.content_type);

  // Signed before anything is written (signing is local computation), so a database failure leaves
  // neither a row without a URL nor a URL-less intent; a URL whose row never committed only leads to
  // an "unknown key" event, which the webhook acknowledges.
  const upload = await ctx.storage.presignUpload({
    key: objectKey,
    contentType: body.content_type,
    sizeBytes: body.size_bytes,
    checksumSha256: body.checksum_sha256,
    expiresInS: ctx.media.uploadUrlTtlS,
    now: ctx.now(),
  });

  const mediaId = await inUserTransaction(ctx.db, scope.user, async (trx) => {
    const links = {
      walkthroughId: body.walkthrough_id,
      workItemId: body.work_item_id,
      assetId: body.asset_id,
    };
    if (links.walkthroughId !== undefined || links.workItemId !== undefined || links.assetId !== undefined) {
      if (!(await siteIsVisible(trx, siteId))) throw siteNotFound();
      const missing = await missingLinkTargets(trx, siteId, links);
      if (missing.length > 0) {
        throw new DomainError('invalid_body', 'A linked record does not exist at this site.', {
          errors: missing.map((field) => ({ path: `/${field}`, message: 'no such record at this site' })),
        });
      }
    }
    const id = await insertPendingMedia(trx, {
      siteId,
      objectKey,
      filename: body.filename,
      contentType: body.content_type,
      declaredSizeBytes: body.size_bytes,
      checksumSha256: body.checksum_sha256,
      ...links,
      uploadedBy: scope.user.sub,
      uploadExpiresAt: upload.expiresAt,
    });
    // RLS decides visibility: a site outside the caller's access looks exactly like no site.
    if (id === undefined) throw siteNotFound();
    return id;
  });

  ctx.counters.intents.inc({ content_kind: mediaKindOf(body.content_type) });
  scope.log.info('upload intent created', {
    media_id: mediaId,
    site_id: siteId,
    size_bytes: body.size_bytes,
  });
  return {
    media_id: mediaId,
    status: 'pending_upload',
    upload: {
      method: upload.method,
      url: upload.url,
      headers: upload.headers,
      expires_at: upload.expiresAt.toISOString(),
    },
  };
}
