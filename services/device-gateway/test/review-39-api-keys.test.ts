// Issue 39 §2 (fourth item): /api/config showed each API key as the first 48 bits of its unsalted SHA-256, so a
// holder of one key (who may read /api/config) could test guesses at another key offline. The fingerprints are
// now keyed with a secret the process draws at start: they cannot be computed outside it.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import request from 'supertest';
import { ApiKeys, apiKeyFingerprint } from '../src/config.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';

let gw: GatewayFixture;

beforeAll(async () => {
  gw = await startGateway();
});

afterAll(async () => {
  await gw.close();
});

/** What anyone can compute from a key alone: its digest (sha256 and md5, full and cut to 12 hex digits). */
function unkeyedDigests(key: string): string[] {
  return ['sha256', 'sha1', 'md5'].flatMap((algorithm) => {
    const hex = createHash(algorithm).update(key).digest('hex');
    return [hex, hex.slice(0, 12)];
  });
}

describe('issue 39: API key fingerprints are keyed', () => {
  it('/api/config shows no digest a guess could be checked against', async () => {
    const res = await request(gw.app.http).get('/api/config').set('Authorization', `Bearer ${API_KEYS[0]}`);
    expect(res.status).toBe(200);
    const shown = res.body.api_keys.fingerprints as string[];
    expect(shown).toHaveLength(API_KEYS.length);
    for (const f of shown) expect(f).toMatch(/^hmac-sha256:[0-9a-f]{12}$/);
    const text = JSON.stringify(res.body);
    // Before: sha256:<the first 12 hex digits of each key's SHA-256>.
    for (const key of API_KEYS) for (const digest of unkeyedDigests(key)) expect(text).not.toContain(digest);
  });

  it('names a key within the process: the same key, the same fingerprint; another key, another', () => {
    const a = new ApiKeys(['key-one-0123456789', 'key-two-0123456789']);
    const b = new ApiKeys(['key-two-0123456789']);
    expect(b.fingerprints()[0]).toBe(a.fingerprints()[1]);
    expect(a.fingerprints()[0]).not.toBe(a.fingerprints()[1]);
    // Its JSON form (what a log line of the set shows) carries the keyed ones too.
    expect(JSON.stringify(a)).toBe(JSON.stringify({ size: 2, fingerprints: a.fingerprints() }));
    expect(apiKeyFingerprint('key-one-0123456789')).toBe(a.fingerprints()[0]);
  });

  it('another process gives the same key another fingerprint (its key is drawn at start)', () => {
    const config = fileURLToPath(new URL('../dist/config.js', import.meta.url));
    const script = `const { apiKeyFingerprint } = await import(${JSON.stringify(config)}); process.stdout.write(apiKeyFingerprint('key-one-0123456789'));`;
    const run = (): string =>
      execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' });
    const first = run();
    const second = run();
    expect(first).toMatch(/^hmac-sha256:[0-9a-f]{12}$/);
    expect(second).not.toBe(first);
    expect(apiKeyFingerprint('key-one-0123456789')).not.toBe(first);
  });
});
