// @platform/deploy: the operations image's code (migrations and seed of the whole platform, the JWKS sync)
// and the offline validators of the production shape's files.
export * from './platform-database.js';
export * from './jwks-sync.js';
export * from './validate/index.js';
