// Media rules that do not depend on HTTP, SQL or S3: which files may be uploaded, how objects are
// named, and how a download is labelled. Whether an arrived object matches its intent is decided in SQL
// (enterprise_api.record_object_created), the one place the webhook's writes go through.
import { createHash, randomUUID } from 'node:crypto';
import { mediaKindOf } from '@platform/contracts';
import type { MediaContentType } from '@platform/contracts';

/**
 * The extension used in the generated object key, per allowed content type. Which types are allowed
 * is the contracts schema's decision (`mediaContentTypes`, an exact lower-case match, so the signed
 * Content-Type equals what is stored); a body that passed it has one of these.
 */
const extensions: Record<MediaContentType, string> = {
  'image/jpeg': 'jpg',
  'image/png': 'png',
  'image/webp': 'webp',
  'image/heic': 'heic',
  'video/mp4': 'mp4',
  'video/quicktime': 'mov',
};

export interface MediaLimits {
  /** Largest accepted image, in bytes. */
  maxImageBytes: number;
  /** Largest accepted video, in bytes. */
  maxVideoBytes: number;
}

/** A problem with one field of an intent, as a JSON Pointer and a sentence. */
export interface IntentFieldProblem {
  path: string;
  message: string;
}

/** Checks what the JSON Schema cannot know: the configured size limit of the content type's kind. */
export function checkIntent(
  input: { content_type: MediaContentType; size_bytes: number },
  limits: MediaLimits,
): IntentFieldProblem[] {
  const kind = mediaKindOf(input.content_type);
  const max = kind === 'image' ? limits.maxImageBytes : limits.maxVideoBytes;
  if (input.size_bytes <= max) return [];
  return [
    {
      path: '/size_bytes',
      message: `must be at most ${max} bytes for ${kind === 'image' ? 'an image' : 'a video'}`,
    },
  ];
}

/**
 * The object key is generated here and never derived from the client's filename, so a filename
 * cannot choose, overwrite or traverse keys. Grouping by site keeps a site's objects together for
 * lifecycle rules and audits; the random part (not the media id, which the database assigns) makes
 * keys unguessable and unique.
 */
export function newObjectKey(siteId: string, contentType: MediaContentType): string {
  return `sites/${siteId}/media/${randomUUID()}.${extensions[contentType]}`;
}

const UUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';
/** newObjectKey's shape; the extension is optional because the demo seed writes keys without one. */
const OBJECT_KEY = new RegExp(`^sites/${UUID}/media/${UUID}(?:\\.[a-z0-9]{1,5})?$`);

/** Whether `key` has the shape of a media object key this service generates (see newObjectKey). */
export function isMediaObjectKey(key: string): boolean {
  return OBJECT_KEY.test(key);
}

/** The prefix of every upload key (`sites/<site>/media/<uuid>.<ext>`, newObjectKey). */
export const MEDIA_KEY_PREFIX = 'sites/';

/** Where accepted copies live: a prefix no upload URL ever names (upload keys start with `sites/`). */
export const ACCEPTED_PREFIX = 'accepted/';

/**
 * The key downloads read for an upload accepted with ETag `etag`. An upload URL stays usable for its whole
 * lifetime, so after acceptance it could still replace the object under the upload key; the accepted bytes
 * are therefore copied to this key, which no URL can write. The ETag is part of the key, so bytes of another
 * PUT can never land on the key an accepted item names. Hex ETags (MD5, or MD5-parts) are used as they are,
 * anything else by its SHA-256.
 */
export function acceptedObjectKey(objectKey: string, etag: string): string {
  const part = /^[0-9a-f]{32}(?:-[0-9]{1,5})?$/.test(etag)
    ? etag
    : createHash('sha256').update(etag).digest('hex');
  return `${ACCEPTED_PREFIX}${objectKey}/${part}`;
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
