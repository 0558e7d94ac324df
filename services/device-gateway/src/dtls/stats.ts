// Counters of the DTLS server, exported as metrics (src/metrics.ts); plain numbers, no allocation per event.
import { AlertDescription } from './constants.js';
import type { AlertName } from './constants.js';

export type DtlsSessionEndReason =
  'close_notify' | 'idle' | 'replaced' | 'ended' | 'revoked' | 'evicted' | 'fatal_alert' | 'server_close';

export type DtlsHandshakeFailure =
  | 'decrypt_error'
  | 'handshake_failure'
  | 'protocol_version'
  | 'illegal_parameter'
  | 'decode_error'
  | 'unexpected_message'
  | 'peer_alert'
  | 'timeout'
  /** No ClientKeyExchange, or no authentic Finished after it, within unauthenticatedTimeoutMs. */
  | 'unauthenticated_timeout'
  /** Made room for a newer handshake in a full table (none has authenticated anything before its Finished). */
  | 'evicted'
  /** Its credential stopped being valid (revoked, expired, deleted) before the handshake completed. */
  | 'credential_invalid'
  | 'superseded'
  | 'server_close';

export type DtlsDropReason =
  | 'malformed'
  | 'mac'
  | 'replay'
  | 'epoch'
  | 'version'
  | 'no_state'
  | 'fragmented_client_hello'
  | 'reassembly'
  | 'unexpected'
  | 'limit';

export interface DtlsStats {
  datagramsReceived: number;
  recordsReceived: number;
  /** HelloVerifyRequests sent. */
  cookiesSent: number;
  /** ClientHellos whose cookie was present but wrong or expired. */
  badCookies: number;
  handshakesStarted: number;
  handshakesCompleted: number;
  handshakeFailures: Record<DtlsHandshakeFailure, number>;
  /**
   * Cookie-verified ClientHellos refused by a handshake limit: only when nothing can be evicted (a limit of
   * 0). Handshake and session limits evict instead ('evicted').
   */
  limitRejections: { handshakes: number; handshakesPerAddress: number };
  recordsDropped: Record<DtlsDropReason, number>;
  alertsSent: Record<AlertName, number>;
  sessionsEnded: Record<DtlsSessionEndReason, number>;
  /** Flights sent again (timer or peer retransmission). */
  retransmissions: number;
  applicationRecordsReceived: number;
  applicationRecordsSent: number;
  /** Exceptions thrown by onApplicationData / onSessionStart / onSessionEnd / lookupPsk. */
  callbackErrors: number;
  /** Exceptions caught at the socket handler: each one is a bug, never a crash. */
  internalErrors: number;
  sendErrors: number;
}

function zeroRecord<K extends string>(keys: readonly K[]): Record<K, number> {
  return Object.fromEntries(keys.map((k) => [k, 0])) as Record<K, number>;
}

export function newStats(): DtlsStats {
  return {
    datagramsReceived: 0,
    recordsReceived: 0,
    cookiesSent: 0,
    badCookies: 0,
    handshakesStarted: 0,
    handshakesCompleted: 0,
    handshakeFailures: zeroRecord<DtlsHandshakeFailure>([
      'decrypt_error',
      'handshake_failure',
      'protocol_version',
      'illegal_parameter',
      'decode_error',
      'unexpected_message',
      'peer_alert',
      'timeout',
      'unauthenticated_timeout',
      'evicted',
      'credential_invalid',
      'superseded',
      'server_close',
    ]),
    limitRejections: { handshakes: 0, handshakesPerAddress: 0 },
    recordsDropped: zeroRecord<DtlsDropReason>([
      'malformed',
      'mac',
      'replay',
      'epoch',
      'version',
      'no_state',
      'fragmented_client_hello',
      'reassembly',
      'unexpected',
      'limit',
    ]),
    alertsSent: zeroRecord(Object.keys(AlertDescription) as AlertName[]),
    sessionsEnded: zeroRecord<DtlsSessionEndReason>([
      'close_notify',
      'idle',
      'replaced',
      'ended',
      'revoked',
      'evicted',
      'fatal_alert',
      'server_close',
    ]),
    retransmissions: 0,
    applicationRecordsReceived: 0,
    applicationRecordsSent: 0,
    callbackErrors: 0,
    internalErrors: 0,
    sendErrors: 0,
  };
}

/** Alert names as stats keys, in the snake_case of RFC 5246 §7.2 for failures. */
export const failureOfAlert: Partial<Record<AlertName, DtlsHandshakeFailure>> = {
  decryptError: 'decrypt_error',
  handshakeFailure: 'handshake_failure',
  protocolVersion: 'protocol_version',
  illegalParameter: 'illegal_parameter',
  decodeError: 'decode_error',
  unexpectedMessage: 'unexpected_message',
};
