// Public entry of @platform/device-gateway.
export { buildApp, type GatewayApp, type GatewayDeps } from './app.js';
export { gatewayApiDocument } from './http/api-document.js';
export {
  gatewayConfigSchema,
  loadGatewayConfig,
  publicConfig,
  readApiKeys,
  type GatewayConfig,
} from './config.js';
export {
  DEV_GATEWAY_LOGIN_PASSWORD,
  GATEWAY_LOGIN_ROLE,
  gatewayLoginPassword,
  gatewayLoginUrl,
  gatewayMigrations,
  gatewayMigrationsWith,
} from './db/migrations.js';
export { demoSites, seedDevices } from './db/seed.js';
export { loadRegistry } from './db/registry-repository.js';
export {
  CredentialCommandError,
  generateIdentity,
  generateKeyText,
  issueCredential,
  listCredentials,
  loadCredentials,
  revokeDevice,
  revokeIdentity,
  type CredentialListing,
  type IssuedCredential,
  type IssueOptions,
} from './db/credential-repository.js';
export { issueAudited } from './cli/device-key-command.js';
export { commandPrincipal } from './auth/principal.js';
export type { DeviceCredentialsTable, DeviceRegistryTable, GatewayDatabase } from './db/tables.js';
export type { DeliveryRow } from './delivery/recorder.js';
export {
  CredentialSnapshot,
  CredentialStore,
  DeviceCredential,
  type CredentialRecord,
} from './domain/credentials.js';
export type { CredentialsChangedListener, GatewayReloadSummary } from './registry-loader.js';
export { CoapServer, defaultCoapOptions, type CoapServerOptions, type CoapStats } from './coap/server.js';
export { VersionClock } from './domain/version-clock.js';
export { ClusterBus, type BusStatus, type BusStats } from './cluster/bus.js';
export { BUS_CHANNEL, NOTIFY_PAYLOAD_LIMIT_BYTES } from './cluster/messages.js';
export { GatewayState } from './domain/gateway-state.js';
export {
  DtlsServer,
  defaultDtlsOptions,
  type DtlsServerInit,
  type DtlsServerOptions,
  type DtlsSession,
  type DtlsSessionEndReason,
  type DtlsStats,
  type PskCredential,
} from './dtls/index.js';
