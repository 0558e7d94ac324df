// The workflow's ports: what its use cases need from the outside, as interfaces the domain owns. The
// adapters implement them (storage/s3-store.ts and s3-url-signer.ts for the object store, auth/token-verifier.ts for callers), so
// nothing in src/domain imports an SDK, a transport or its error classes (design §4.4).

/** The caller of a portal request, as a verified token describes it. */
export interface PortalUser {
  sub: string;
  /** Every claim of the token, carried into the database as `request.jwt.claims` for RLS. */
  claims: Readonly<Record<string, unknown>> & { sub: string; role: string };
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
  /** The store's Last-Modified (whole seconds over HTTP); undefined if it did not say. */
  lastModified: Date | undefined;
}

/** A part of a multipart upload, as the store lists it. */
export interface StoredPart {
  partNumber: number;
  sizeBytes: number;
  /** As the store gives it (quoted). */
  etag: string;
}

/** An upload in parts the store holds open (started, neither completed nor aborted). */
export interface StoreUpload {
  key: string;
  uploadId: string;
  /** When the store started it; undefined if it did not say. */
  initiated: Date | undefined;
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
  /**
   * Server-side copy of `source` to `destination`, asking the store to copy only if `source` still has the
   * ETag `etag` (S3's `x-amz-copy-source-if-match`). True once the store made the copy; false when the source
   * is gone or no longer that version (404, 412). Not every store honours the condition, and the copy's own
   * ETag need not be the source's (design §4.6): what the copy holds is for the caller to establish.
   */
  copy(input: { source: string; destination: string; etag: string }): Promise<boolean>;
  delete(key: string): Promise<void>;
  /** Starts a multipart upload of `key` with this Content-Type; returns the store's upload id. */
  createMultipartUpload(input: { key: string; contentType: string }): Promise<string>;
  /**
   * A presigned UploadPart URL that binds the part's Content-Length and, when given, its
   * `x-amz-checksum-sha256`.
   */
  presignPart(input: {
    key: string;
    uploadId: string;
    partNumber: number;
    sizeBytes: number;
    checksumSha256?: string | undefined;
    expiresInS: number;
    now?: Date;
  }): Promise<PresignedUpload>;
  /** Every part stored so far, in part-number order; undefined when the upload does not exist (any more). */
  listParts(input: { key: string; uploadId: string }): Promise<StoredPart[] | undefined>;
  /** Assembles the object from these parts; false when the upload does not exist (any more). */
  completeMultipartUpload(input: {
    key: string;
    uploadId: string;
    parts: ReadonlyArray<{ partNumber: number; etag: string }>;
  }): Promise<boolean>;
  /** Every upload the store holds open under `prefix` (ListMultipartUploads, all pages). */
  listMultipartUploads(input: { prefix: string }): Promise<StoreUpload[]>;
  /** Discards the upload and its parts; false when it did not exist (any more). */
  abortMultipartUpload(input: { key: string; uploadId: string }): Promise<boolean>;
  destroy(): void;
}

/**
 * Raised by the store adapter when the store could not be reached or answered with a server error; use
 * cases turn it into 503 `backend_unavailable`.
 */
export class StorageUnavailableError extends Error {
  override readonly name = 'StorageUnavailableError';
}

/**
 * Raised when the store answered a request of ours with a client error other than 404 (403 for
 * missing permissions or a wrong secret, 400 for a request it does not understand): the store is up,
 * but this service is misconfigured towards it. `status` is the store's HTTP status.
 */
export class StorageRefusedError extends Error {
  override readonly name = 'StorageRefusedError';

  constructor(
    message: string,
    readonly status: number,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}
