export { freePort } from './ports.js';
export { headersDeadlineFaults, rawHttpExchange } from './raw-http.js';
export type { RawHttpAnswer } from './raw-http.js';
export { startPostgres } from './postgres.js';
export type { PostgresServer, StartPostgresOptions } from './postgres.js';
export { createTestDatabase, migrationFingerprint } from './database.js';
export type { CreateTestDatabaseOptions, TestDatabase } from './database.js';
export { encodeEventKey, startS3 } from './s3.js';
export type { S3EventRecord, S3Request, S3Server, StartS3Options, TestObjectStore } from './s3.js';
export { requireRgwCommands, RgwMissingError, startRgw } from './rgw.js';
export type { RgwServer, StartRgwOptions } from './rgw.js';
export { OBJECT_STORE_KINDS, startObjectStore } from './object-store.js';
export type { ObjectStoreKind, StartObjectStoreOptions } from './object-store.js';
export { isPresigned, signedHeaders, verifyPresigned } from './sigv4.js';
export type { PresignedRequest, SigningCredentials, UrlVerdict } from './sigv4.js';
export { demoUsers, OPERATIONS_CLIENT, openDevSigner, opsClaims, opsUsers, startIssuer } from './issuer.js';
export type {
  Claims,
  DemoUser,
  DevSigner,
  DemoUserProfile,
  Issuer,
  OpsUser,
  OpsUserProfile,
  SigningAlg,
  SignOptions,
  StartIssuerOptions,
  UnsafeKind,
} from './issuer.js';
export { schemaSnapshot } from './schema-snapshot.js';
export { GENERATED_HEADER, renderOpenApiYaml } from './openapi-yaml.js';
export type { SchemaSnapshotOptions } from './schema-snapshot.js';
export { withPostgrestRequest } from './postgrest.js';
export type { PostgrestRequestClient, PostgrestRequestOptions } from './postgrest.js';
