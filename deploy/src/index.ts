// @platform/deploy: the JWKS sync of the production shape and the offline validators of its files.
export * from './jwks-sync.js';
export * from './validate/index.js';
