// DTLS 1.2 server with pre-shared keys for the gateway's coaps transport (design §3.5).
//
// Use: construct a DtlsServer with lookupPsk (synchronous; return only currently valid credentials) and a
// logger, set onApplicationData / onSessionEnd (and optionally onSessionStart), listen(port, host). Each
// DtlsSession object is the same object for every callback of its session, so it can key per-session
// state (Observe relations); send(session, data) sends one record and is a no-op once the session ended.
// endSessions(predicate, 'revoked') ends sessions of revoked or expired credentials with close_notify.
// sessionsOf(deviceId) lists a device's sessions for operators (no key material).
// stats (counters) and snapshot() (gauges) are plain numbers for /metrics. Nothing here logs key material.
export { DtlsServer } from './connector.js';
export { defaultDtlsOptions } from './options.js';
export type { DtlsLogger, DtlsServerInit, DtlsServerOptions, PskCredential } from './options.js';
export type { DtlsSession, DtlsSessionView } from './session.js';
export type { DtlsDropReason, DtlsHandshakeFailure, DtlsSessionEndReason, DtlsStats } from './stats.js';
