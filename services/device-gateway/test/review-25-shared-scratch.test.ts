/* eslint-disable jest/no-conditional-expect -- the differential checks compare against a reference per operation kind */
// Review 25 (cold review of 9805ca6, shared nonce/AAD scratch buffers): differential and adversarial checks of
// the record path against an independent AES-128-CCM-8 implementation that allocates fresh buffers per call.
import { createCipheriv, createDecipheriv, createSecretKey, randomBytes } from 'node:crypto';
import { ContentType, DTLS_1_2 } from '../src/dtls/constants.js';
import { KeyBlock, openCcm8, sealCcm8, sealCcm8Record } from '../src/dtls/crypto.js';
import { ConnectionState } from '../src/dtls/record-layer.js';
import { parseRecords } from '../src/dtls/record.js';
import type { DtlsRecord } from '../src/dtls/record.js';

/** Independent reference: nonce = salt(4) + explicit(8); AAD = epoch seq type version len. Fresh buffers. */
function refNonce(salt: Buffer, epoch: number, seq: number): Buffer {
  const n = Buffer.alloc(12);
  salt.copy(n, 0, 0, 4);
  n.writeUInt16BE(epoch, 4);
  n.writeUIntBE(seq, 6, 6);
  return n;
}
function refAad(epoch: number, seq: number, type: number, version: number, len: number): Buffer {
  const a = Buffer.alloc(13);
  a.writeUInt16BE(epoch, 0);
  a.writeUIntBE(seq, 2, 6);
  a[8] = type;
  a.writeUInt16BE(version, 9);
  a.writeUInt16BE(len, 11);
  return a;
}
function refSealRecord(
  key: Buffer,
  salt: Buffer,
  epoch: number,
  seq: number,
  type: number,
  pt: Buffer,
): Buffer {
  const c = createCipheriv('aes-128-ccm', key, refNonce(salt, epoch, seq), { authTagLength: 8 });
  c.setAAD(refAad(epoch, seq, type, DTLS_1_2, pt.length), { plaintextLength: pt.length });
  const body = Buffer.concat([c.update(pt), c.final()]);
  const tag = c.getAuthTag();
  const frag = Buffer.concat([refNonce(salt, epoch, seq).subarray(4), body, tag]);
  const hdr = Buffer.alloc(13);
  hdr[0] = type;
  hdr.writeUInt16BE(DTLS_1_2, 1);
  hdr.writeUInt16BE(epoch, 3);
  hdr.writeUIntBE(seq, 5, 6);
  hdr.writeUInt16BE(frag.length, 11);
  return Buffer.concat([hdr, frag]);
}
function refOpen(key: Buffer, salt: Buffer, rec: DtlsRecord): Buffer | undefined {
  const f = rec.fragment;
  const len = f.length - 16;
  if (len < 0) return undefined;
  const nonce = Buffer.concat([salt.subarray(0, 4), f.subarray(0, 8)]);
  const d = createDecipheriv('aes-128-ccm', key, nonce, { authTagLength: 8 });
  d.setAuthTag(Buffer.from(f.subarray(f.length - 8)));
  d.setAAD(refAad(rec.epoch, rec.seq, rec.type, rec.version, len), { plaintextLength: len });
  try {
    const pt = d.update(Buffer.from(f.subarray(8, 8 + len)));
    d.final();
    return pt;
  } catch {
    return undefined;
  }
}

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Peer {
  block: Buffer;
  state: ConnectionState;
  clientKey: Buffer;
  serverKey: Buffer;
  clientIv: Buffer;
  serverIv: Buffer;
  clientSeq: number;
  serverSeq: number;
}

function newPeer(): Peer {
  const block = randomBytes(KeyBlock.length);
  return {
    block,
    state: new ConnectionState(block),
    clientKey: block.subarray(KeyBlock.clientWriteKey, KeyBlock.clientWriteKey + 16),
    serverKey: block.subarray(KeyBlock.serverWriteKey, KeyBlock.serverWriteKey + 16),
    clientIv: block.subarray(KeyBlock.clientWriteIv, KeyBlock.clientWriteIv + 4),
    serverIv: block.subarray(KeyBlock.serverWriteIv, KeyBlock.serverWriteIv + 4),
    clientSeq: 0,
    serverSeq: 0,
  };
}

