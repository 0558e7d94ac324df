// The object-store adapter: implements the domain's MediaStorage port (domain/ports.ts) with the AWS SDK —
// presigned PUT/GET URLs, HEAD, copy-if-match, DELETE and the multipart calls of uploads in parts — and
// turns the SDK's failures into the port's StorageUnavailableError and StorageRefusedError.
import {
  AbortMultipartUploadCommand,
  CompleteMultipartUploadCommand,
  CopyObjectCommand,
  CreateMultipartUploadCommand,
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListMultipartUploadsCommand,
  ListPartsCommand,
  PutObjectCommand,
  S3Client,
  S3ServiceException,
  UploadPartCommand,
} from '@aws-sdk/client-s3';
import { createHash, createHmac, createSecretKey, type KeyObject } from 'node:crypto';
import { getSignedUrl, S3RequestPresigner } from '@aws-sdk/s3-request-presigner';
import { StorageRefusedError, StorageUnavailableError } from '../domain/ports.js';
import type { MediaStorage, StoredPart, StoreUpload } from '../domain/ports.js';

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
  /**
   * Deadlines of one request to the store, in ms: to open the connection, and for the whole request (the
   * SDK's NodeHttpHandler `connectionTimeout` and `requestTimeout`). A frozen store otherwise holds a
   * webhook call for as long as it stays frozen. With two attempts, a call gives up after about twice the
   * request deadline and the caller gets 503 with Retry-After. Defaults 2000 and 3000.
   */
  connectTimeoutMs?: number | undefined;
  requestTimeoutMs?: number | undefined;
}

function clientFor(settings: S3Settings, endpoint: string | undefined, maxAttempts = 2): S3Client {
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
    // setting likewise keeps `x-amz-checksum-mode` out of presigned GET URLs. Only getSignedUrl (AWS,
    // no custom endpoint) goes through these middlewares; test/presign.test.ts checks that path.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    maxAttempts,
    requestHandler: {
      connectionTimeout: settings.connectTimeoutMs ?? 2000,
      requestTimeout: settings.requestTimeoutMs ?? 3000,
      // @smithy/node-http-handler 4.x only logs a warning at requestTimeout unless told to end the request.
      throwOnRequestTimeout: true,
    },
  });
}

function isNoSuchUpload(err: unknown): boolean {
  return (
    err instanceof S3ServiceException && (err.name === 'NoSuchUpload' || err.$metadata.httpStatusCode === 404)
  );
}

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

/** S3's URI encoding of one key segment (RFC 3986 unreserved kept), as the SDK's Key label. */
function encodeKeySegment(segment: string): string {
  return encodeURIComponent(segment).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
}

/** Encodes a query name or value the way the SDK's URL formatter does. */
const encodeQuery = encodeKeySegment;

interface PresignTarget {
  protocol: string;
  hostname: string;
  port: number | undefined;
  /** Path prefix before the key: `/bucket` (path style) or empty (virtual host). */
  prefix: string;
}

/**
 * Where presigned URLs of a custom endpoint (MinIO, s3rver) point. A bucket name with dots cannot be a
 * TLS-safe virtual host, so it is addressed path-style, as the SDK does.
 */
function presignTarget(endpoint: string, bucket: string, forcePathStyle: boolean): PresignTarget {
  const url = new URL(endpoint);
  const port = url.port === '' ? undefined : Number(url.port);
  const basePath = url.pathname.replace(/\/+$/, '');
  if (forcePathStyle || bucket.includes('.')) {
    return { protocol: url.protocol, hostname: url.hostname, port, prefix: `${basePath}/${bucket}` };
  }
  return { protocol: url.protocol, hostname: `${bucket}.${url.hostname}`, port, prefix: basePath };
}

/**
 * Presigning without the command pipeline. `getSignedUrl` resolves the endpoint ruleset, clones the
 * middleware stack and builds a new presigner on every call (the largest cost of an upload intent;
 * figures in docs/benchmarks.md); with a fixed custom endpoint the request to sign is
 * known, so it is built directly and signed by the SDK's own S3RequestPresigner (SigV4, the client's
 * credential provider and hash). test/presign.test.ts checks the URLs equal `getSignedUrl`'s.
 */
