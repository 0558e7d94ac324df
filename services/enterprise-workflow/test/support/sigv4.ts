// The independent SigV4 check of presigned URLs (written from the AWS specification, not from the SDK that
// signs them) lives in the test kit, which also makes s3rver check presigned requests with it; the unit tests
// of the service's URLs use it from here.
export { verifyPresigned } from '@platform/testkit';
export type { PresignedRequest, UrlVerdict } from '@platform/testkit';
