// The object-store adapter: implements the domain's MediaStorage port (domain/ports.ts) with the AWS SDK —
// HEAD, copy-if-match, DELETE and the multipart calls of uploads in parts — and turns the SDK's failures into
// the port's StorageUnavailableError and StorageRefusedError. Presigned URLs come from s3-url-signer.ts.
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  ListPartsCommand,
  S3ServiceException,
} from '@aws-sdk/client-s3';
import { StorageRefusedError, StorageUnavailableError } from '../domain/ports.js';
import type { MediaStorage, StoredPart, StoreUpload } from '../domain/ports.js';
import { clientFor, encodeKeySegment } from './s3-client.js';
import type { S3Settings } from './s3-client.js';
import { createUrlSigner } from './s3-url-signer.js';

export type { S3Settings } from './s3-client.js';

function isNoSuchUpload(err: unknown): boolean {
  return (
    err instanceof S3ServiceException && (err.name === 'NoSuchUpload' || err.$metadata.httpStatusCode === 404)
  );
}

/**
 * Ceph RGW's answer to a CompleteMultipartUpload that cannot take the upload's completion lock: 500
 * InternalError "This multipart completion is already in progress" (RGW 16.2). It comes while another
 * completion of the same upload runs, and also after one finished once the assembled object is gone (RGW
 * recognises a repeated completion only by that object's ETag, and the webhook deletes the upload key once it
 * accepted the file): a retry of a completion that timed out at a slow gateway meets it where S3 answers
 * NoSuchUpload.
 */
function isCompletionInProgress(err: unknown): boolean {
  return (
    err instanceof S3ServiceException &&
    err.name === 'InternalError' &&
    /completion is already in progress/i.test(err.message)
  );
}

/** How often, in ms, a completion that met another one asks whether the upload is gone yet. */
const COMPLETION_POLL_MS = 100;

/** The most parts one ListParts answer holds (S3's limit). */
const LIST_PARTS_PAGE = 1000;

function isNotFound(err: unknown): boolean {
  return (
    err instanceof S3ServiceException &&
    (err.$metadata.httpStatusCode === 404 || err.name === 'NotFound' || err.name === 'NoSuchKey')
  );
}

/** Client errors (4xx other than 404) are bugs or misconfiguration; everything else is an outage. */
function asStorageError(err: unknown, what: string): Error {
  if (err instanceof S3ServiceException) {
    const status = err.$metadata.httpStatusCode ?? 500;
    if (status < 500) {
      return new StorageRefusedError(`object store refused ${what}: ${err.name} (HTTP ${status})`, status, {
        cause: err,
      });
    }
  }
  return new StorageUnavailableError(`object store unreachable during ${what}`, { cause: err });
}

