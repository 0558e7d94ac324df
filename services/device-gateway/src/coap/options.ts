/** The CoAP server's options and counters, shared by its layers (transport, messages, observe, resources). */

export interface CoapLogger {
  info(message: string, meta?: Record<string, unknown>): unknown;
  warn(message: string, meta?: Record<string, unknown>): unknown;
  error(message: string, meta?: Record<string, unknown>): unknown;
  debug(message: string, meta?: Record<string, unknown>): unknown;
}

export interface CoapServerOptions {
  logger: CoapLogger;
  /** Longest token accepted (RFC 8974 allows up to 65804 bytes; each relation keeps its token). */
  maxTokenLength: number;
  /** SO_RCVBUF / SO_SNDBUF request in bytes; ACKs of a large fan-out must not be dropped in the kernel. */
  socketBufferBytes: number;
  /** RFC 7252 ACK_TIMEOUT in ms (default 2000) and ACK_RANDOM_FACTOR (default 1.5). */
  ackTimeoutMs: number;
  ackRandomFactor: number;
  /** RFC 7252 MAX_RETRANSMIT (default 4). */
  maxRetransmit: number;
  /** RFC 7641 4.5: at least one confirmable notification per observer in this period (ms, default 24 h). */
  confirmableRefreshMs: number;
  /** Max-Age of plain GET responses, seconds. Notifications carry the refresh period instead. */
  maxAgeS: number;
  /** Notifications sent per event-loop turn during a fan-out, so incoming ACKs are read in between. */
  fanoutChunk: number;
  /**
   * Server-wide window of confirmable notifications awaiting their first ACK. NSTART (RFC 7252 4.7) bounds
   * exchanges per endpoint; this bounds them across all endpoints, so a fan-out to 100,000 observers is paced
   * by the ACKs coming back: each ACK returns well within ACK_TIMEOUT instead of queueing behind the burst
   * (unbounded, the ACKs of a large fan-out arrived after the timeout and every notification was resent).
   * A notification leaves the window at its ACK or its first timeout (a slow or dead peer must not hold a
   * slot through its whole backoff); it keeps its own retransmission schedule either way.
   */
  maxInflight: number;
  /** Most observe relations one endpoint (address and port) may hold; further registrations get a plain reply. */
  maxRelationsPerEndpoint: number;
  /**
   * Most observe relations in all, per budget: relations of authenticated peers (DTLS sessions) and of plain
   * CoAP peers are counted apart (ObserveLayer.budgets), so a server with both transports may hold twice
   * this. The memory bound (about 0.5 KB heap and 0.9 KB RSS each, docs/benchmarks.md). A registration over
   * it gets 5.03 Service Unavailable with Max-Age.
   */
  maxRelations: number;
  /**
   * Most observe relations one source address (the IP, any port) may hold, per budget as maxRelations; over
   * it, 5.03 with Max-Age. A client cannot escape it by opening more ports, as it can the per-endpoint cap.
   */
  maxRelationsPerAddress: number;
  /** Max-Age of a 5.03 refusal: seconds after which the client may retry (RFC 7252 5.9.3.4). */
  relationRetryAfterS: number;
}

export const defaultCoapOptions: Omit<CoapServerOptions, 'logger'> = {
  maxTokenLength: 64,
  socketBufferBytes: 4 * 1024 * 1024,
  ackTimeoutMs: 2000,
  ackRandomFactor: 1.5,
  maxRetransmit: 4,
  confirmableRefreshMs: 24 * 60 * 60 * 1000,
  maxAgeS: 60,
  fanoutChunk: 256,
  maxInflight: 2048,
  maxRelationsPerEndpoint: 256,
  // 200,000 relations: about 180 MB RSS at about 0.9 KB of RSS each (heap figures in docs/benchmarks.md), inside the gateway's 512 MiB container
  // limit (deploy/k8s) beside a 100k-device registry.
  maxRelations: 200_000,
  // 512 per address: a site behind one NAT address with 256 devices, each observing both of its resources,
  // still registers (devices of a building usually share one public address); one address cannot take more
  // than 0.26 % of the total. Spoofed sources are bounded by maxRelations, not by this.
  maxRelationsPerAddress: 512,
  relationRetryAfterS: 60,
};

export interface CoapStats {
  datagramsIn: number;
  malformed: number;
  malformedByReason: Record<string, number>;
  requests: number;
  responses: number;
  notifications: number;
  confirmableNotifications: number;
  retransmissions: number;
  acks: number;
  resets: number;
  observersRemovedByRst: number;
  observersRemovedByTimeout: number;
  /** ACKs of confirmable notifications (the delivery record's acknowledged versions). */
  notificationsAcknowledged: number;
  observersDeregistered: number;
  /** Relations dropped because their transport ended the peer (a DTLS session closed, revoked or replaced). */
  observersRemovedByPeerClosed: number;
  /** Registrations answered as a plain GET: the endpoint (address and port) was at maxRelationsPerEndpoint. */
  registrationsRefused: number;
  /** Registrations answered 5.03: the source address was at maxRelationsPerAddress. */
  registrationsOverAddressCap: number;
  /** Registrations answered 5.03: the server was at maxRelations. */
  registrationsOverTotalCap: number;
  finalNotFound: number;
  internalErrors: number;
  sendErrors: number;
  /** Times a fan-out paused because the in-flight window was full. */
  windowFull: number;
  /** Devices' reports (`/devices/{id}/reported`) by what was answered (report-resource.ts's results). */
  reportsByResult: Record<string, number>;
}

export function newCoapStats(): CoapStats {
  return {
    datagramsIn: 0,
    malformed: 0,
    malformedByReason: {},
    requests: 0,
    responses: 0,
    notifications: 0,
    confirmableNotifications: 0,
    retransmissions: 0,
    acks: 0,
    resets: 0,
    observersRemovedByRst: 0,
    observersRemovedByTimeout: 0,
    notificationsAcknowledged: 0,
    observersDeregistered: 0,
    observersRemovedByPeerClosed: 0,
    registrationsRefused: 0,
    registrationsOverAddressCap: 0,
    registrationsOverTotalCap: 0,
    finalNotFound: 0,
    internalErrors: 0,
    sendErrors: 0,
    windowFull: 0,
    reportsByResult: {},
  };
}

/** Monotonic whole milliseconds (small integers, stored unboxed by V8). */
export const now = (): number => Math.floor(performance.now());
