export { enterpriseMigrations } from './migrations/index.js';
export * from './roles.js';
export * from './demo.js';
export * from './types.js';
export { recordObjectCreated, withPostgrestRequest, withRequestClaims } from './request.js';
export type {
  ObjectCreatedFacts,
  ObjectCreatedOutcome,
  PostgrestRequestClient,
  PostgrestRequestOptions,
  RequestClaims,
  RequestClaimsOptions,
} from './request.js';
