// GET /sites/{site_id}/media/{media_id}/download (design §4.4).
import type { DownloadResponse, MediaContentType } from '@platform/contracts';
import { inUserTransaction } from '../db/database.js';
import { findMediaAtSite } from '../db/media-repository.js';
import type { UserScope, WorkflowContext } from './context.js';
import { ERRORS } from './errors.js';
import { acceptedObjectKey, contentDisposition } from './media-rules.js';

export async function getDownload(
  ctx: WorkflowContext,
  scope: UserScope,
  siteId: string,
  mediaId: string,
): Promise<DownloadResponse> {
  const media = await inUserTransaction(ctx.db, scope.user, (trx) => findMediaAtSite(trx, siteId, mediaId));
  // An abandoned upload never arrived: the same 404 as an unknown id or another site's item.
  if (media === undefined || media.status === 'abandoned') throw ERRORS.mediaNotFound();
  // A rejected one arrived and was refused (its size or type broke the intent): its uploader must learn why
  // rather than look for an item that "does not exist" (design §4.4).
  if (media.status === 'rejected') throw ERRORS.mediaRejected(media.rejectionReason);
  if (media.status === 'pending_upload') throw ERRORS.mediaPending();
  const signed = await ctx.storage.presignDownload({
    // The accepted copy, which no upload URL can overwrite (see acceptedObjectKey). An item without an ETag
    // (the demo seed's) is served from its upload key.
    key: media.etag === null ? media.objectKey : acceptedObjectKey(media.objectKey, media.etag),
    contentDisposition: contentDisposition(media.filename),
    contentType: media.contentType,
    expiresInS: ctx.media.downloadUrlTtlS,
    now: ctx.now(),
  });
  return {
    media_id: media.id,
    url: signed.url,
    expires_at: signed.expiresAt.toISOString(),
    content_type: media.contentType as MediaContentType,
    size_bytes: media.sizeBytes,
    filename: media.filename,
  };
}