function fastPresigner(client: S3Client, settings: S3Settings, endpoint: string) {
  const target = presignTarget(endpoint, settings.bucket, settings.forcePathStyle);
  const presigner = new S3RequestPresigner({ ...client.config, region: settings.region });
  const host = `${target.hostname}${target.port === undefined ? '' : `:${target.port}`}`;
  return async (input: {
    method: 'PUT' | 'GET';
    key: string;
    headers: Record<string, string>;
    query: Record<string, string>;
    expiresInS: number;
    signingDate: Date;
    signableHeaders?: Set<string>;
    unhoistableHeaders?: Set<string>;
  }): Promise<string> => {
    const path = `${target.prefix}/${input.key.split('/').map(encodeKeySegment).join('/')}`;
    const signed = await presigner.presign(
      {
        method: input.method,
        protocol: target.protocol,
        hostname: target.hostname,
        ...(target.port === undefined ? {} : { port: target.port }),
        path,
        query: { ...input.query },
        headers: { host, ...input.headers },
      },
      {
        expiresIn: input.expiresInS,
        signingDate: input.signingDate,
        ...(input.signableHeaders === undefined ? {} : { signableHeaders: input.signableHeaders }),
        ...(input.unhoistableHeaders === undefined ? {} : { unhoistableHeaders: input.unhoistableHeaders }),
      },
    );
    const query = Object.entries(signed.query ?? {})
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .flatMap(([name, value]) =>
        value === null
          ? []
          : (Array.isArray(value) ? value : [value]).map((v) => `${encodeQuery(name)}=${encodeQuery(v)}`),
      )
      .join('&');
    return `${target.protocol}//${host}${path}${query === '' ? '' : `?${query}`}`;
  };
}

const hmac = (key: Buffer | string, data: string): Buffer => createHmac('sha256', key).update(data).digest();

/** SigV4's basic ISO 8601 instant, e.g. 20261125T000000Z. */
function amzDate(date: Date): string {
  return date
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d{3}/, '');
}

/**
 * Part URLs signed without the SDK, for static credentials and a custom endpoint. A request for 100 part
 * URLs spent about 8 ms of CPU in the SDK's presigner (request cloning, header and query bookkeeping, a
 * promise per step: ~80 µs a URL); a part URL is one canonical request, one SHA-256 and one HMAC with the
 * day's signing key, which this does directly (AWS Signature Version 4, "Authenticating requests: using
 * query parameters"). test/presign.test.ts checks the URLs equal getSignedUrl's for UploadPart.
 */
