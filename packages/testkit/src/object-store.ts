// The local S3 stores the tests run against, behind one call: s3rver (in process, quick) and Ceph's RADOS
// Gateway (rgw.ts, a real S3 implementation). Where they differ, the gateway is the reference: s3rver is
// started here with what it lacks that tests rely on (presigned URLs checked as S3 checks them).
import { startRgw } from './rgw.js';
import { startS3 } from './s3.js';
import type { S3EventRecord, TestObjectStore } from './s3.js';

export type ObjectStoreKind = TestObjectStore['kind'];

/** Every store a store-facing suite runs against, for `describe.each`. */
export const OBJECT_STORE_KINDS: readonly ObjectStoreKind[] = ['s3rver', 'rgw'];

export interface StartObjectStoreOptions {
  /** Default `media`. */
  bucket?: string;
  /** Browser origins the bucket's CORS rule allows (PUT, GET, HEAD; any header; `ETag` exposed). */
  corsOrigins?: readonly string[];
  /** Each ObjectCreated record the store reports, in order, one at a time. */
  onObjectCreated?: (record: S3EventRecord) => void | Promise<void>;
  /** Report only keys under this prefix (a MinIO `--prefix` rule, an S3 notification's key filter). */
  eventPrefix?: string;
  onError?: (err: unknown) => void;
}

export function startObjectStore(
  kind: ObjectStoreKind,
  options: StartObjectStoreOptions = {},
): Promise<TestObjectStore> {
  return kind === 'rgw' ? startRgw(options) : startS3({ ...options, verifyPresignedUrls: true });
}
