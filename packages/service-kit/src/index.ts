// @platform/service-kit: the transport plumbing both services need once (DESIGN 1).
export { DomainError, isDomainError, requireValid } from './errors.js';
export type { DomainErrorOptions } from './errors.js';
export { createLogger, LOG_LEVELS } from './logger.js';
export type { Logger, LoggerOptions, LogLevel } from './logger.js';
export { isSensitiveKey, redactString, redactValue, REDACTED } from './redact.js';
export { bearerToken, fingerprint, readSecretList, redactUrl, SecretSet } from './secrets.js';
export type { SecretListSource } from './secrets.js';
export { ConfigError, deepFreeze, loadConfig } from './config.js';
export type { ConfigProblem, DeepReadonly } from './config.js';
export { closeHttpServer, installShutdown } from './shutdown.js';
export type { ShutdownHandle, ShutdownOptions, ShutdownStep } from './shutdown.js';
export {
  Counter,
  createMetrics,
  Gauge,
  Histogram,
  httpMetrics,
  metricsHandler,
  Registry,
} from './metrics.js';
export type { HttpMetrics, MetricsOptions } from './metrics.js';
export { createHttpApp, DEFAULT_BODY_LIMIT_BYTES, finishHttpApp, routeLabel } from './http/app.js';
export type { HttpAppOptions } from './http/app.js';
export { addRoutes } from './http/routes.js';
export type { HttpMethod, RouteDefinition, RouteTarget } from './http/routes.js';
export { PROBLEM_CONTENT_TYPE, PROBLEM_TYPE_BASE, problemErrorHandler, sendProblem } from './http/problem.js';
export type { ProblemBody } from './http/problem.js';
export { REQUEST_ID_HEADER, REQUEST_ID_PATTERN, requestContext } from './http/request-context.js';
export * from './db/index.js';
