// Known-answer and unit tests of the DTLS building blocks: the TLS 1.2 PRF, node's AES-CCM as we use it,
// our record sealing checked against records written by OpenSSL, the replay window, the cookie and the
// reassembly bounds.
import { createCipheriv, createDecipheriv, createHash, createSecretKey } from 'node:crypto';
import { ContentType, DTLS_1_2, HandshakeType } from '../src/dtls/constants.js';
import {
  KeyBlock,
  extendedMasterSecret,
  finishedVerifyData,
  keyBlock,
  openCcm8,
  prf,
  pskPremaster,
  sealCcm8,
} from '../src/dtls/crypto.js';
import {
  CookieJar,
  Reassembler,
  encodeHandshake,
  parseClientHello,
  parseHandshakeFragments,
} from '../src/dtls/handshake.js';
import type { HandshakeFragment } from '../src/dtls/handshake.js';
import { prng } from './support/dtls.js';
import {
  encodeRecord,
  newReplayWindow,
  parseRecords,
  replayAccept,
  replayCheck,
} from '../src/dtls/record.js';

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

describe('TLS 1.2 PRF (RFC 5246 §5, P_SHA256)', () => {
  it('reproduces the published SHA-256 test vector', () => {
    // The vector posted to the IETF TLS list, https://www.ietf.org/mail-archive/web/tls/current/msg03416.html
    // (also used by e.g. tompetersen/bachelor-thesis PseudoRandomFunction.java).
    const out = prf(
      hex('9bbe436ba940f017b17652849a71db35'),
      'test label',
      hex('a0ba9f936cda311827a6f796ffd5198c'),
      100,
    );
    expect(out.toString('hex')).toBe(
      'e3f229ba727be17b8d122620557cd453c2aab21d07c3d495329b52d4e61edb5a6b301791e90d35c9c9a46b4e14baf9af' +
        '0fa022f7077def17abfd3797c0564bab4fbc91666e9def9b97fce34f796789baa48082d122ee42c5a72e5a5110fff7' +
        '0187347b66',
    );
  });

  it('gives the same bytes for a secret passed as a key object (the handshake passes the master secret so)', () => {
    const secret = hex('9bbe436ba940f017b17652849a71db35');
    const seed = hex('a0ba9f936cda311827a6f796ffd5198c');
    expect(prf(createSecretKey(secret), 'test label', seed, 100).toString('hex')).toBe(
      prf(secret, 'test label', seed, 100).toString('hex'),
    );
  });

  it('builds the RFC 4279 §2 premaster secret: uint16 N, N zeros, uint16 N, psk', () => {
    expect(pskPremaster(hex('aabbcc')).toString('hex')).toBe('0003' + '000000' + '0003' + 'aabbcc');
  });
});

describe("node's aes-128-ccm with an 8-byte tag (RFC 3610 §8 packet vectors #1-#3, M = 8, L = 2)", () => {
  const key = hex('c0c1c2c3c4c5c6c7c8c9cacbcccdcecf');
  const aad = hex('0001020304050607');
  const vectors = [
    [
      '00000003020100a0a1a2a3a4a5',
      '08090a0b0c0d0e0f101112131415161718191a1b1c1d1e',
      '588c979a61c663d2f066d0c2c0f989806d5f6b61dac384',
      '17e8d12cfdf926e0',
    ],
    [
      '00000004030201a0a1a2a3a4a5',
      '08090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f',
      '72c91a36e135f8cf291ca894085c87e3cc15c439c9e43a3b',
      'a091d56e10400916',
    ],
    [
      '00000005040302a0a1a2a3a4a5',
      '08090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20',
      '51b1e5f44a197d1da46b0f8e2d282ae871e838bb64da859657',
      '4adaa76fbd9fb0c5',
    ],
  ] as const;

  it.each(vectors)('nonce %s seals and opens as RFC 3610 says', (nonce, plain, ct, tag) => {
    const c = createCipheriv('aes-128-ccm', key, hex(nonce), { authTagLength: 8 });
    c.setAAD(aad, { plaintextLength: hex(plain).length });
    const body = c.update(hex(plain));
    c.final();
    expect(body.toString('hex')).toBe(ct);
    expect(c.getAuthTag().toString('hex')).toBe(tag);

    const d = createDecipheriv('aes-128-ccm', key, hex(nonce), { authTagLength: 8 });
    d.setAuthTag(hex(tag));
    d.setAAD(aad, { plaintextLength: hex(ct).length });
    expect(d.update(hex(ct)).toString('hex')).toBe(plain);
    expect(() => d.final()).not.toThrow();
  });
});

