// The object store seen by the workflow: presigned PUT/GET URLs, HEAD for events that do not carry
// a content type, and DELETE for rejected uploads.
import {
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  HeadBucketCommand,
  PutObjectCommand,
  S3Client,
  S3ServiceException,
} from '@aws-sdk/client-s3';
import { getSignedUrl } from '@aws-sdk/s3-request-presigner';

export interface S3Settings {
  /** Endpoint the service talks to (MinIO, s3rver); undefined = AWS. */
  endpoint: string | undefined;
  /** Endpoint written into presigned URLs when clients reach the store by another name. */
  publicEndpoint: string | undefined;
  region: string;
  bucket: string;
  accessKeyId: string | undefined;
  secretAccessKey: string | undefined;
  forcePathStyle: boolean;
}

export interface PresignedUpload {
  method: 'PUT';
  url: string;
  /** Headers the client must send with exactly these values (they are signed). */
  headers: Record<string, string>;
  expiresAt: Date;
}

export interface PresignedDownload {
  url: string;
  expiresAt: Date;
}

export interface StoredObject {
  sizeBytes: number;
  contentType: string | undefined;
  etag: string | undefined;
}

export interface MediaStorage {
  readonly bucket: string;
  presignUpload(input: {
    key: string;
    contentType: string;
    sizeBytes: number;
    /** Base64 SHA-256 of the body, as S3's `x-amz-checksum-sha256` expects. */
    checksumSha256?: string | undefined;
    expiresInS: number;
    now?: Date;
  }): Promise<PresignedUpload>;
  presignDownload(input: {
    key: string;
    contentDisposition: string;
    contentType: string;
    expiresInS: number;
    now?: Date;
  }): Promise<PresignedDownload>;
  /** undefined when the object does not exist. */
  head(key: string): Promise<StoredObject | undefined>;
  delete(key: string): Promise<void>;
  /** Resolves when the bucket answers; rejects otherwise. */
  ping(): Promise<void>;
  destroy(): void;
}

/** Raised when the store could not be reached or answered with a server error. */
export class StorageUnavailableError extends Error {
  override readonly name = 'StorageUnavailableError';
}

function clientFor(settings: S3Settings, endpoint: string | undefined): S3Client {
  return new S3Client({
    region: settings.region,
    ...(endpoint === undefined ? {} : { endpoint }),
    forcePathStyle: settings.forcePathStyle,
    ...(settings.accessKeyId !== undefined && settings.secretAccessKey !== undefined
      ? { credentials: { accessKeyId: settings.accessKeyId, secretAccessKey: settings.secretAccessKey } }
      : {}),
    // Since @aws-sdk/client-s3 3.729.0 the default (WHEN_SUPPORTED) makes a presigned PutObject carry
    // `x-amz-checksum-crc32=AAAAAA==`, the CRC32 of the empty body present at signing time, so every
    // real upload fails the store's checksum check (aws/aws-sdk-js-v3#6994; checked for the installed
    // 3.1169.0: the parameter is present by default and absent with WHEN_REQUIRED). The response
    // setting likewise keeps `x-amz-checksum-mode` out of presigned GET URLs.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    maxAttempts: 2,
  });
}

function isNotFound(err: unknown): boolean {
  return (
    err instanceof S3ServiceException &&
    (err.$metadata.httpStatusCode === 404 || err.name === 'NotFound' || err.name === 'NoSuchKey')
  );
}

/** Client errors (4xx other than 404) are bugs or misconfiguration; everything else is an outage. */
function asStorageError(err: unknown, what: string): Error {
  if (err instanceof S3ServiceException && (err.$metadata.httpStatusCode ?? 500) < 500) {
    return new Error(`object store refused ${what}: ${err.name} (HTTP ${err.$metadata.httpStatusCode})`, {
      cause: err,
    });
  }
  return new StorageUnavailableError(`object store unreachable during ${what}`, { cause: err });
}

export function createS3Storage(settings: S3Settings): MediaStorage {
  const client = clientFor(settings, settings.endpoint);
  const signer =
    settings.publicEndpoint === undefined || settings.publicEndpoint === settings.endpoint
      ? client
      : clientFor(settings, settings.publicEndpoint);

  return {
    bucket: settings.bucket,

    async presignUpload({ key, contentType, sizeBytes, checksumSha256, expiresInS, now = new Date() }) {
      const command = new PutObjectCommand({
        Bucket: settings.bucket,
        Key: key,
        ContentType: contentType,
        ContentLength: sizeBytes,
        ...(checksumSha256 === undefined ? {} : { ChecksumSHA256: checksumSha256 }),
      });
      const url = await getSignedUrl(signer, command, {
        expiresIn: expiresInS,
        signingDate: now,
        // The S3 presigner adds content-type to its unsignable headers (s3-request-presigner
        // presigner.js prepareRequest); listing it as signable puts it into X-Amz-SignedHeaders so
        // a verifying store refuses any other type.
        signableHeaders: new Set(['content-type']),
        // Kept as a header rather than hoisted into the query: S3 verifies the body against an
        // `x-amz-checksum-sha256` request header, and the signature binds its value.
        unhoistableHeaders: new Set(['x-amz-checksum-sha256']),
      });
      const headers: Record<string, string> = { 'Content-Type': contentType };
      if (checksumSha256 !== undefined) headers['x-amz-checksum-sha256'] = checksumSha256;
      return { method: 'PUT', url, headers, expiresAt: new Date(now.getTime() + expiresInS * 1000) };
    },

    async presignDownload({ key, contentDisposition, contentType, expiresInS, now = new Date() }) {
      const command = new GetObjectCommand({
        Bucket: settings.bucket,
        Key: key,
        ResponseContentDisposition: contentDisposition,
        ResponseContentType: contentType,
      });
      const url = await getSignedUrl(signer, command, { expiresIn: expiresInS, signingDate: now });
      return { url, expiresAt: new Date(now.getTime() + expiresInS * 1000) };
    },

    async head(key) {
      try {
        const out = await client.send(new HeadObjectCommand({ Bucket: settings.bucket, Key: key }));
        return { sizeBytes: out.ContentLength ?? 0, contentType: out.ContentType, etag: out.ETag };
      } catch (err) {
        if (isNotFound(err)) return undefined;
        throw asStorageError(err, 'HEAD object');
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

    async ping() {
      try {
        await client.send(new HeadBucketCommand({ Bucket: settings.bucket }));
      } catch (err) {
        throw asStorageError(err, 'HEAD bucket');
      }
    },

    destroy() {
      client.destroy();
      if (signer !== client) signer.destroy();
    },
  };
}
