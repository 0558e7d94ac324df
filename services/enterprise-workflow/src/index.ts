// Public entry of @platform/enterprise-workflow: what the local stack, tests and the benchmark use.
export { buildApp } from './app.js';
export type { AppDeps } from './app.js';
export { configSchema, loadWorkflowConfig } from './config.js';
export type { WorkflowConfig } from './config.js';
export { createTokenVerifier } from './auth/token-verifier.js';
export type { TokenVerifier, TokenVerifierSettings, Verification } from './auth/token-verifier.js';
export { createS3Storage } from './storage/s3-store.js';
export type { S3Settings } from './storage/s3-client.js';
export type { MediaStorage, PortalUser } from './domain/ports.js';
export { workflowApiDocument } from './http/api-document.js';
