// @platform/service-kit: the transport plumbing both services need once (design §1).
export { COMMON_ERRORS, DomainError, errorMessage, requireValid, RETRY_AFTER_S } from './errors.js';
export type { DomainErrorOptions } from './errors.js';
export { createLogger, LOG_LEVELS } from './logger.js';
export type { Logger, LoggerOptions, LogLevel } from './logger.js';
export { isSensitiveKey, redactString, redactUrl, redactValue, REDACTED } from './redact.js';
export {
  bearerToken,
  countNonBearerSecrets,
  fingerprint,
  keyedFingerprint,
  KeyedSecretSet,
  NotARegularFileError,
  readRegularFile,
  readSecretList,
  SecretSet,
} from './secrets.js';
export type { SecretListSource } from './secrets.js';
export { ConfigError, databaseDeadlines, deepFreeze, loadConfig } from './config.js';
export { UNSTORABLE_TEXT_MESSAGE, unstorableTextPaths } from './text.js';
export { createJwtVerifier, keycloakJwksUrl } from './jwt.js';
export type {
  JwtAuthorization,
  JwtVerification,
  JwtVerifier,
  JwtVerifierSettings,
  VerifiedClaims,
} from './jwt.js';
export type { ConfigProblem, DatabaseDeadlines, DeepReadonly } from './config.js';
export { closeHttpServer, installShutdown } from './shutdown.js';
export { installSecretReload } from './reload.js';
export type { SecretReloadHandle, SecretReloadOptions } from './reload.js';
export type { ShutdownHandle, ShutdownOptions, ShutdownStep } from './shutdown.js';
export { Counter, createMetrics, Gauge, Histogram, metricsHandler, Registry } from './prometheus.js';
export type { MetricsOptions } from './prometheus.js';
export { createHttpApp, DEFAULT_BODY_LIMIT_BYTES, finishHttpApp, readJsonBody } from './http/app.js';
export { HTTP_HEADERS_TIMEOUT_MS, HTTP_REQUEST_TIMEOUT_MS, listenHttp } from './http/listen.js';
export type { HttpAppOptions } from './http/app.js';
export { addRoutes } from './http/routes.js';
export type { AddRoutesOptions, HttpMethod, RouteDefinition, RouteTarget } from './http/routes.js';
export { JSON_BODY_ERRORS, openApiDocument } from './http/openapi.js';
export type { OpenApiInfo } from './http/openapi.js';
export type {
  ContractSchema,
  EmbeddedSchema,
  HeaderDoc,
  ParameterDoc,
  RequestBodyDoc,
  ResponseDoc,
  RouteDoc,
} from './http/route-doc.js';
export { PROBLEM_CONTENT_TYPE, problemErrorHandler, sendProblem } from './http/problem.js';
export { REQUEST_ID_HEADER, REQUEST_ID_PATTERN, installRequestContext } from './http/request-context.js';
export * from './db/index.js';