function directPartSigner(settings: S3Settings, endpoint: string) {
  const { accessKeyId, secretAccessKey } = settings;
  if (accessKeyId === undefined || secretAccessKey === undefined) return undefined;
  const target = presignTarget(endpoint, settings.bucket, settings.forcePathStyle);
  const host = `${target.hostname}${target.port === undefined ? '' : `:${target.port}`}`;
  // The day's kSigning as a KeyObject, made once per day: given a Buffer key, createHmac first tries
  // isKeyObject()/isCryptoKey() on it, and on Node 24 each throws and catches an exception (~10 µs a call
  // against ~2 µs with a KeyObject; `npm run bench:keys`).
  const signingKeys = new Map<string, KeyObject>();
  const signingKey = (day: string): KeyObject => {
    let key = signingKeys.get(day);
    if (key === undefined) {
      key = createSecretKey(
        hmac(hmac(hmac(hmac(`AWS4${secretAccessKey}`, day), settings.region), 's3'), 'aws4_request'),
      );
      if (signingKeys.size > 4) signingKeys.clear();
      signingKeys.set(day, key);
    }
    return key;
  };
  return (input: {
    key: string;
    uploadId: string;
    partNumber: number;
    sizeBytes: number;
    checksumSha256: string | undefined;
    expiresInS: number;
    signingDate: Date;
  }): string => {
    const instant = amzDate(input.signingDate);
    const day = instant.slice(0, 8);
    const scope = `${day}/${settings.region}/s3/aws4_request`;
    const path = `${target.prefix}/${input.key.split('/').map(encodeKeySegment).join('/')}`;
    const headers: Array<[string, string]> = [
      ['content-length', String(input.sizeBytes)],
      ['host', host],
      ...(input.checksumSha256 === undefined
        ? []
        : ([['x-amz-checksum-sha256', input.checksumSha256]] as Array<[string, string]>)),
    ];
    const signedHeaders = headers.map(([name]) => name).join(';');
    const query: Array<[string, string]> = [
      ['X-Amz-Algorithm', 'AWS4-HMAC-SHA256'],
      ['X-Amz-Content-Sha256', 'UNSIGNED-PAYLOAD'],
      ['X-Amz-Credential', `${accessKeyId}/${scope}`],
      ['X-Amz-Date', instant],
      ['X-Amz-Expires', String(input.expiresInS)],
      ['X-Amz-SignedHeaders', signedHeaders],
      ['partNumber', String(input.partNumber)],
      ['uploadId', input.uploadId],
      ['x-id', 'UploadPart'],
    ];
    const canonicalQuery = query
      .map(([name, value]) => `${encodeQuery(name)}=${encodeQuery(value)}`)
      .join('&');
    const canonicalRequest = [
      'PUT',
      path,
      canonicalQuery,
      headers.map(([name, value]) => `${name}:${value}\n`).join(''),
      signedHeaders,
      'UNSIGNED-PAYLOAD',
    ].join('\n');
    const stringToSign = [
      'AWS4-HMAC-SHA256',
      instant,
      scope,
      createHash('sha256').update(canonicalRequest).digest('hex'),
    ].join('\n');
    const signature = createHmac('sha256', signingKey(day)).update(stringToSign).digest('hex');
    // In sorted order, as the SDK's URL formatter writes them: X-Amz-Signature between Expires and SignedHeaders.
    const all = [...query.slice(0, 5), ['X-Amz-Signature', signature], ...query.slice(5)];
    return `${target.protocol}//${host}${path}?${all.map(([n, v]) => `${encodeQuery(n!)}=${encodeQuery(v!)}`).join('&')}`;
  };
}

