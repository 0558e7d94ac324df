// Presigned URLs of the object store (design §4.4): PUT for a single upload, GET for a download, PUT for a part
// of an upload in parts. One place signs them, with one signer per credentials: `@smithy/signature-v4`, the
// SigV4 implementation the AWS SDK itself uses, called directly. On AWS itself (no endpoint configured) the
// SDK's endpoint rules decide host and region, so `getSignedUrl` signs there. test/presign.test.ts checks both
// byte for byte against `getSignedUrl`.
import { GetObjectCommand, PutObjectCommand, UploadPartCommand } from '@aws-sdk/client-s3';
import type { S3Client } from '@aws-sdk/client-s3';
import { getSignedUrl } from '@aws-sdk/s3-request-presigner';
import { SignatureV4 } from '@smithy/signature-v4';
import { createHash, createHmac, createSecretKey } from 'node:crypto';
import type { Hash, Hmac, KeyObject } from 'node:crypto';
import type { MediaStorage, PresignedUpload } from '../domain/ports.js';
import { clientFor, encodeKeySegment, encodeQuery } from './s3-client.js';
import type { S3Settings } from './s3-client.js';

export type UrlSigner = Pick<MediaStorage, 'presignUpload' | 'presignDownload' | 'presignPart'> & {
  destroy(): void;
};

/** SigV4's payload hash of a presigned URL: the body is not known when the URL is signed. */
const UNSIGNED_PAYLOAD = 'UNSIGNED-PAYLOAD';
/** Spelled as the SDK's S3 presigner spells it: the name moves into the query as written. */
const PAYLOAD_HASH = 'X-Amz-Content-Sha256';

/**
 * Keys made KeyObjects once. On Node 24.19 `createHmac` given a Buffer key first tries `isKeyObject()` and
 * `isCryptoKey()` on it, each a native call that throws and is caught (~10 µs a call against ~2 µs with a
 * KeyObject; docs/benchmarks.md "Keyed primitives"). The signer's keys repeat: the day's signing key is one
 * Uint8Array from the signer's own cache (held weakly here), the secret access key one string.
 */
const keyObjects = new WeakMap<ArrayBuffer | ArrayBufferView, KeyObject>();
const secretKeyObjects = new Map<string, KeyObject>();

/** What the signer hands its hash as a key or data (@smithy/types SourceData). */
type Secret = string | ArrayBuffer | ArrayBufferView;

function bytes(data: ArrayBuffer | ArrayBufferView): Uint8Array {
  if (data instanceof Uint8Array) return data;
  return ArrayBuffer.isView(data)
    ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
    : new Uint8Array(data);
}

function keyObjectOf(secret: Secret): KeyObject {
  if (typeof secret === 'string') {
    let key = secretKeyObjects.get(secret);
    if (key === undefined) {
      // Credentials rotate rarely; a handful of secrets is all a process ever sees.
      if (secretKeyObjects.size > 8) secretKeyObjects.clear();
      key = createSecretKey(Buffer.from(secret, 'utf8'));
      secretKeyObjects.set(secret, key);
    }
    return key;
  }
  let key = keyObjects.get(secret);
  if (key === undefined) {
    key = createSecretKey(bytes(secret));
    keyObjects.set(secret, key);
  }
  return key;
}

/** The signer's SHA-256 and HMAC-SHA-256 (its `sha256` option), on node:crypto with KeyObject keys. */
class Sha256 {
  private hash: Hash | Hmac;

  constructor(private readonly secret?: Secret) {
    this.hash = this.fresh();
  }

  private fresh(): Hash | Hmac {
    return this.secret === undefined ? createHash('sha256') : createHmac('sha256', keyObjectOf(this.secret));
  }

  update(data: Secret): void {
    this.hash.update(typeof data === 'string' ? data : bytes(data));
  }

  digest(): Promise<Uint8Array> {
    return Promise.resolve(this.hash.digest());
  }

  reset(): void {
    this.hash = this.fresh();
  }
}

