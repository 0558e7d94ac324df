// Media items uploaded in parts (design §4.4): what the multipart calls read and the one change the
// workflow may make under the caller's claims (an abort), and the sweep's service identity.
import { API_ROLE } from '@platform/enterprise-db';
import type { MediaStatus } from '@platform/enterprise-db';
import { sql } from 'kysely';
import type { Kysely } from 'kysely';
import type { Executor, WorkflowDb } from './database.js';

export interface MultipartMedia {
  id: string;
  status: MediaStatus;
  objectKey: string;
  contentType: string;
  declaredSizeBytes: number;
  /** Null for an item uploaded with one PUT. */
  uploadId: string | null;
  partSizeBytes: number;
  partCount: number;
  uploadExpiresAt: Date | null;
  /** The `sub` of the user whose intent created the item. */
  uploadedBy: string;
}

/** The media item `mediaId` at `siteId` with its multipart plan, if the caller may see it. */
export async function findMultipartMedia(
  db: Executor,
  siteId: string,
  mediaId: string,
): Promise<MultipartMedia | undefined> {
  const row = await db
    .selectFrom('enterprise.media_items')
    .select([
      'id',
      'status',
      'object_key',
      'declared_content_type',
      'declared_size_bytes',
      'multipart_upload_id',
      'part_size_bytes',
      'part_count',
      'upload_expires_at',
      'uploaded_by',
    ])
    .where('id', '=', mediaId)
    .where('site_id', '=', siteId)
    .executeTakeFirst();
  if (row === undefined) return undefined;
  return {
    id: row.id,
    status: row.status,
    objectKey: row.object_key,
    contentType: row.declared_content_type,
    // bigint arrives as a string; media sizes fit a double exactly.
    declaredSizeBytes: Number(row.declared_size_bytes),
    uploadId: row.multipart_upload_id,
    partSizeBytes: Number(row.part_size_bytes ?? 0),
    partCount: row.part_count ?? 0,
    uploadExpiresAt: row.upload_expires_at,
    uploadedBy: row.uploaded_by,
  };
}

/**
 * Marks a pending multipart item of the caller's sites abandoned (the RLS policy allows nothing else), if
 * `uploadedBy` created it. False when it is no longer pending.
 */
export async function markAbandoned(
  db: Executor,
  siteId: string,
  mediaId: string,
  uploadedBy: string,
  reason: string,
): Promise<boolean> {
  const result = await db
    .updateTable('enterprise.media_items')
    .set({ status: 'abandoned', rejection_reason: reason, updated_at: sql<Date>`now()` })
    .where('id', '=', mediaId)
    .where('site_id', '=', siteId)
    .where('uploaded_by', '=', uploadedBy)
    .where('status', '=', 'pending_upload')
    .where('multipart_upload_id', 'is not', null)
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}

export interface ExpiredUpload {
  mediaId: string;
  siteId: string;
  objectKey: string;
  uploadId: string;
  /** When the sweep first found the store had assembled it (its event unhandled then); null until then. */
  assembledSeenAt: Date | null;
  /** Where the next page starts (after this item): its expiry at the database's full precision, and its id. */
  cursor: ExpiredUploadsCursor;
}

/** The last item of a page of expired uploads: the next page starts after it. */
export interface ExpiredUploadsCursor {
  /** upload_expires_at as PostgreSQL writes it (microseconds, which a Date would round away). */
  expiresAt: string;
  id: string;
}

/**
 * The sweep has no caller, so no claims: it reads and writes through SECURITY DEFINER functions of
 * `enterprise_media_ingest` that only see pending multipart items whose intent expired.
 */
async function asService<T>(db: Kysely<WorkflowDb>, fn: (trx: Kysely<WorkflowDb>) => Promise<T>): Promise<T> {
  return db.transaction().execute(async (trx) => {
    await sql`SELECT set_config('role', ${API_ROLE}, true)`.execute(trx);
    return fn(trx);
  });
}

