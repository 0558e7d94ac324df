// Straight to the test store, around the service: what a client with its own credentials could do.
import { S3Client, UploadPartCommand } from '@aws-sdk/client-s3';
import type { TestObjectStore } from '@platform/testkit';

/** A client of the store itself (path-style, the store's own credentials). */
export function directStoreClient(store: TestObjectStore): S3Client {
  return new S3Client({
    endpoint: store.endpoint,
    region: store.region,
    forcePathStyle: true,
    credentials: { accessKeyId: store.accessKeyId, secretAccessKey: store.secretAccessKey },
  });
}

/**
 * Stores one part of each size in `sizes` (part n filled with the byte n) in the upload `uploadId` of `key`,
 * one after the other; the parts as `completeMultipartUpload` takes them.
 */
export async function uploadParts(
  client: S3Client,
  store: TestObjectStore,
  key: string,
  uploadId: string,
  sizes: readonly number[],
): Promise<Array<{ partNumber: number; etag: string }>> {
  const parts = [];
  for (const [i, size] of sizes.entries()) {
    const n = i + 1;
    const out = await client.send(
      new UploadPartCommand({
        Bucket: store.bucket,
        Key: key,
        UploadId: uploadId,
        PartNumber: n,
        Body: Buffer.alloc(size, n),
      }),
    );
    parts.push({ partNumber: n, etag: out.ETag ?? '' });
  }
  return parts;
}
