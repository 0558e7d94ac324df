// `npm run bench:keys`: CPU per call of the keyed primitives on the request path, in one process, no I/O.
// - a part URL (storage.presignPart with static credentials and a custom endpoint: @smithy/signature-v4's
//   SignatureV4.presign, its signing key cached and used as a KeyObject);
// - a PUT URL (storage.presignUpload, same storage and signer);
// - the webhook token / API key check: bearerToken + SecretSet.has (SHA-256 + timingSafeEqual, no key);
// - node:crypto alone: createHmac with a Buffer key, a string key and a KeyObject (on Node 24 a Buffer key
//   makes createHmac/createCipheriv try isKeyObject()/isCryptoKey() first, each a throwing native call).
// Each figure is the median of --rounds rounds of --iterations calls, after a warm-up round.
import { createHmac, createSecretKey, randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { bearerToken, SecretSet } from '@platform/service-kit';
import { createS3Storage } from '@platform/enterprise-workflow';

const { values: args } = parseArgs({
  options: {
    iterations: { type: 'string', default: '20000' },
    rounds: { type: 'string', default: '7' },
  },
});
const ITERATIONS = Number(args.iterations);
const ROUNDS = Number(args.rounds);

async function measure(name: string, call: () => unknown): Promise<void> {
  const round = async (): Promise<number> => {
    const start = process.hrtime.bigint();
    for (let i = 0; i < ITERATIONS; i++) {
      const result = call();
      if (result instanceof Promise) await result;
    }
    return Number(process.hrtime.bigint() - start) / 1000 / ITERATIONS;
  };
  await round();
  const samples: number[] = [];
  for (let r = 0; r < ROUNDS; r++) samples.push(await round());
  samples.sort((a, b) => a - b);
  const median = samples[Math.floor(samples.length / 2)]!;
  const spread = `${samples[0]!.toFixed(2)}–${samples[samples.length - 1]!.toFixed(2)}`;
  process.stdout.write(`${name.padEnd(52)} ${median.toFixed(2).padStart(7)} µs  (rounds ${spread})\n`);
}

const storage = createS3Storage({
  endpoint: 'http://127.0.0.1:9000',
  publicEndpoint: undefined,
  region: 'eu-west-1',
  bucket: 'media',
  accessKeyId: 'AKIAIOSFODNN7EXAMPLE',
  secretAccessKey: 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY',
  forcePathStyle: true,
});
const now = new Date();
const checksum = 'n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=';
let partNumber = 0;

// Two keys, as during a rotation; the presented one matches the second.
const secrets = new SecretSet([
  'current-key-0123456789abcdef0123456789',
  'previous-key-abcdef0123456789abcdef',
]);
const good = { headers: { authorization: 'Bearer previous-key-abcdef0123456789abcdef' } };
const bad = { headers: { authorization: 'Bearer not-a-configured-key-0123456789abcd' } };

const keyBytes = randomBytes(32);
const keyObject = createSecretKey(keyBytes);
const keyString = keyBytes.toString('base64');
const stringToSign = `AWS4-HMAC-SHA256\n20261122T100000Z\n20261122/eu-west-1/s3/aws4_request\n${'ab'.repeat(32)}`;

process.stdout.write(`node ${process.version}, ${ITERATIONS} calls a round, median of ${ROUNDS} rounds\n`);
await measure('part URL, SignatureV4.presign (presignPart)', () =>
  storage.presignPart({
    key: 'sites/s1/media/0193e7c2-5f0b-7000-8000-000000000001.png',
    uploadId: 'VXBsb2FkIElE+/=',
    partNumber: (partNumber++ % 10000) + 1,
    sizeBytes: 16 * 1024 * 1024,
    checksumSha256: checksum,
    expiresInS: 900,
    now,
  }),
);
await measure('PUT URL, SignatureV4.presign (presignUpload)', () =>
  storage.presignUpload({
    key: 'sites/s1/media/0193e7c2-5f0b-7000-8000-000000000001.png',
    contentType: 'image/png',
    sizeBytes: 42,
    checksumSha256: checksum,
    expiresInS: 900,
    now,
  }),
);
await measure('key check, match (bearerToken + SecretSet.has)', () => secrets.has(bearerToken(good)));
await measure('key check, no match (bearerToken + SecretSet.has)', () => secrets.has(bearerToken(bad)));
await measure('createHmac sha256, Buffer key', () =>
  createHmac('sha256', keyBytes).update(stringToSign).digest(),
);
await measure('createHmac sha256, string key', () =>
  createHmac('sha256', keyString).update(stringToSign).digest(),
);
await measure('createHmac sha256, KeyObject', () =>
  createHmac('sha256', keyObject).update(stringToSign).digest(),
);
storage.destroy();