/**
 * A page of the pending multipart items whose intent expired before `before`, oldest first, after `after` (the
 * previous page's last item): the sweep reads every page, so items that stay pending (left to their event, a
 * store that failed) never hide the ones behind them.
 */
export async function expiredMultipartUploads(
  db: Kysely<WorkflowDb>,
  before: Date,
  after: ExpiredUploadsCursor | undefined,
  limit: number,
): Promise<ExpiredUpload[]> {
  return asService(db, async (trx) => {
    const { rows } = await sql<{
      media_id: string;
      site_id: string;
      object_key: string;
      upload_id: string;
      upload_expires_at: string;
      assembled_seen_at: Date | null;
    }>`
      SELECT * FROM enterprise_api.expired_multipart_uploads(${before}::timestamptz,
        ${after?.expiresAt ?? null}::timestamptz, ${after?.id ?? null}::uuid, ${limit}::integer)`.execute(
      trx,
    );
    return rows.map((r) => ({
      mediaId: r.media_id,
      siteId: r.site_id,
      objectKey: r.object_key,
      uploadId: r.upload_id,
      assembledSeenAt: r.assembled_seen_at,
      cursor: { expiresAt: r.upload_expires_at, id: r.media_id },
    }));
  });
}

/**
 * Records, once, that the store has assembled the expired upload of `mediaId` while its event is unhandled;
 * the instant it was first recorded, or undefined when the item is no longer a pending expired upload.
 */
export async function noteUploadAssembled(
  db: Kysely<WorkflowDb>,
  mediaId: string,
): Promise<Date | undefined> {
  return asService(db, async (trx) => {
    const { rows } = await sql<{ seen: Date | null }>`
      SELECT enterprise_api.note_upload_assembled(${mediaId}::uuid) AS seen`.execute(trx);
    return rows[0]?.seen ?? undefined;
  });
}

/** Marks an expired pending multipart item abandoned; false when it is no longer one. */
export async function recordUploadAbandoned(
  db: Kysely<WorkflowDb>,
  mediaId: string,
  reason: string,
): Promise<boolean> {
  return asService(db, async (trx) => {
    const { rows } = await sql<{ changed: boolean }>`
      SELECT enterprise_api.record_upload_abandoned(${mediaId}::uuid, ${reason}) AS changed`.execute(trx);
    return rows[0]?.changed === true;
  });
}

/**
 * Of the store's open uploads `uploads`, those no pending media item names (at most 1000): what the sweep may
 * abort once they are old enough. Through the ingest role's definer function (no caller, no claims).
 */
export async function unclaimedUploads(
  db: Kysely<WorkflowDb>,
  uploads: ReadonlyArray<{ key: string; uploadId: string }>,
): Promise<Array<{ key: string; uploadId: string }>> {
  if (uploads.length === 0) return [];
  return asService(db, async (trx) => {
    const { rows } = await sql<{ object_key: string; upload_id: string }>`
      SELECT * FROM enterprise_api.unclaimed_multipart_uploads(
        ${uploads.map((u) => u.key)}::text[], ${uploads.map((u) => u.uploadId)}::text[])`.execute(trx);
    return rows.map((r) => ({ key: r.object_key, uploadId: r.upload_id }));
  });
}

/**
 * How many uploads in parts are open (pending, planned or started, intent not expired) for `uploadedBy` (at the
 * sites the caller may see) and at `siteId`, after taking the transaction-scoped locks that serialise intents in
 * parts of one uploader and of one site: the count is then the one this transaction's insert adds to, so racing
 * intents cannot all pass a cap at once. The locks are the uploader's and the site's rows of
 * `enterprise.multipart_gates`, taken uploader first, then site, in every transaction, so two intents never wait on
 * each other in a cycle; unlike advisory locks, no other login can hold them. Counted on the partial indexes of migration 0013.
 */