/** A request to presign: the key's path, the signed headers and the query, as the SDK's command would build it. */
interface UrlRequest {
  method: 'PUT' | 'GET';
  key: string;
  headers: Record<string, string>;
  query: Record<string, string>;
  expiresInS: number;
  signingDate: Date;
  /** Headers signed although SigV4 presigning would leave them out (content-type, design §4.4). */
  signableHeaders?: Set<string>;
  /** `x-amz-*` headers kept as headers (signed) instead of moved into the query. */
  unhoistableHeaders?: Set<string>;
}

/** As the SDK's S3 presigner: content-type is not signed unless a request asks for it (signableHeaders). */
const UNSIGNED_CONTENT_TYPE = new Set(['content-type']);

/** Query names repeat on every URL: each is encoded once. */
const encodedNames = new Map<string, string>();
function encodedName(name: string): string {
  let encoded = encodedNames.get(name);
  if (encoded === undefined) {
    encoded = encodeQuery(name);
    if (encodedNames.size < 64) encodedNames.set(name, encoded);
  }
  return encoded;
}

/** Most values (numbers, dates, hex signatures) have nothing to encode. */
const UNRESERVED = /^[A-Za-z0-9._~-]*$/;
function encodedValue(value: string): string {
  return UNRESERVED.test(value) ? value : encodeQuery(value);
}

/**
 * Signs URL requests for a custom endpoint (MinIO, s3rver) as the SDK's S3 presigner does: path-style where the
 * bucket cannot be a virtual host, the key's segments encoded once (`uriEscapePath: false`, S3's rule), the
 * payload unsigned, `content-type` left unsigned unless asked for, and the query written in sorted order.
 */
function customEndpointSigner(client: S3Client, settings: S3Settings, endpoint: string) {
  const url = new URL(endpoint);
  const port = url.port === '' ? undefined : Number(url.port);
  const basePath = url.pathname.replace(/\/+$/, '');
  // A bucket name with dots cannot be a TLS-safe virtual host, so it is addressed path-style, as the SDK does.
  const pathStyle = settings.forcePathStyle || settings.bucket.includes('.');
  const hostname = pathStyle ? url.hostname : `${settings.bucket}.${url.hostname}`;
  const prefix = pathStyle ? `${basePath}/${settings.bucket}` : basePath;
  const host = `${hostname}${port === undefined ? '' : `:${port}`}`;
  const origin = `${url.protocol}//${host}`;
  const signer = new SignatureV4({
    service: 's3',
    region: settings.region,
    // Static credentials as they are; otherwise the client's provider (environment, profile, IMDS), whose
    // answers the signer asks for on every URL (the provider caches them).
    credentials:
      settings.accessKeyId !== undefined && settings.secretAccessKey !== undefined
        ? { accessKeyId: settings.accessKeyId, secretAccessKey: settings.secretAccessKey }
        : client.config.credentials,
    sha256: Sha256,
    uriEscapePath: false,
    applyChecksum: false,
  });

  // A request for part URLs signs up to 100 parts of one key: its path is encoded once.
  let lastKey: string | undefined;
  let lastPath = '';
  const pathOf = (key: string): string => {
    if (key !== lastKey) {
      lastPath = `${prefix}/${key.split('/').map(encodeKeySegment).join('/')}`;
      lastKey = key;
    }
    return lastPath;
  };

  return async (input: UrlRequest): Promise<string> => {
    const path = pathOf(input.key);
    const signed = await signer.presign(
      {
        method: input.method,
        protocol: url.protocol,
        hostname,
        ...(port === undefined ? {} : { port }),
        path,
        // The signer clones the request before it adds to it (prepareRequest), so these are not changed.
        query: input.query,
        headers: { host, ...input.headers, [PAYLOAD_HASH]: UNSIGNED_PAYLOAD },
      },
      {
        expiresIn: input.expiresInS,
        signingDate: input.signingDate,
        unsignableHeaders: UNSIGNED_CONTENT_TYPE,
        ...(input.signableHeaders === undefined ? {} : { signableHeaders: input.signableHeaders }),
        ...(input.unhoistableHeaders === undefined ? {} : { unhoistableHeaders: input.unhoistableHeaders }),
      },
    );
    const query = Object.entries(signed.query ?? {})
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .flatMap(([name, value]) =>
        value === null
          ? []
          : (Array.isArray(value) ? value : [value]).map((v) => `${encodedName(name)}=${encodedValue(v)}`),
      )
      .join('&');
    return `${origin}${path}${query === '' ? '' : `?${query}`}`;
  };
}

