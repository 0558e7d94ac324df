// The report resource's CBOR decoder (src/coap/cbor.ts) against RFC 8949 Appendix A's examples: every example
// in the subset decodes to its diagnostic value, every other one is refused (never approximated); then a seeded
// fuzz of mutated report bodies, which must each decode or throw CborError and nothing else. DEVICE_WORD_FUZZ_SEED
// and DEVICE_WORD_FUZZ_SCALE run it longer by hand.
import { encode } from 'cbor-x';
import { generate } from 'coap-packet';
import { CborError, MAX_DEPTH, decodeCbor } from '../src/coap/cbor.js';
import { parseReport, type DeviceReport } from '../src/coap/report-resource.js';
import { RawCoapClient, pathOptions } from './support/coap-client.js';
import { prng, sleep } from './support/dtls.js';
import { device, startCoap } from './support/harness.js';

const hex = (h: string): Buffer => Buffer.from(h, 'hex');

// RFC 8949 Appendix A, Table 6: (encoded, value) for the examples this subset holds.
const ACCEPTED: [string, unknown][] = [
  ['00', 0],
  ['01', 1],
  ['0a', 10],
  ['17', 23],
  ['1818', 24],
  ['1819', 25],
  ['1864', 100],
  ['1903e8', 1000],
  ['1a000f4240', 1000000],
  ['1b000000e8d4a51000', 1000000000000],
  ['20', -1],
  ['29', -10],
  ['3863', -100],
  ['3903e7', -1000],
  ['f90000', 0],
  ['f98000', -0],
  ['f93c00', 1],
  ['fb3ff199999999999a', 1.1],
  ['f93e00', 1.5],
  ['f97bff', 65504],
  ['fa47c35000', 100000],
  ['fa7f7fffff', 3.4028234663852886e38],
  ['fb7e37e43c8800759c', 1e300],
  ['f90001', 5.960464477539063e-8],
  ['f90400', 0.00006103515625],
  ['f9c400', -4],
  ['fbc010666666666666', -4.1],
  ['f4', false],
  ['f5', true],
  ['f6', null],
  ['60', ''],
  ['6161', 'a'],
  ['6449455446', 'IETF'],
  ['62225c', '"\\'],
  ['62c3bc', '\u00fc'],
  ['63e6b0b4', '\u6c34'],
  ['64f0908591', '\ud800\udd51'],
  ['80', []],
  ['83010203', [1, 2, 3]],
  ['8301820203820405', [1, [2, 3], [4, 5]]],
  ['98190102030405060708090a0b0c0d0e0f101112131415161718181819', Array.from({ length: 25 }, (_, i) => i + 1)],
  ['a0', {}],
  ['a26161016162820203', { a: 1, b: [2, 3] }],
  ['826161a161626163', ['a', { b: 'c' }]],
  ['a56161614161626142616361436164614461656145', { a: 'A', b: 'B', c: 'C', d: 'D', e: 'E' }],
];

// The examples outside it, each refused: integers past 2^53 − 1, bignums and other tags, infinities and NaN,
// undefined and other simple values, byte strings, indefinite lengths, maps with integer keys.
const REFUSED: string[] = [
  '1bffffffffffffffff', // 18446744073709551615
  'c249010000000000000000', // bignum
  '3bffffffffffffffff', // -18446744073709551616
  'c349010000000000000000', // negative bignum
  'f97c00', // Infinity
  'f97e00', // NaN
  'f9fc00', // -Infinity
  'fa7f800000',
  'fa7fc00000',
  'faff800000',
  'fb7ff0000000000000',
  'fb7ff8000000000000',
  'fbfff0000000000000',
  'f7', // undefined
  'f0', // simple(16)
  'f8ff', // simple(255)
  'c074323031332d30332d32315432303a30343a30305a', // tag 0
  'c11a514b67b0', // tag 1
  'c1fb41d452d9ec200000',
  'd74401020304', // tag 23
  'd818456449455446', // tag 24
  'd82076687474703a2f2f7777772e6578616d706c652e636f6d', // tag 32
  '40', // h''
  '4401020304',
  'a201020304', // {1: 2, 3: 4}
  '5f42010243030405ff', // indefinite byte string
  '7f657374726561646d696e67ff', // indefinite text string
  '9fff',
  '9f018202039f0405ffff',
  '9f01820203820405ff',
  '83018202039f0405ff',
  '83019f0203ff820405',
  'bf61610161629f0203ffff',
  '826161bf61626163ff',
  'bf6346756ef563416d7421ff',
];

describe('CBOR decoder (RFC 8949 Appendix A)', () => {
  it.each(ACCEPTED)('decodes %s', (encoded, value) => {
    // toEqual compares numbers with Object.is: -0 must decode as -0.
    expect(decodeCbor(hex(encoded))).toEqual(value);
  });

  it.each(REFUSED)('refuses %s', (encoded) => {
    expect(() => decodeCbor(hex(encoded))).toThrow(CborError);
  });

  it('refuses what is not one well-formed item of this subset', () => {
    for (const bad of [
      '', // nothing
      '0000', // a second item after the first
      '18', // argument cut short
      '1c', // reserved additional information (§3)
      '62c3', // text cut short
      '62c328', // invalid UTF-8 (§5.3.1)
      'a2616101616102', // duplicate key
      '9bffffffffffffffff', // an array longer than the datagram
      'ff', // break outside an indefinite item
    ])
      expect(() => decodeCbor(hex(bad))).toThrow(CborError);
    let deep = '';
    for (let i = 0; i <= MAX_DEPTH; i++) deep += '81';
    expect(() => decodeCbor(hex(`${deep}00`))).toThrow('nested too deep');
    expect(decodeCbor(hex(`${deep.slice(2)}00`))).toBeDefined();
  });

  it('gives a key named __proto__ no special meaning', () => {
    const decoded = decodeCbor(hex('a169' + Buffer.from('__proto__').toString('hex') + 'a0')) as Record<
      string,
      unknown
    >;
    expect(Object.keys(decoded)).toEqual(['__proto__']);
    expect(Object.getPrototypeOf(decoded)).toBeNull();
  });
});