export async function lockAndCountOpenUploads(
  db: Executor,
  uploadedBy: string,
  siteId: string,
): Promise<{ byUploader: number; atSite: number }> {
  // Row locks on the workflow's own table (enterprise migration 0016), which no other login may write or lock. The
  // site's row only for a site the caller may see (the table's policy allows no other); for another the intent's
  // insert is refused afterwards as before (404), and there is nothing to serialise.
  await sql`INSERT INTO enterprise.multipart_gates AS g (gate) VALUES (${`uploader:${uploadedBy}`})
    ON CONFLICT (gate) DO UPDATE SET gate = g.gate`.execute(db);
  await sql`INSERT INTO enterprise.multipart_gates AS g (gate)
    SELECT ${`site:${siteId}`} WHERE ${siteId}::text = ANY ((SELECT enterprise_api.authorized_site_ids())::text[])
    ON CONFLICT (gate) DO UPDATE SET gate = g.gate`.execute(db);
  const { rows } = await sql<{ by_uploader: number; at_site: number }>`
    SELECT
      (SELECT count(*)::integer FROM enterprise.media_items
        WHERE uploaded_by = ${uploadedBy} AND status = 'pending_upload' AND part_count IS NOT NULL
          AND upload_expires_at > now()) AS by_uploader,
      (SELECT count(*)::integer FROM enterprise.media_items
        WHERE site_id = ${siteId}::uuid AND status = 'pending_upload' AND part_count IS NOT NULL
          AND upload_expires_at > now()) AS at_site`.execute(db);
  return { byUploader: rows[0]?.by_uploader ?? 0, atSite: rows[0]?.at_site ?? 0 };
}

/**
 * Sets the store's upload id on the caller's own planned item (recorded without one, design §4.4): once, while
 * it is pending and has none. False when it is no longer such an item (a concurrent start won, or it was
 * abandoned); the RLS policy allows nothing else.
 */
export async function setUploadId(db: Executor, mediaId: string, uploadId: string): Promise<boolean> {
  const result = await db
    .updateTable('enterprise.media_items')
    .set({ multipart_upload_id: uploadId, updated_at: sql<Date>`now()` })
    .where('id', '=', mediaId)
    .where('status', '=', 'pending_upload')
    .where('multipart_upload_id', 'is', null)
    .where('part_count', 'is not', null)
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}

/** The upload id of the caller's item `mediaId` now (after a concurrent start), if it has one. */
export async function currentUploadId(db: Executor, mediaId: string): Promise<string | null | undefined> {
  const row = await db
    .selectFrom('enterprise.media_items')
    .select(['multipart_upload_id', 'status'])
    .where('id', '=', mediaId)
    .executeTakeFirst();
  return row === undefined || row.status !== 'pending_upload' ? undefined : row.multipart_upload_id;
}

/** Abandons the caller's own planned item whose upload could not be started; false when it is no longer one. */
export async function abandonUnstarted(db: Executor, mediaId: string, reason: string): Promise<boolean> {
  const result = await db
    .updateTable('enterprise.media_items')
    .set({ status: 'abandoned', rejection_reason: reason, updated_at: sql<Date>`now()` })
    .where('id', '=', mediaId)
    .where('status', '=', 'pending_upload')
    .where('multipart_upload_id', 'is', null)
    .where('part_count', 'is not', null)
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}

/** The sweep: abandons planned items created before `before` whose store upload was never started. */
export async function abandonUnstartedUploads(
  db: Kysely<WorkflowDb>,
  before: Date,
  limit: number,
): Promise<number> {
  return asService(db, async (trx) => {
    const { rows } = await sql<{ n: number }>`
      SELECT enterprise_api.abandon_unstarted_multipart_uploads(${before}::timestamptz, ${limit}::integer) AS n`.execute(
      trx,
    );
    return rows[0]?.n ?? 0;
  });
}