export function createS3Storage(settings: S3Settings): MediaStorage {
  const client = clientFor(settings, settings.endpoint);
  // CreateMultipartUpload is not idempotent: every attempt that reaches the store starts an upload, so the
  // SDK's retry of one that timed out (the store slow, not down) leaves an upload nothing records. One attempt;
  // the caller's 503 makes the client retry the intent, and the sweep aborts what a lost answer left behind.
  const once = clientFor(settings, settings.endpoint, 1);
  const urls = createUrlSigner(settings);
  // The calls that may take long on a large object (see S3Settings.longRequestTimeoutMs).
  const long = { requestTimeout: settings.longRequestTimeoutMs ?? 120_000 };

  /** One CompleteMultipartUpload; false on NoSuchUpload, the store's other errors thrown as they are. */
  const completeOnce = async (
    key: string,
    uploadId: string,
    parts: ReadonlyArray<{ partNumber: number; etag: string }>,
  ): Promise<boolean> => {
    try {
      await client.send(
        new CompleteMultipartUploadCommand({
          Bucket: settings.bucket,
          Key: key,
          UploadId: uploadId,
          MultipartUpload: { Parts: parts.map((p) => ({ PartNumber: p.partNumber, ETag: p.etag })) },
        }),
        long,
      );
      return true;
    } catch (err) {
      if (isNoSuchUpload(err)) return false;
      throw err;
    }
  };

  /** Whether the store still holds the upload (a ListParts of one part). */
  const uploadExists = async (key: string, uploadId: string): Promise<boolean> => {
    try {
      await client.send(
        new ListPartsCommand({ Bucket: settings.bucket, Key: key, UploadId: uploadId, MaxParts: 1 }),
      );
      return true;
    } catch (err) {
      if (isNoSuchUpload(err)) return false;
      throw asStorageError(err, 'ListParts');
    }
  };

  return {
    bucket: settings.bucket,
    presignUpload: urls.presignUpload,
    presignDownload: urls.presignDownload,
    presignPart: urls.presignPart,

    async head(key) {
      try {
        const out = await client.send(new HeadObjectCommand({ Bucket: settings.bucket, Key: key }));
        return {
          sizeBytes: out.ContentLength ?? 0,
          contentType: out.ContentType,
          etag: out.ETag,
          lastModified: out.LastModified,
        };
      } catch (err) {
        if (isNotFound(err)) return undefined;
        throw asStorageError(err, 'HEAD object');
      }
    },

    async copy({ source, destination, etag }) {
      try {
        await client.send(
          new CopyObjectCommand({
            Bucket: settings.bucket,
            Key: destination,
            // The SDK wants bucket/key, each key segment URI-encoded.
            CopySource: `${settings.bucket}/${source.split('/').map(encodeKeySegment).join('/')}`,
            CopySourceIfMatch: `"${etag}"`,
          }),
          long,
        );
        return true;
      } catch (err) {
        if (isNotFound(err)) return false;
        if (err instanceof S3ServiceException && err.$metadata.httpStatusCode === 412) return false;
        throw asStorageError(err, 'COPY object');
      }
    },

    async delete(key) {
      try {
        await client.send(new DeleteObjectCommand({ Bucket: settings.bucket, Key: key }));
      } catch (err) {
        if (isNotFound(err)) return;
        throw asStorageError(err, 'DELETE object');
      }
    },

    async createMultipartUpload({ key, contentType }) {
      try {
        const out = await once.send(
          new CreateMultipartUploadCommand({ Bucket: settings.bucket, Key: key, ContentType: contentType }),
        );
        if (out.UploadId === undefined) throw new Error('CreateMultipartUpload answered no UploadId');
        return out.UploadId;
      } catch (err) {
        throw asStorageError(err, 'CreateMultipartUpload');
      }
    },

    async listParts({ key, uploadId }) {
      const parts: StoredPart[] = [];
      let marker: string | undefined;
      try {
        for (;;) {
          const out = await client.send(
            new ListPartsCommand({
              Bucket: settings.bucket,
              Key: key,
              UploadId: uploadId,
              MaxParts: LIST_PARTS_PAGE,
              ...(marker === undefined ? {} : { PartNumberMarker: marker }),
            }),
          );
          for (const part of out.Parts ?? []) {
            if (part.PartNumber === undefined || part.ETag === undefined) continue;
            parts.push({ partNumber: part.PartNumber, sizeBytes: part.Size ?? 0, etag: part.ETag });
          }
          if (out.IsTruncated !== true || out.NextPartNumberMarker === undefined) break;
          marker = out.NextPartNumberMarker;
        }
      } catch (err) {
        if (isNoSuchUpload(err)) return undefined;
        throw asStorageError(err, 'ListParts');
      }
      return parts.sort((a, b) => a.partNumber - b.partNumber);
    },

    async completeMultipartUpload({ key, uploadId, parts }) {
      try {
        return await completeOnce(key, uploadId, parts);
      } catch (err) {
        if (!isCompletionInProgress(err)) throw asStorageError(err, 'CompleteMultipartUpload');
        // Another completion holds the upload (RGW): once the upload is gone that one assembled it, which is
        // what NoSuchUpload says on S3. Still there at the long deadline: an outage, retried by the caller.
        const deadline = Date.now() + long.requestTimeout;
        while (Date.now() < deadline) {
          if (!(await uploadExists(key, uploadId))) return false;
          await new Promise((resolve) => setTimeout(resolve, COMPLETION_POLL_MS));
        }
        throw asStorageError(err, 'CompleteMultipartUpload');
      }
    },

    async listMultipartUploads({ prefix }) {
      const uploads: StoreUpload[] = [];
      let keyMarker: string | undefined;
      let uploadIdMarker: string | undefined;
      try {
        for (;;) {
          const out = await client.send(
            new ListMultipartUploadsCommand({
              Bucket: settings.bucket,
              Prefix: prefix,
              ...(keyMarker === undefined ? {} : { KeyMarker: keyMarker }),
              ...(uploadIdMarker === undefined ? {} : { UploadIdMarker: uploadIdMarker }),
            }),
          );
          for (const upload of out.Uploads ?? []) {
            if (upload.Key === undefined || upload.UploadId === undefined) continue;
            uploads.push({ key: upload.Key, uploadId: upload.UploadId, initiated: upload.Initiated });
          }
          if (out.IsTruncated !== true || out.NextKeyMarker === undefined) break;
          keyMarker = out.NextKeyMarker;
          uploadIdMarker = out.NextUploadIdMarker;
        }
      } catch (err) {
        throw asStorageError(err, 'ListMultipartUploads');
      }
      return uploads;
    },

    async abortMultipartUpload({ key, uploadId }) {
      try {
        await client.send(
          new AbortMultipartUploadCommand({ Bucket: settings.bucket, Key: key, UploadId: uploadId }),
        );
        return true;
      } catch (err) {
        if (isNoSuchUpload(err)) return false;
        throw asStorageError(err, 'AbortMultipartUpload');
      }
    },

    destroy() {
      client.destroy();
      once.destroy();
      urls.destroy();
    },
  };
}