export function createS3Storage(settings: S3Settings): MediaStorage {
  const client = clientFor(settings, settings.endpoint);
  const signer =
    settings.publicEndpoint === undefined || settings.publicEndpoint === settings.endpoint
      ? client
      : clientFor(settings, settings.publicEndpoint);
  // CreateMultipartUpload is not idempotent: every attempt that reaches the store starts an upload, so the
  // SDK's retry of one that timed out (the store slow, not down) leaves an upload nothing records. One attempt;
  // the caller's 503 makes the client retry the intent, and the sweep aborts what a lost answer left behind.
  const once = clientFor(settings, settings.endpoint, 1);
  const signingEndpoint = settings.publicEndpoint ?? settings.endpoint;
  // On AWS itself (no endpoint configured) the SDK's endpoint rules decide host and region: keep
  // getSignedUrl there.
  const fast = signingEndpoint === undefined ? undefined : fastPresigner(signer, settings, signingEndpoint);
  const partSigner = signingEndpoint === undefined ? undefined : directPartSigner(settings, signingEndpoint);

  return {
    bucket: settings.bucket,

    async presignUpload({ key, contentType, sizeBytes, checksumSha256, expiresInS, now = new Date() }) {
      const options = {
        expiresIn: expiresInS,
        signingDate: now,
        // The S3 presigner adds content-type to its unsignable headers (s3-request-presigner
        // presigner.js prepareRequest); listing it as signable puts it into X-Amz-SignedHeaders so
        // a verifying store refuses any other type.
        signableHeaders: new Set(['content-type']),
        // Kept as a header rather than hoisted into the query: S3 verifies the body against an
        // `x-amz-checksum-sha256` request header, and the signature binds its value.
        unhoistableHeaders: new Set(['x-amz-checksum-sha256']),
      };
      const url =
        fast === undefined
          ? await getSignedUrl(
              signer,
              new PutObjectCommand({
                Bucket: settings.bucket,
                Key: key,
                ContentType: contentType,
                ContentLength: sizeBytes,
                ...(checksumSha256 === undefined ? {} : { ChecksumSHA256: checksumSha256 }),
              }),
              options,
            )
          : await fast({
              method: 'PUT',
              key,
              headers: {
                'content-type': contentType,
                'content-length': String(sizeBytes),
                ...(checksumSha256 === undefined ? {} : { 'x-amz-checksum-sha256': checksumSha256 }),
              },
              // The SDK's operation hint, kept so URLs equal getSignedUrl's byte for byte.
              query: { 'x-id': 'PutObject' },
              expiresInS,
              signingDate: now,
              signableHeaders: options.signableHeaders,
              unhoistableHeaders: options.unhoistableHeaders,
            });
      const headers: Record<string, string> = { 'Content-Type': contentType };
      if (checksumSha256 !== undefined) headers['x-amz-checksum-sha256'] = checksumSha256;
      return { method: 'PUT', url, headers, expiresAt: new Date(now.getTime() + expiresInS * 1000) };
    },

    async presignDownload({ key, contentDisposition, contentType, expiresInS, now = new Date() }) {
      const url =
        fast === undefined
          ? await getSignedUrl(
              signer,
              new GetObjectCommand({
                Bucket: settings.bucket,
                Key: key,
                ResponseContentDisposition: contentDisposition,
                ResponseContentType: contentType,
              }),
              { expiresIn: expiresInS, signingDate: now },
            )
          : await fast({
              method: 'GET',
              key,
              headers: {},
              query: {
                'response-content-disposition': contentDisposition,
                'response-content-type': contentType,
                'x-id': 'GetObject',
              },
              expiresInS,
              signingDate: now,
            });
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

    async copy({ source, destination, etag }) {
      try {
        const out = await client.send(
          new CopyObjectCommand({
            Bucket: settings.bucket,
            Key: destination,
            // The SDK wants bucket/key, each key segment URI-encoded.
            CopySource: `${settings.bucket}/${source.split('/').map(encodeKeySegment).join('/')}`,
            CopySourceIfMatch: `"${etag}"`,
          }),
        );
        return out.CopyObjectResult?.ETag;
      } catch (err) {
        if (isNotFound(err)) return undefined;
        if (err instanceof S3ServiceException && err.$metadata.httpStatusCode === 412) return undefined;
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

    async presignPart({
      key,
      uploadId,
      partNumber,
      sizeBytes,
      checksumSha256,
      expiresInS,
      now = new Date(),
    }) {
      // As for a single PUT: the checksum stays a (signed) header, the length is signed.
      const unhoistableHeaders = new Set(['x-amz-checksum-sha256']);
      const url =
        partSigner !== undefined
          ? partSigner({ key, uploadId, partNumber, sizeBytes, checksumSha256, expiresInS, signingDate: now })
          : fast === undefined
            ? await getSignedUrl(
                signer,
                new UploadPartCommand({
                  Bucket: settings.bucket,
                  Key: key,
                  UploadId: uploadId,
                  PartNumber: partNumber,
                  ContentLength: sizeBytes,
                  ...(checksumSha256 === undefined ? {} : { ChecksumSHA256: checksumSha256 }),
                }),
                { expiresIn: expiresInS, signingDate: now, unhoistableHeaders },
              )
            : await fast({
                method: 'PUT',
                key,
                headers: {
                  'content-length': String(sizeBytes),
                  ...(checksumSha256 === undefined ? {} : { 'x-amz-checksum-sha256': checksumSha256 }),
                },
                query: { partNumber: String(partNumber), uploadId, 'x-id': 'UploadPart' },
                expiresInS,
                signingDate: now,
                unhoistableHeaders,
              });
      const headers: Record<string, string> = {};
      if (checksumSha256 !== undefined) headers['x-amz-checksum-sha256'] = checksumSha256;
      return { method: 'PUT', url, headers, expiresAt: new Date(now.getTime() + expiresInS * 1000) };
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
        await client.send(
          new CompleteMultipartUploadCommand({
            Bucket: settings.bucket,
            Key: key,
            UploadId: uploadId,
            MultipartUpload: { Parts: parts.map((p) => ({ PartNumber: p.partNumber, ETag: p.etag })) },
          }),
        );
        return true;
      } catch (err) {
        if (isNoSuchUpload(err)) return false;
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
      if (signer !== client) signer.destroy();
    },
  };
}