/**
 * One handshake of `openssl s_client -dtls1_2 -psk_identity dev1 -psk 00112233445566778899aabbccddeeff
 * -cipher PSK-AES128-CCM8 -keylogfile` (OpenSSL 3.0.19, extended master secret offered by default)
 * against this server, recorded by a UDP relay on this machine. The master secret is OpenSSL's own
 * (its key log), so everything derived below is checked against an independent implementation.
 */
const capture = {
  psk: hex('00112233445566778899aabbccddeeff'),
  clientRandom: hex('10605adf9e069ad14a490dd068ede33301f29f1dc98ebccef368f7c395215f50'),
  masterFromOpenSslKeyLog: hex(
    '92fe3789f4698fac36240bbf582f272640dc358b87880ffbc09d173145215c3a58700963826e7e2fda4980b5559b1d97',
  ),
  // ClientHello with cookie (client -> server)
  clientHello2:
    '16feff00000000000000010094010000880001000000000088fefd10605adf9e069ad14a490dd068ede33301f29f1dc98ebccef3' +
    '68f7c395215f500020a602935530a4b001ef2936be2d2b02568bcee7d7086a605b77ddaf22a51157de0004c0a800ff0100003a0023' +
    '00000016000000170000000d002a0028040305030603080708080809080a080b080408050806040105010601030303010302040205020602',
  // ServerHello + ServerHelloDone (server -> client)
  serverFlight:
    '16fefd0000000000000001003d020000310001000000000031fefdc8041e2119b3acccc4dfba41dc6f011bba739544d9421331da5e' +
    'f83f22d1127200c0a800000900170000ff0100010016fefd0000000000000002000c0e0000000002000000000000',
  // ClientKeyExchange + ChangeCipherSpec + Finished (client -> server)
  clientFlight:
    '16fefd0000000000000002001210000006000200000000000600046465763114fefd000000000000000300010116fefd000100000000' +
    '00000028000100000000000043d3d04e3a1c7f1d7efa95ea488835f40ef9e5ba323523fc4ee66fbfc427da0b',
  // application_data "known answer\n" (client -> server)
  clientData: '17fefd0001000000000001001d00010000000000017945ee247f4ab267001e6e0251c3dfb652d505a2fc',
};

describe('record protection against records written by OpenSSL', () => {
  const ch2 = parseRecords(hex(capture.clientHello2)).records;
  const sf = parseRecords(hex(capture.serverFlight)).records;
  const cf = parseRecords(hex(capture.clientFlight)).records;
  const serverRandom = sf[0]!.fragment.subarray(12 + 2, 12 + 34);
  // RFC 6347 §4.2.6: the transcript is the messages with their DTLS headers, from the ClientHello that
  // carried the cookie up to and including ClientKeyExchange (RFC 7627 §3 session_hash).
  const sessionHash = createHash('sha256')
    .update(ch2[0]!.fragment)
    .update(sf[0]!.fragment)
    .update(sf[1]!.fragment)
    .update(cf[0]!.fragment)
    .digest();

  it("derives OpenSSL's extended master secret from the PSK and the transcript (RFC 7627 §4)", () => {
    const ours = extendedMasterSecret(pskPremaster(capture.psk), sessionHash);
    expect(ours.toString('hex')).toBe(capture.masterFromOpenSslKeyLog.toString('hex'));
  });

  it("opens OpenSSL's Finished and application data and reseals them byte for byte", () => {
    const keys = keyBlock(capture.masterFromOpenSslKeyLog, capture.clientRandom, serverRandom);
    const ck = keys.subarray(KeyBlock.clientWriteKey, KeyBlock.clientWriteKey + 16);
    const civ = keys.subarray(KeyBlock.clientWriteIv, KeyBlock.clientWriteIv + 4);

    const fin = cf[2]!;
    expect([fin.type, fin.epoch, fin.seq]).toEqual([ContentType.handshake, 1, 0]);
    const finPlain = openCcm8(ck, civ, fin.epoch, fin.seq, fin.type, fin.version, fin.fragment)!;
    expect(finPlain).toBeDefined();
    const verify = finishedVerifyData(capture.masterFromOpenSslKeyLog, 'client', sessionHash);
    expect(finPlain.toString('hex')).toBe(encodeHandshake(HandshakeType.finished, 3, verify).toString('hex'));
    // The master secret as one key object (server-handshaker.ts) gives the same key block and Finished.
    const masterKey = createSecretKey(capture.masterFromOpenSslKeyLog);
    expect(keyBlock(masterKey, capture.clientRandom, serverRandom).equals(keys)).toBe(true);
    expect(finishedVerifyData(masterKey, 'client', sessionHash).equals(verify)).toBe(true);

    const data = parseRecords(hex(capture.clientData)).records[0]!;
    const plain = openCcm8(ck, civ, data.epoch, data.seq, data.type, data.version, data.fragment)!;
    expect(plain.toString()).toBe('known answer\n');
    // Our sealing (explicit nonce = epoch + seq, RFC 6655 §3; AD of RFC 5246 §6.2.3.3) gives OpenSSL's bytes.
    const resealed = sealCcm8(ck, civ, 1, data.seq, data.type, DTLS_1_2, plain);
    expect(encodeRecord(data.type, DTLS_1_2, 1, data.seq, resealed).toString('hex')).toBe(capture.clientData);

    // Any flipped bit, in the header (AD) or the body, fails authentication.
    for (let i = 0; i < data.fragment.length; i++) {
      const bad = Buffer.from(data.fragment);
      bad[i]! ^= 0x01;
      expect(openCcm8(ck, civ, data.epoch, data.seq, data.type, data.version, bad)).toBeUndefined();
    }
    expect(
      openCcm8(ck, civ, data.epoch, data.seq + 1, data.type, data.version, data.fragment),
    ).toBeUndefined();
    expect(
      openCcm8(ck, civ, data.epoch, data.seq, ContentType.alert, data.version, data.fragment),
    ).toBeUndefined();
  });
});

