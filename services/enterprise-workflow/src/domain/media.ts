// Media rules that do not depend on HTTP, SQL or S3: which files may be uploaded, how objects are
// named, and how a download is labelled. Whether an arrived object matches its intent is decided in SQL
// (enterprise_api.record_object_created), the one place the webhook's writes go through.
import { randomUUID } from 'node:crypto';
import type { MediaContentType, MediaKind } from '@platform/contracts';

/** Content types the portal may upload, with the extension used in the generated object key. */
export const allowedContentTypes = {
  'image/jpeg': { kind: 'image', extension: 'jpg' },
  'image/png': { kind: 'image', extension: 'png' },
  'image/webp': { kind: 'image', extension: 'webp' },
  'image/heic': { kind: 'image', extension: 'heic' },
  'video/mp4': { kind: 'video', extension: 'mp4' },
  'video/quicktime': { kind: 'video', extension: 'mov' },
} as const satisfies Record<MediaContentType, { kind: MediaKind; extension: string }>;

export type AllowedContentType = keyof typeof allowedContentTypes;

export interface MediaLimits {
  /** Largest accepted image, in bytes. */
  maxImageBytes: number;
  /** Largest accepted video, in bytes. */
  maxVideoBytes: number;
}

export function isAllowedContentType(contentType: string): contentType is AllowedContentType {
  return Object.hasOwn(allowedContentTypes, contentType);
}

export function maxBytesFor(contentType: AllowedContentType, limits: MediaLimits): number {
  return allowedContentTypes[contentType].kind === 'image' ? limits.maxImageBytes : limits.maxVideoBytes;
}

/** A problem with one field of an intent, as a JSON Pointer and a sentence. */
export interface IntentFieldProblem {
  path: string;
  message: string;
}

/**
 * Checks the parts of an upload intent that a JSON Schema cannot know: the allowed list (matched on
 * the exact, lower-case media type so the signed Content-Type equals what is stored) and the
 * configured size limit of the type's kind.
 */
export function checkIntent(
  input: { content_type: string; size_bytes: number },
  limits: MediaLimits,
): IntentFieldProblem[] {
  if (!isAllowedContentType(input.content_type)) {
    return [
      {
        path: '/content_type',
        message: `must be one of ${Object.keys(allowedContentTypes).join(', ')}`,
      },
    ];
  }
  const max = maxBytesFor(input.content_type, limits);
  if (input.size_bytes > max) {
    const kind = allowedContentTypes[input.content_type].kind;
    return [{ path: '/size_bytes', message: `must be at most ${max} bytes for a ${kind}` }];
  }
  return [];
}

/**
 * The object key is generated here and never derived from the client's filename, so a filename
 * cannot choose, overwrite or traverse keys. Grouping by site keeps a site's objects together for
 * lifecycle rules and audits; the random part (not the media id, which the database assigns) makes
 * keys unguessable and unique.
 */
export function newObjectKey(siteId: string, contentType: AllowedContentType): string {
  return `sites/${siteId}/media/${randomUUID()}.${allowedContentTypes[contentType].extension}`;
}

/**
 * A filename safe to put in `Content-Disposition`: path separators, control characters, quotes and
 * anything outside printable ASCII become `_` in the plain `filename=`; the UTF-8 original (minus
 * path and control characters) travels in `filename*=` (RFC 6266 / RFC 8187).
 */
export function contentDisposition(filename: string): string {
  const base = filename.split(/[\\/]/).pop() ?? '';
  // Control characters (U+0000–U+001F, U+007F) never belong in a header value.
  // eslint-disable-next-line no-control-regex
  const cleaned = base.replace(/[\u0000-\u001f\u007f]/g, '').trim() || 'download';
  const ascii = cleaned.replace(/[^\x20-\x7e]|["\\%;]/g, '_');
  const encoded = encodeURIComponent(cleaned).replace(
    /['()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
  return `attachment; filename="${ascii}"; filename*=UTF-8''${encoded}`;
}

/** ETags arrive quoted from S3 HEAD and unquoted in event records; store them unquoted. */
export function normaliseEtag(etag: string | undefined): string | undefined {
  if (etag === undefined) return undefined;
  const trimmed = etag.trim().replace(/^W\//, '');
  return trimmed.replace(/^"(.*)"$/, '$1') || undefined;
}
