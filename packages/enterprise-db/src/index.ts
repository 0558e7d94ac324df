export { enterpriseMigrations, enterpriseMigrationsWith } from './migrations/index.js';
export * from './roles.js';
export * from './demo.js';
export * from './types.js';
export { dollarQuote, recordObjectCreated, withRequestClaims } from './request.js';
export type {
  ObjectCreatedFacts,
  ObjectCreatedOutcome,
  RequestClaims,
  RequestClaimsOptions,
} from './request.js';
export { demoRowId, demoRowsPerSite, demoWorkItemStates, seedEnterprise, seedId } from './seed.js';
export type { DemoRowKind, SeedOptions, SeedSummary } from './seed.js';
export { fetchJwks, installPostgrestAuth, JwksError, jwksUrlOf, publicSigningKeys } from './postgrest.js';
export type { JsonWebKeyLike, PostgrestAuthSettings } from './postgrest.js';