describe('report bodies under mutation', () => {
  const SEED = Number(process.env.DEVICE_WORD_FUZZ_SEED ?? 0x8949);
  const SCALE = Number(process.env.DEVICE_WORD_FUZZ_SCALE ?? 1);
  const rnd = prng(SEED);
  const int = (n: number): number => Math.floor(rnd() * n);
  const seeds: Buffer[] = [
    encode({ version: 1764358000123456, outcome: 'applied', settings: { reporting_interval_s: 240 } }),
    encode({ version: 17, outcome: 'rejected', reason: 'threshold_out_of_range' }),
    encode({
      version: 99,
      outcome: 'applied',
      settings: { thresholds: { supply_temp_c: { min: 12.5, max: 18 } }, telemetry_enabled: true },
    }),
  ];

  function mutate(d: Buffer): Buffer {
    const out = Buffer.from(d);
    switch (int(5)) {
      case 0:
        for (let i = 0, n = 1 + int(4); i < n && out.length; i++) out[int(out.length)]! ^= 1 << int(8);
        return out;
      case 1:
        if (out.length) out[int(out.length)] = int(256);
        return out;
      case 2:
        return out.subarray(0, int(out.length + 1));
      case 3:
        return Buffer.concat([out, Buffer.from(Array.from({ length: 1 + int(16) }, () => int(256)))]);
      default: {
        // splice a random initial byte with a large argument in
        const at = int(out.length + 1);
        const ib = Buffer.from(
          [int(256), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff].slice(0, 1 + int(9)),
        );
        return Buffer.concat([out.subarray(0, at), ib, out.subarray(at)]);
      }
    }
  }

  it('decodes or refuses every mutation with CborError, and parseReport never throws', () => {
    let decoded = 0;
    let refused = 0;
    let other = 0;
    for (let i = 0; i < 20_000 * SCALE; i++) {
      const body = mutate(seeds[int(seeds.length)]!);
      try {
        decodeCbor(body);
        decoded++;
      } catch (err) {
        if (err instanceof CborError) refused++;
        else other++;
      }
      const parsed = parseReport(body, 60);
      expect(typeof parsed === 'string' || typeof parsed.version === 'number').toBe(true);
    }
    expect(other).toBe(0);
    // Both sides were exercised: the mutations are not all fatal, nor all harmless.
    expect(decoded).toBeGreaterThan(100);
    expect(refused).toBeGreaterThan(1000);
  });

  it('reads the seeds as reports', () => {
    expect(parseReport(seeds[0]!, 60)).toEqual({
      version: 1764358000123456,
      outcome: 'applied',
      reason: null,
      settings: { reporting_interval_s: 240 },
    });
    expect(parseReport(seeds[1]!, 60)).toMatchObject({
      outcome: 'rejected',
      reason: 'threshold_out_of_range',
    });
  });
});

describe('mutated report datagrams against a live CoAP server (real UDP)', () => {
  // Whole datagrams, CoAP header and options included, mutated as above and sent to the report resource: every
  // one is answered or dropped, nothing reaches the sink that parseReport would refuse, no handler throws, and
  // the server still answers a well-formed report afterwards.
  it('answers or drops each, and serves a well-formed report afterwards', async () => {
    const rnd = prng(Number(process.env.DEVICE_WORD_FUZZ_SEED ?? 0x7252));
    const int = (n: number): number => Math.floor(rnd() * n);
    const { server, port } = await startCoap([device('dev-a')]);
    const accepted: DeviceReport[] = [];
    server.reports = {
      sink: {
        report: (_deviceId, report) => {
          accepted.push(report);
          return Promise.resolve('recorded');
        },
      },
      trusts: () => true,
      known: (deviceId) => deviceId === 'dev-a',
    };
    const client = await RawCoapClient.connect(port);
    try {
      const base = (payload: Buffer, mid: number): Buffer =>
        generate({
          confirmable: true,
          code: 'POST',
          messageId: mid,
          token: Buffer.from([1, 2, 3]),
          options: [
            ...pathOptions('/devices/dev-a/reported'),
            { name: 'Content-Format', value: Buffer.from([60]) },
          ],
          payload,
        });
      const good = encode({ version: 7, outcome: 'applied', settings: { reporting_interval_s: 60 } });
      for (let i = 0; i < 3000 * Number(process.env.DEVICE_WORD_FUZZ_SCALE ?? 1); i++) {
        const d = Buffer.from(base(good, i & 0xffff));
        for (let k = 0, n = 1 + int(4); k < n; k++) d[int(d.length)] = int(256);
        client.sendRaw(int(4) === 0 ? d.subarray(0, int(d.length)) : d);
        if (i % 200 === 199) await sleep(5);
      }
      await sleep(300);
      expect(server.stats.internalErrors).toBe(0);
      for (const report of accepted) expect(report.version).toBeGreaterThan(0);
      const mark = client.inbox.length;
      client.sendRaw(base(encode({ version: 4242, outcome: 'applied' }), 4242));
      const reply = await client.waitFor((p) => p.messageId === 4242, 3000, mark);
      expect(reply.packet.code).toBe('2.04');
      expect(accepted.map((r) => r.version)).toContain(4242);
    } finally {
      await client.close();
      await server.close();
    }
  });
});
