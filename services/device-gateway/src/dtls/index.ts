export { DtlsServer, defaultDtlsOptions } from './server.js';
export type {
  DtlsDropReason,
  DtlsHandshakeFailure,
  DtlsLogger,
  DtlsServerInit,
  DtlsServerOptions,
  DtlsSession,
  DtlsSessionEndReason,
  DtlsStats,
  PskCredential,
} from './server.js';