describe('anti-replay window (RFC 6347 §4.1.2.6)', () => {
  it('accepts each number once, rejects numbers 64 or more below the highest, and moves only on accept', () => {
    const w = newReplayWindow();
    expect(replayCheck(w, 0)).toBe(true);
    // Not accepted (e.g. the MAC failed): still acceptable afterwards.
    expect(replayCheck(w, 0)).toBe(true);
    replayAccept(w, 0);
    expect(replayCheck(w, 0)).toBe(false);
    replayAccept(w, 100);
    expect(replayCheck(w, 36)).toBe(false); // 100 - 36 = 64: outside the window
    expect(replayCheck(w, 37)).toBe(true);
    replayAccept(w, 37);
    expect(replayCheck(w, 37)).toBe(false);
    expect(replayCheck(w, 99)).toBe(true);
    expect(replayCheck(w, 2 ** 48 - 1)).toBe(true);
  });

  it('agrees with a set-based model on 50,000 random sequence numbers', () => {
    const rnd = prng(6347);
    const w = newReplayWindow();
    const seen = new Set<number>();
    const mismatches: string[] = [];
    let top = -1;
    for (let i = 0; i < 50_000; i++) {
      // Mostly near the top, sometimes far ahead, sometimes old.
      const r = rnd();
      const seq = Math.max(
        0,
        r < 0.1 ? top + 1 + Math.floor(rnd() * 200) : top - 70 + Math.floor(rnd() * 75),
      );
      const expected = seq > top || (top - seq < 64 && !seen.has(seq));
      if (replayCheck(w, seq) !== expected) mismatches.push(`#${i}: seq ${seq} top ${top}`);
      if (expected && rnd() < 0.9) {
        replayAccept(w, seq);
        seen.add(seq);
        top = Math.max(top, seq);
      }
    }
    expect(mismatches).toEqual([]);
  });
});

function helloBody(cookie: Buffer, random = Buffer.alloc(32, 7)): Buffer {
  const ext = hex('0017 0000');
  return Buffer.concat([
    hex('fefd'),
    random,
    Buffer.from([0]),
    Buffer.from([cookie.length]),
    cookie,
    hex('0004 c0a8 00ff'),
    hex('01 00'),
    Buffer.from([0, ext.length]),
    ext,
  ]);
}

describe('HelloVerifyRequest cookie (RFC 6347 §4.2.1)', () => {
  it('is stateless: it verifies for the same peer and hello and for nothing else', () => {
    const jar = new CookieJar(1000, 0);
    const first = helloBody(Buffer.alloc(0));
    const cookie = jar.make('10.0.0.1', 5000, first, parseClientHello(first)!);
    const second = helloBody(cookie);
    const hello = parseClientHello(second)!;
    expect(hello.cookie.equals(cookie)).toBe(true);
    expect(jar.verify('10.0.0.1', 5000, second, hello)).toBe(true);
    expect(jar.verify('10.0.0.1', 5001, second, hello)).toBe(false);
    expect(jar.verify('10.0.0.2', 5000, second, hello)).toBe(false);
    const otherRandom = helloBody(cookie, Buffer.alloc(32, 8));
    expect(jar.verify('10.0.0.1', 5000, otherRandom, parseClientHello(otherRandom)!)).toBe(false);
    const forged = Buffer.from(cookie);
    forged[0]! ^= 1;
    const forgedBody = helloBody(forged);
    expect(jar.verify('10.0.0.1', 5000, forgedBody, parseClientHello(forgedBody)!)).toBe(false);
    // A different jar (another secret) does not accept it.
    expect(new CookieJar(1000, 0).verify('10.0.0.1', 5000, second, hello)).toBe(false);
  });

  it('stays valid across one rotation of the secret and not across two', () => {
    const jar = new CookieJar(1000, 0);
    const first = helloBody(Buffer.alloc(0));
    const second = helloBody(jar.make('10.0.0.1', 5000, first, parseClientHello(first)!));
    const hello = parseClientHello(second)!;
    jar.maybeRotate(999);
    expect(jar.verify('10.0.0.1', 5000, second, hello)).toBe(true);
    jar.maybeRotate(1000);
    expect(jar.verify('10.0.0.1', 5000, second, hello)).toBe(true);
    jar.maybeRotate(2000);
    expect(jar.verify('10.0.0.1', 5000, second, hello)).toBe(false);
  });
});