describe('review 25: shared nonce/AAD scratch buffers', () => {
  it('node copies the IV at createCipheriv and consumes the AAD at setAAD (the premise of 9805ca6)', () => {
    const key = randomBytes(16);
    const iv = randomBytes(12);
    const aad = randomBytes(13);
    const pt = randomBytes(100);
    const ref = refSealLike(key, Buffer.from(iv), Buffer.from(aad), pt);
    const c = createCipheriv('aes-128-ccm', key, iv, { authTagLength: 8 });
    iv.fill(0xaa); // mutate after the cipher holds it
    c.setAAD(aad, { plaintextLength: pt.length });
    aad.fill(0x55); // mutate after setAAD
    const out = Buffer.concat([c.update(pt), c.final(), c.getAuthTag()]);
    expect(out.equals(ref)).toBe(true);
    function refSealLike(k: Buffer, n: Buffer, a: Buffer, p: Buffer): Buffer {
      const x = createCipheriv('aes-128-ccm', k, n, { authTagLength: 8 });
      x.setAAD(a, { plaintextLength: p.length });
      return Buffer.concat([x.update(p), x.final(), x.getAuthTag()]);
    }
  });

  it('interleaved seals/opens of many sessions, with failed opens and thrown calls between, match the reference', () => {
    const r = rng(25);
    const peers = Array.from({ length: 40 }, newPeer);
    const badKey = Buffer.alloc(15); // createCipheriv throws: the salt is left in the shared nonce
    let opened = 0;
    let rejected = 0;
    for (let i = 0; i < 6000; i++) {
      const p = peers[Math.floor(r() * peers.length)]!;
      const op = Math.floor(r() * 8);
      if (op === 0) {
        // server seal through the real record layer, checked byte for byte against the reference
        const pt = randomBytes(Math.floor(r() * 300));
        const seq = p.serverSeq++;
        const got = p.state.seal(ContentType.applicationData, pt)!;
        const want = refSealRecord(p.serverKey, p.serverIv, 1, seq, ContentType.applicationData, pt);
        expect(got.equals(want)).toBe(true);
      } else if (op === 1 || op === 2) {
        // a genuine client record opens to its plaintext
        const pt = randomBytes(Math.floor(r() * 300));
        const seq = p.clientSeq++;
        const rec = parseRecords(
          refSealRecord(p.clientKey, p.clientIv, 1, seq, ContentType.applicationData, pt),
        ).records[0]!;
        const got = p.state.open(rec);
        expect(Buffer.isBuffer(got) && got.equals(pt)).toBe(true);
        opened++;
        // its replay is refused
        expect(p.state.open(rec)).toBe('replay');
      } else if (op === 3) {
        // a record sealed with ANOTHER session's keys never opens here (no cross-session salt/AAD carry-over)
        const q = peers[Math.floor(r() * peers.length)]!;
        if (q === p) continue;
        const pt = randomBytes(20);
        const rec = parseRecords(
          refSealRecord(q.clientKey, q.clientIv, 1, p.clientSeq + 1000, ContentType.applicationData, pt),
        ).records[0]!;
        expect(p.state.open(rec)).toBe('mac');
        rejected++;
      } else if (op === 4) {
        // tampered genuine record: header seq (AAD), explicit nonce, ciphertext or tag changed
        const pt = randomBytes(1 + Math.floor(r() * 100));
        const seq = p.clientSeq + 500 + Math.floor(r() * 1000);
        const wire = refSealRecord(p.clientKey, p.clientIv, 1, seq, ContentType.applicationData, pt);
        const where = [6, 10, 13 + 3, 13 + 7, 13 + 8, wire.length - 1, 0][Math.floor(r() * 7)]!;
        wire[where]! ^= 1 << Math.floor(r() * 8);
        const parsed = parseRecords(wire).records[0];
        if (parsed !== undefined) {
          const got = p.state.open(parsed);
          expect(got === 'mac' || got === 'replay').toBe(true);
          expect(refOpen(p.clientKey, p.clientIv, parsed)).toBeUndefined();
          rejected++;
        }
      } else if (op === 5) {
        // thrown calls mid-way: after the nonce is filled, after the AAD is half written
        expect(() => sealCcm8(badKey, p.serverIv, 1, 7, 23, DTLS_1_2, Buffer.alloc(3))).toThrow();
        expect(() => sealCcm8(p.serverKey, p.serverIv, 1, 7, 23, DTLS_1_2, Buffer.alloc(70000))).toThrow();
        expect(openCcm8(p.serverKey, p.serverIv, 1, 7, 23, DTLS_1_2, Buffer.alloc(15))).toBeUndefined();
      } else if (op === 6) {
        // exported primitives agree with the reference too
        const pt = randomBytes(Math.floor(r() * 64));
        const seq = Math.floor(r() * 2 ** 47);
        const key = createSecretKey(p.serverKey);
        const rec = sealCcm8Record(key, p.serverIv.readInt32BE(0), 1, seq, 22, DTLS_1_2, pt);
        expect(rec.equals(refSealRecord(p.serverKey, p.serverIv, 1, seq, 22, pt))).toBe(true);
        const frag = sealCcm8(p.serverKey, p.serverIv, 1, seq, 22, DTLS_1_2, pt);
        expect(openCcm8(p.serverKey, p.serverIv, 1, seq, 22, DTLS_1_2, frag)!.equals(pt)).toBe(true);
      } else {
        p.state.release(); // keys remade on next use; sequence numbers must continue
      }
    }
    expect(opened).toBeGreaterThan(500);
    expect(rejected).toBeGreaterThan(500);
  });

  it('the explicit nonces of one write key never repeat (epoch 1 || seq, continuing across key-object release)', () => {
    const p = newPeer();
    const seen = new Set<string>();
    for (let i = 0; i < 3000; i++) {
      if (i % 97 === 0) p.state.release();
      if (i % 211 === 0) p.state.releaseIfUnused();
      const rec = parseRecords(p.state.seal(ContentType.applicationData, Buffer.alloc(1))!).records[0]!;
      const explicit = rec.fragment.subarray(0, 8);
      expect(explicit.readUInt16BE(0)).toBe(rec.epoch);
      expect(explicit.readUIntBE(2, 6)).toBe(rec.seq);
      const k = explicit.toString('hex');
      expect(seen.has(k)).toBe(false);
      seen.add(k);
    }
  });

  it('a call that throws in createCipheriv leaves no write IV in the shared nonce, and a short salt is refused', () => {
    // Not reachable from the server (salts are always int32 numbers there); shown because the brief asks about
    // exception paths leaving stale bytes. releaseNonce() is not in a finally, and ccmNonce() does not check the
    // salt length. A short salt should be refused, or at least not be completed from another call's salt.
    const key = randomBytes(16);
    const secretSalt = Buffer.from([0xde, 0xad, 0xbe, 0xef]);
    expect(() => sealCcm8(Buffer.alloc(15), secretSalt, 1, 1, 23, DTLS_1_2, Buffer.alloc(1))).toThrow();
    const pt = Buffer.from('x');
    const shortSalt = Buffer.from([0x01, 0x02]);
    // Before the fix this sealed with 01 02 be ef: the stale bytes completed the nonce.
    expect(() => sealCcm8(key, shortSalt, 1, 5, 23, DTLS_1_2, pt)).toThrow(/salt must be 4 bytes/);
    const sealed = sealCcm8(key, Buffer.from([0x01, 0x02, 0x03, 0x04]), 1, 5, 23, DTLS_1_2, pt);
    expect(openCcm8(key, Buffer.from([0x01, 0x02, 0xbe, 0xef]), 1, 5, 23, DTLS_1_2, sealed)).toBeUndefined();
  });
});
