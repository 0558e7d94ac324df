// Protocol numbers for DTLS 1.2 with PSK, each with the section that defines it.

/** RFC 5246 §6.2.1 ContentType. */
export const ContentType = {
  changeCipherSpec: 20,
  alert: 21,
  handshake: 22,
  applicationData: 23,
} as const;

/** RFC 5246 §7.4 HandshakeType, plus hello_verify_request from RFC 6347 §4.3.2. */
export const HandshakeType = {
  helloRequest: 0,
  clientHello: 1,
  serverHello: 2,
  helloVerifyRequest: 3,
  serverKeyExchange: 12,
  serverHelloDone: 14,
  clientKeyExchange: 16,
  finished: 20,
} as const;

/** RFC 5246 §7.2 AlertLevel. */
export const AlertLevel = { warning: 1, fatal: 2 } as const;

/** RFC 5246 §7.2 AlertDescription (no_renegotiation: §7.2.2; unknown_psk_identity: RFC 4279 §2). */
export const AlertDescription = {
  closeNotify: 0,
  unexpectedMessage: 10,
  badRecordMac: 20,
  recordOverflow: 22,
  handshakeFailure: 40,
  illegalParameter: 47,
  decodeError: 50,
  decryptError: 51,
  protocolVersion: 70,
  internalError: 80,
  noRenegotiation: 100,
} as const;

export type AlertName = keyof typeof AlertDescription;

/** DTLS 1.2 on the wire is {254, 253}; DTLS 1.0 is {254, 255} (RFC 6347 §4.1). */
export const DTLS_1_2 = 0xfefd;
export const DTLS_1_0 = 0xfeff;

/** TLS_PSK_WITH_AES_128_CCM_8, RFC 6655 §4 (IANA 0xC0,0xA8). */
export const TLS_PSK_WITH_AES_128_CCM_8 = 0xc0a8;
/** RFC 5746 §3.3: the signalling cipher suite value TLS_EMPTY_RENEGOTIATION_INFO_SCSV. */
export const TLS_EMPTY_RENEGOTIATION_INFO_SCSV = 0x00ff;

/** RFC 7627 §5.1 extended_master_secret. */
export const EXT_EXTENDED_MASTER_SECRET = 0x0017;
/** RFC 5746 §3.2 renegotiation_info. */
export const EXT_RENEGOTIATION_INFO = 0xff01;

/** RFC 6347 §4.1: type(1) version(2) epoch(2) sequence_number(6) length(2). */
export const RECORD_HEADER_BYTES = 13;
/** RFC 6347 §4.2.2: msg_type(1) length(3) message_seq(2) fragment_offset(3) fragment_length(3). */
export const HANDSHAKE_HEADER_BYTES = 12;
/** ClientHello.random and ServerHello.random (RFC 5246 §7.4.1.2). */
export const RANDOM_BYTES = 32;
/** RFC 5246 §6.2.1: a plaintext fragment is at most 2^14 bytes. */
export const MAX_PLAINTEXT_BYTES = 16384;
/** RFC 5246 §6.2.3: a protected fragment may be at most 2^14 + 2048 bytes. */
export const MAX_CIPHERTEXT_BYTES = 16384 + 2048;

/** RFC 6655 §3: AES-128 key, 4-byte implicit salt (client/server_write_IV), 8-byte explicit nonce, 8-byte tag. */
export const KEY_BYTES = 16;
export const FIXED_IV_BYTES = 4;
export const EXPLICIT_NONCE_BYTES = 8;
export const TAG_BYTES = 8;
/** RFC 5246 §7.4.9: verify_data_length is 12 for every TLS 1.2 suite that does not say otherwise. */
export const VERIFY_DATA_BYTES = 12;
/** RFC 5246 §8.1: master_secret is always 48 bytes. */
export const MASTER_SECRET_BYTES = 48;
