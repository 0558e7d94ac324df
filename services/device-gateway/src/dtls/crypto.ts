// Cryptographic primitives of TLS 1.2 as DTLS 1.2 uses them with TLS_PSK_WITH_AES_128_CCM_8.
// Everything runs on node:crypto; nothing here keeps state.
//
// Secrets reach node:crypto as KeyObjects: given a Buffer key, createHmac and createCipheriv first ask
// isKeyObject()/isCryptoKey(), and on Node 24 each of those throws and catches an exception internally
// (12-16 µs per call against 1-2.5 µs). The PRF makes one KeyObject per call when given a Buffer; the handshake
// gives it the master secret as one KeyObject for its three uses (server-handshaker.ts); record keys are made
// once per connection (record-layer.ts). Buffers are still accepted, for tests and one-off use.
import {
  createCipheriv,
  createDecipheriv,
  createHmac,
  createSecretKey,
  type CipherCCM,
  type DecipherCCM,
  type KeyObject,
} from 'node:crypto';
import {
  EXPLICIT_NONCE_BYTES,
  FIXED_IV_BYTES,
  KEY_BYTES,
  MASTER_SECRET_BYTES,
  RECORD_HEADER_BYTES,
  TAG_BYTES,
  VERIFY_DATA_BYTES,
} from './constants.js';

/**
 * P_SHA256 of RFC 5246 §5:
 *   P_hash(secret, seed) = HMAC_hash(secret, A(1) + seed) + HMAC_hash(secret, A(2) + seed) + ...
 *   A(0) = seed, A(i) = HMAC_hash(secret, A(i-1)).
 */
function pSha256(secretIn: Buffer | KeyObject, seed: Buffer, length: number): Buffer {
  const secret = Buffer.isBuffer(secretIn) ? createSecretKey(secretIn) : secretIn;
  const out = Buffer.allocUnsafe(length);
  let a = seed;
  let written = 0;
  while (written < length) {
    const next = createHmac('sha256', secret).update(a).digest();
    if (a !== seed) a.fill(0);
    a = next;
    const block = createHmac('sha256', secret).update(a).update(seed).digest();
    written += block.copy(out, written, 0, Math.min(block.length, length - written));
    // The blocks are the output (a master secret, a key block): none is left behind in memory.
    block.fill(0);
  }
  a.fill(0);
  return out;
}

/** The TLS 1.2 PRF (RFC 5246 §5): PRF(secret, label, seed) = P_SHA256(secret, label + seed). */
export function prf(secret: Buffer | KeyObject, label: string, seed: Buffer, length: number): Buffer {
  return pSha256(secret, Buffer.concat([Buffer.from(label, 'ascii'), seed]), length);
}

/**
 * RFC 4279 §2: the premaster secret of plain PSK is
 *   uint16 N, N zero bytes, uint16 N, the N-byte PSK.
 */
export function pskPremaster(psk: Buffer): Buffer {
  const n = psk.length;
  const out = Buffer.alloc(4 + 2 * n);
  out.writeUInt16BE(n, 0);
  out.writeUInt16BE(n, 2 + n);
  psk.copy(out, 4 + n);
  return out;
}

/** RFC 5246 §8.1: master_secret = PRF(pre_master_secret, "master secret", ClientHello.random + ServerHello.random)[0..47]. */
export function masterSecret(premaster: Buffer, clientRandom: Buffer, serverRandom: Buffer): Buffer {
  return prf(premaster, 'master secret', Buffer.concat([clientRandom, serverRandom]), MASTER_SECRET_BYTES);
}

/** RFC 7627 §4: master_secret = PRF(pre_master_secret, "extended master secret", session_hash)[0..47]. */
export function extendedMasterSecret(premaster: Buffer, sessionHash: Buffer): Buffer {
  return prf(premaster, 'extended master secret', sessionHash, MASTER_SECRET_BYTES);
}

/** Byte offsets inside the 40-byte key block of RFC 5246 §6.3 for an AEAD suite (no MAC keys, RFC 6655 §3). */
export const KeyBlock = {
  clientWriteKey: 0,
  serverWriteKey: KEY_BYTES,
  clientWriteIv: 2 * KEY_BYTES,
  serverWriteIv: 2 * KEY_BYTES + FIXED_IV_BYTES,
  length: 2 * KEY_BYTES + 2 * FIXED_IV_BYTES,
} as const;

