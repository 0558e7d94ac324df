// What the DTLS server is given: the credential lookup, a logger, and the limits and timers it runs with.
export interface PskCredential {
  readonly credentialId: string;
  readonly identity: string;
  readonly key: Buffer;
  readonly deviceId: string;
}

export interface DtlsLogger {
  info(message: string, meta?: Record<string, unknown>): unknown;
  warn(message: string, meta?: Record<string, unknown>): unknown;
  error(message: string, meta?: Record<string, unknown>): unknown;
  debug(message: string, meta?: Record<string, unknown>): unknown;
}

export interface DtlsServerOptions {
  /**
   * Synchronous: the current valid credential for this identity (not revoked, within
   * not_before..not_after), else undefined. Called at ClientKeyExchange, again when the handshake completes
   * (the credential must still be the same one), and for every session every `credentialCheckIntervalMs`.
   */
  lookupPsk(identity: string): PskCredential | undefined;
  logger: DtlsLogger;
  /**
   * Established sessions in all. The sessions caps are checked when a handshake completes, that is for an
   * authenticated newcomer: past a cap, the least recently active session of the group ends ('evicted').
   */
  maxSessions: number;
  /** Established sessions from one source IP address (devices behind one NAT address share it). */
  maxSessionsPerAddress: number;
  /** Established sessions of one credential (one key cannot crowd out its neighbours). */
  maxSessionsPerCredential: number;
  /**
   * Handshakes in progress (a cookie-verified ClientHello starts one), in all. When full, the oldest handshake
   * of the source address holding the most makes room (connection-store.ts).
   */
  maxHandshakes: number;
  /** Handshakes in progress from one source IP address, counted apart from its sessions. */
  maxHandshakesPerAddress: number;
  /** A session that has received no authenticated record for this long is ended ('idle'), ms. */
  idleTimeoutMs: number;
  /** A handshake not finished this long after its ClientHello is abandoned, ms. */
  handshakeTimeoutMs: number;
  /**
   * A handshake that has not received a ClientKeyExchange this long after its ClientHello, or an authentic
   * Finished this long after its ClientKeyExchange, is abandoned, ms: a slot costs an attacker one cookie
   * round trip (and a ClientKeyExchange names an identity anyone can read), so it must not hold one for the
   * whole handshakeTimeoutMs.
   */
  unauthenticatedTimeoutMs: number;
  /**
   * A handshake record that fails authentication is dropped silently; if no authentic Finished follows
   * within this time, the handshake ends with decrypt_error (the client's key is wrong), ms.
   */
  authFailureGraceMs: number;
  /** How often every session's credential is checked again with lookupPsk, ms (whatever event was missed). */
  credentialCheckIntervalMs: number;
  /** A cookie is accepted this long after it was made, ms (it names its own time, RFC 6347 §4.2.1). */
  cookieLifetimeMs: number;
  /** The cookie secret is replaced this often; the previous one stays valid for one more period, ms. */
  cookieSecretRotationMs: number;
  /** SO_RCVBUF / SO_SNDBUF request, bytes; undefined leaves the OS default. */
  socketBufferBytes?: number;
  /** First retransmission timeout of our flight, ms (RFC 6347 §4.2.4.1: 1 s). */
  retransmitInitialMs: number;
  /**
   * Upper bound of the doubling retransmission timeout, ms (RFC 6347 §4.2.4.1: "up to no less than" 60 s;
   * handshakeTimeoutMs ends the handshake first with the defaults).
   */
  retransmitMaxMs: number;
  /** Largest handshake message body accepted, bytes: reassembled, or a whole ClientHello or ClientKeyExchange. */
  maxHandshakeMessageBytes: number;
  /** Most fragments accepted for one handshake message. */
  maxFragmentsPerMessage: number;
  /** Most handshake bytes buffered for one peer during reassembly, bytes. */
  maxPendingBytesPerPeer: number;
  /** How often timers (retransmission, handshake deadline, cookie rotation) are checked, ms. */
  timerResolutionMs: number;
  /** How often idle sessions are looked for, ms. */
  idleSweepIntervalMs: number;
  /** How often one session resends its final flight when the client retransmits its Finished. */
  maxFinalFlightResends: number;
}

export const defaultDtlsOptions = {
  maxSessions: 20_000,
  maxSessionsPerAddress: 64,
  maxSessionsPerCredential: 4,
  maxHandshakes: 2_000,
  maxHandshakesPerAddress: 16,
  idleTimeoutMs: 600_000,
  handshakeTimeoutMs: 30_000,
  unauthenticatedTimeoutMs: 5_000,
  authFailureGraceMs: 300,
  credentialCheckIntervalMs: 10_000,
  cookieLifetimeMs: 60_000,
  cookieSecretRotationMs: 300_000,
  retransmitInitialMs: 1_000,
  retransmitMaxMs: 60_000,
  maxHandshakeMessageBytes: 4_096,
  maxFragmentsPerMessage: 16,
  maxPendingBytesPerPeer: 8_192,
  timerResolutionMs: 100,
  idleSweepIntervalMs: 5_000,
  maxFinalFlightResends: 8,
} as const satisfies Omit<DtlsServerOptions, 'lookupPsk' | 'logger'>;

export type DtlsServerInit = Pick<DtlsServerOptions, 'lookupPsk' | 'logger'> & Partial<DtlsServerOptions>;