describe('handshake reassembly bounds (RFC 6347 §4.2.3)', () => {
  const limits = {
    maxMessageBytes: 1000,
    maxFragmentsPerMessage: 4,
    maxPendingBytes: 1500,
    maxMessagesAhead: 2,
  };
  const frag = (seq: number, length: number, offset: number, body: Buffer, type = 16): HandshakeFragment => ({
    msgType: type,
    length,
    messageSeq: seq,
    fragmentOffset: offset,
    body,
  });

  it('reassembles out-of-order, overlapping fragments and delivers messages in order', () => {
    const r = new Reassembler(limits, 1);
    const msg1 = Buffer.from('abcdefghij');
    const msg2 = Buffer.from('0123456789');
    expect(r.add(frag(2, 10, 0, msg2), 0).kind).toBe('none'); // ahead of 1: buffered
    expect(r.add(frag(1, 10, 5, msg1.subarray(5)), 0).kind).toBe('none');
    expect(r.add(frag(1, 10, 3, msg1.subarray(3, 7)), 0).kind).toBe('none');
    const got = r.add(frag(1, 10, 0, msg1.subarray(0, 4)), 0);
    expect(got).toMatchObject({ kind: 'message', messageSeq: 1 });
    expect(got.kind === 'message' && got.body.toString()).toBe('abcdefghij');
    const next = r.drain();
    expect(next.kind === 'message' && next.body.toString()).toBe('0123456789');
    expect(r.bufferedBytes).toBe(0);
    expect(r.add(frag(1, 10, 0, msg1), 0).kind).toBe('old');
  });

  it('refuses messages over the length bound, too many fragments, too much pending data, or far ahead', () => {
    const r = new Reassembler(limits, 0);
    expect(r.add(frag(0, 1001, 0, Buffer.alloc(10)), 0)).toEqual({ kind: 'rejected', reason: 'too_large' });
    expect(r.add(frag(3, 10, 0, Buffer.alloc(10)), 0)).toEqual({ kind: 'rejected', reason: 'too_far_ahead' });
    for (let i = 0; i < 4; i++) expect(r.add(frag(0, 1000, i, Buffer.alloc(1)), 0).kind).toBe('none');
    expect(r.add(frag(0, 1000, 10, Buffer.alloc(1)), 0)).toEqual({
      kind: 'rejected',
      reason: 'too_many_fragments',
    });
    expect(r.bufferedBytes).toBe(0); // the message over the fragment bound was dropped whole
    expect(r.add(frag(1, 1000, 0, Buffer.alloc(1)), 0).kind).toBe('none');
    expect(r.add(frag(2, 1000, 0, Buffer.alloc(1)), 0)).toEqual({
      kind: 'rejected',
      reason: 'pending_bytes',
    });
    expect(r.add(frag(1, 999, 1, Buffer.alloc(1)), 0)).toEqual({ kind: 'rejected', reason: 'inconsistent' });
    expect(r.add(frag(1, 1000, 1, Buffer.alloc(1), 20), 0)).toEqual({
      kind: 'rejected',
      reason: 'inconsistent',
    });
    expect(r.add(frag(1, 1000, 1, Buffer.alloc(1)), 1)).toEqual({ kind: 'rejected', reason: 'inconsistent' });
    expect(r.bufferedBytes).toBe(1000);
  });

  it('rejects fragment headers that do not fit the record or the message', () => {
    expect(parseHandshakeFragments(hex('10 000010 0000 000000 000011'))).toBeUndefined();
    expect(parseHandshakeFragments(hex('10 000004 0000 000002 000003 aabbcc'))).toBeUndefined();
    expect(parseHandshakeFragments(hex('10 000004 0000 000001 000003 aabbcc'))).toHaveLength(1);
    expect(parseRecords(hex('16fefd00000000000000000005aabb')).malformed).toBe(true);
    expect(parseRecords(hex('16fefc00000000000000000001aa')).malformed).toBe(true);
  });
});
