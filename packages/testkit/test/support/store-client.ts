// An SDK client of a test store (startObjectStore, startRgw), path-style, with checksums only where the
// operation requires them (neither store checks the SDK's default CRC32 ones).
import { S3Client } from '@aws-sdk/client-s3';
import type { TestObjectStore } from '@platform/testkit';

export function storeClient(
  store: Pick<TestObjectStore, 'endpoint' | 'region' | 'accessKeyId' | 'secretAccessKey'>,
): S3Client {
  return new S3Client({
    endpoint: store.endpoint,
    region: store.region,
    forcePathStyle: true,
    credentials: { accessKeyId: store.accessKeyId, secretAccessKey: store.secretAccessKey },
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
  });
}