/** The checksum stays a (signed) header, never a query parameter: S3 checks the body against the header. */
const CHECKSUM_HEADER = 'x-amz-checksum-sha256';
const UNHOISTABLE = new Set([CHECKSUM_HEADER]);
/**
 * The S3 presigner leaves content-type unsigned; signing it (X-Amz-SignedHeaders) makes a verifying store
 * refuse any other type.
 */
const SIGNED_CONTENT_TYPE = new Set(['content-type']);

function checksumHeader(checksumSha256: string | undefined): Record<string, string> {
  return checksumSha256 === undefined ? {} : { [CHECKSUM_HEADER]: checksumSha256 };
}

function expiry(now: Date, expiresInS: number): Date {
  return new Date(now.getTime() + expiresInS * 1000);
}

export function createUrlSigner(settings: S3Settings): UrlSigner {
  const endpoint = settings.publicEndpoint ?? settings.endpoint;
  // Presigning sends nothing; the client only lends its configuration (credentials, endpoint rules).
  const client = clientFor(settings, endpoint);
  const direct = endpoint === undefined ? undefined : customEndpointSigner(client, settings, endpoint);
  const bucket = settings.bucket;

  return {
    async presignUpload({ key, contentType, sizeBytes, checksumSha256, expiresInS, now = new Date() }) {
      const url =
        direct === undefined
          ? await getSignedUrl(
              client,
              new PutObjectCommand({
                Bucket: bucket,
                Key: key,
                ContentType: contentType,
                ContentLength: sizeBytes,
                ...(checksumSha256 === undefined ? {} : { ChecksumSHA256: checksumSha256 }),
              }),
              {
                expiresIn: expiresInS,
                signingDate: now,
                signableHeaders: SIGNED_CONTENT_TYPE,
                unhoistableHeaders: UNHOISTABLE,
              },
            )
          : await direct({
              method: 'PUT',
              key,
              headers: {
                'content-type': contentType,
                'content-length': String(sizeBytes),
                ...checksumHeader(checksumSha256),
              },
              // The SDK's operation hint, kept so URLs equal getSignedUrl's byte for byte.
              query: { 'x-id': 'PutObject' },
              expiresInS,
              signingDate: now,
              signableHeaders: SIGNED_CONTENT_TYPE,
              unhoistableHeaders: UNHOISTABLE,
            });
      const headers = { 'Content-Type': contentType, ...checksumHeader(checksumSha256) };
      return { method: 'PUT', url, headers, expiresAt: expiry(now, expiresInS) };
    },

    async presignDownload({ key, contentDisposition, contentType, expiresInS, now = new Date() }) {
      const url =
        direct === undefined
          ? await getSignedUrl(
              client,
              new GetObjectCommand({
                Bucket: bucket,
                Key: key,
                ResponseContentDisposition: contentDisposition,
                ResponseContentType: contentType,
              }),
              { expiresIn: expiresInS, signingDate: now },
            )
          : await direct({
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
      return { url, expiresAt: expiry(now, expiresInS) };
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
      const url =
        direct === undefined
          ? await getSignedUrl(
              client,
              new UploadPartCommand({
                Bucket: bucket,
                Key: key,
                UploadId: uploadId,
                PartNumber: partNumber,
                ContentLength: sizeBytes,
                ...(checksumSha256 === undefined ? {} : { ChecksumSHA256: checksumSha256 }),
              }),
              { expiresIn: expiresInS, signingDate: now, unhoistableHeaders: UNHOISTABLE },
            )
          : await direct({
              method: 'PUT',
              key,
              // The length is signed: a part URL takes exactly its part.
              headers: { 'content-length': String(sizeBytes), ...checksumHeader(checksumSha256) },
              query: { partNumber: String(partNumber), uploadId, 'x-id': 'UploadPart' },
              expiresInS,
              signingDate: now,
              unhoistableHeaders: UNHOISTABLE,
            });
      const signed: PresignedUpload = {
        method: 'PUT',
        url,
        headers: checksumHeader(checksumSha256),
        expiresAt: expiry(now, expiresInS),
      };
      return signed;
    },

    destroy() {
      client.destroy();
    },
  };
}