/**
 * RFC 5246 §6.3: key_block = PRF(master_secret, "key expansion", server_random + client_random),
 * partitioned client_write_MAC_key (0 bytes for AEAD), server_write_MAC_key (0), client_write_key (16),
 * server_write_key (16), client_write_IV (4), server_write_IV (4).
 */
export function keyBlock(master: Buffer | KeyObject, clientRandom: Buffer, serverRandom: Buffer): Buffer {
  return prf(master, 'key expansion', Buffer.concat([serverRandom, clientRandom]), KeyBlock.length);
}

/** RFC 5246 §7.4.9: verify_data = PRF(master_secret, finished_label, Hash(handshake_messages))[0..11]. */
export function finishedVerifyData(
  master: Buffer | KeyObject,
  sender: 'client' | 'server',
  transcriptHash: Buffer,
): Buffer {
  return prf(master, `${sender} finished`, transcriptHash, VERIFY_DATA_BYTES);
}

/**
 * Additional data of an AEAD record, RFC 5246 §6.2.3.3 as DTLS reads it (RFC 6347 §4.1.2.1):
 *   seq_num (epoch(2) + sequence_number(6)) + type(1) + version(2) + length(2),
 * where length is that of the plaintext.
 */
export function additionalData(
  epoch: number,
  seq: number,
  type: number,
  version: number,
  plaintextLength: number,
): Buffer {
  return Buffer.from(additionalDataScratch(epoch, seq, type, version, plaintextLength));
}

/** The CCM-8 parameters of every record cipher (one object, not one per record). */
const CCM_8 = Object.freeze({ authTagLength: TAG_BYTES });

// One nonce and one additional-data buffer for every record: createCipheriv/createDecipheriv copy the nonce
// into the OpenSSL context and setAAD consumes its input before returning (node:crypto is synchronous here), so
// reusing them is safe, and it saves two Buffers per record (fewer objects for the scavenger on a fan-out).
// The nonce's first 4 bytes are the write IV (key block material): they are zeroed as soon as the cipher holds
// them (sealCcm8Into, openCcm8).
const nonceScratch = Buffer.alloc(FIXED_IV_BYTES + EXPLICIT_NONCE_BYTES);
const aadScratch = Buffer.alloc(13);

/**
 * RFC 6655 §3: nonce = the 4-byte implicit salt (client/server_write_IV: 4 bytes, or the same as a big-endian
 * int32) + the record's 8-byte explicit nonce (from `explicit` at `at`). Returns the shared scratch buffer.
 */
function ccmNonce(salt: Buffer | number, explicit: Buffer, at: number): Buffer {
  if (typeof salt === 'number') nonceScratch.writeInt32BE(salt, 0);
  else if (salt.length === FIXED_IV_BYTES) salt.copy(nonceScratch, 0);
  else throw new RangeError(`the CCM salt must be ${FIXED_IV_BYTES} bytes`);
  explicit.copy(nonceScratch, FIXED_IV_BYTES, at, at + EXPLICIT_NONCE_BYTES);
  return nonceScratch;
}

/**
 * The setAAD options of every record cipher, one object whose plaintextLength is set before each call: setAAD
 * reads it before returning (node:crypto is synchronous here), so no options object is made per record.
 */
const aadOptions = { plaintextLength: 0 };

/** additionalData written into the shared scratch buffer (see above); the record paths use this one. */
function additionalDataScratch(
  epoch: number,
  seq: number,
  type: number,
  version: number,
  plaintextLength: number,
): Buffer {
  aadScratch.writeUInt16BE(epoch, 0);
  aadScratch.writeUIntBE(seq, 2, 6);
  aadScratch[8] = type;
  aadScratch.writeUInt16BE(version, 9);
  aadScratch.writeUInt16BE(plaintextLength, 11);
  return aadScratch;
}

/**
 * Seals a record payload with AES-128-CCM_8 (RFC 6655 §3): the CCM nonce (12 bytes, so L = 3) is the
 * 4-byte implicit salt from the key block followed by the 8-byte explicit nonce, and the explicit nonce
 * is carried in front of the ciphertext. We use epoch + sequence_number as the explicit nonce, which
 * RFC 6655 §3 allows and which never repeats under one key (RFC 6347 §4.1: a sequence number is never
 * reused within an epoch).
 * Returns explicit_nonce(8) + ciphertext + tag(8).
 */
