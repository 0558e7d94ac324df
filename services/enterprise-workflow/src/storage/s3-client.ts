// The S3 client of the workflow's object store: its settings and how a client is built from them (shared by
// the store adapter, s3-store.ts, and the URL signer, s3-url-signer.ts).
import { S3Client } from '@aws-sdk/client-s3';

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
  /**
   * Deadline of the store's long calls, in ms (default 120000): CompleteMultipartUpload, which assembles the
   * object before it answers and "could take several minutes" on S3 (its API reference), and the acceptance
   * copy (CopyObject, up to 5 GiB server-side). `requestTimeoutMs` is a deadline on the whole request and
   * response in @smithy/node-http-handler 4 (a timer from the start, not an idle timeout), so the whitespace S3
   * sends while it works does not extend it, and s3rver and MinIO may send nothing at all.
   */
  longRequestTimeoutMs?: number | undefined;
}

export function clientFor(settings: S3Settings, endpoint: string | undefined, maxAttempts = 2): S3Client {
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

/** S3's URI encoding of one key segment (RFC 3986 unreserved kept), as the SDK's Key label. */
export function encodeKeySegment(segment: string): string {
  return encodeURIComponent(segment).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
}

/** Encodes a query name or value the way the SDK's URL formatter does. */
export const encodeQuery = encodeKeySegment;