export function sealCcm8(
  key: Buffer | KeyObject,
  salt: Buffer,
  epoch: number,
  seq: number,
  type: number,
  version: number,
  plaintext: Buffer,
): Buffer {
  const out = Buffer.allocUnsafe(EXPLICIT_NONCE_BYTES + plaintext.length + TAG_BYTES);
  sealCcm8Into(out, 0, key, salt, epoch, seq, type, version, plaintext);
  return out;
}

/**
 * Writes explicit_nonce(8) + ciphertext + tag(8) into `out` at `at` (see sealCcm8): the explicit nonce is
 * epoch(2) + sequence_number(6), as in the record header.
 */
function sealCcm8Into(
  out: Buffer,
  at: number,
  key: Buffer | KeyObject,
  salt: Buffer | number,
  epoch: number,
  seq: number,
  type: number,
  version: number,
  plaintext: Buffer,
): void {
  out.writeUInt16BE(epoch, at);
  out.writeUIntBE(seq, at + 2, 6);
  // The shared nonce's salt (write IV) is zeroed as soon as the cipher holds its copy, also when making it
  // throws (a cold review found a throwing call left a write IV behind for the next one). No closure per record.
  let cipher: CipherCCM;
  try {
    cipher = createCipheriv('aes-128-ccm', key, ccmNonce(salt, out, at), CCM_8);
  } finally {
    nonceScratch.writeInt32BE(0, 0);
  }
  aadOptions.plaintextLength = plaintext.length;
  cipher.setAAD(additionalDataScratch(epoch, seq, type, version, plaintext.length), aadOptions);
  const body = cipher.update(plaintext);
  cipher.final();
  body.copy(out, at + EXPLICIT_NONCE_BYTES);
  cipher.getAuthTag().copy(out, at + EXPLICIT_NONCE_BYTES + body.length);
}

/**
 * Opens explicit_nonce(8) + ciphertext + tag(8) (RFC 6655 §3); the explicit nonce is taken from the
 * record as sent. Returns the plaintext, or undefined when the record does not authenticate (the caller
 * drops it silently, RFC 6347 §4.1.2.7).
 */
export function openCcm8(
  key: Buffer | KeyObject,
  salt: Buffer | number,
  epoch: number,
  seq: number,
  type: number,
  version: number,
  fragment: Buffer,
): Buffer | undefined {
  const plaintextLength = fragment.length - EXPLICIT_NONCE_BYTES - TAG_BYTES;
  if (plaintextLength < 0) return undefined;
  // The salt is zeroed as soon as the decipher holds it (see sealCcm8Into).
  let decipher: DecipherCCM;
  try {
    decipher = createDecipheriv('aes-128-ccm', key, ccmNonce(salt, fragment, 0), CCM_8);
  } finally {
    nonceScratch.writeInt32BE(0, 0);
  }
  decipher.setAuthTag(fragment.subarray(fragment.length - TAG_BYTES));
  aadOptions.plaintextLength = plaintextLength;
  decipher.setAAD(additionalDataScratch(epoch, seq, type, version, plaintextLength), aadOptions);
  // node's CCM decipher reports a failed tag by throwing from update() or final(); both mean "drop".
  try {
    const plaintext = decipher.update(
      fragment.subarray(EXPLICIT_NONCE_BYTES, EXPLICIT_NONCE_BYTES + plaintextLength),
    );
    decipher.final();
    return plaintext;
  } catch {
    return undefined;
  }
}

/**
 * A whole protected record, written into one buffer: the record header (RFC 6347 §4.1), then
 * explicit_nonce(8) + ciphertext + tag(8) as `sealCcm8` makes them. The length field is that of the protected
 * fragment; the additional data carries the plaintext length (RFC 5246 §6.2.3.3).
 */
export function sealCcm8Record(
  key: KeyObject,
  salt: Buffer | number,
  epoch: number,
  seq: number,
  type: number,
  version: number,
  plaintext: Buffer,
): Buffer {
  const fragmentLength = EXPLICIT_NONCE_BYTES + plaintext.length + TAG_BYTES;
  const out = Buffer.allocUnsafe(RECORD_HEADER_BYTES + fragmentLength);
  out[0] = type;
  out.writeUInt16BE(version, 1);
  out.writeUInt16BE(epoch, 3);
  out.writeUIntBE(seq, 5, 6);
  out.writeUInt16BE(fragmentLength, 11);
  sealCcm8Into(out, RECORD_HEADER_BYTES, key, salt, epoch, seq, type, version, plaintext);
  return out;
}
