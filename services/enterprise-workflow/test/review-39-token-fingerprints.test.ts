// Issue 39 (the gateway's fourth item, applied to the workflow): the webhook tokens' fingerprints, which the
// SIGHUP reload logs, were the first 48 bits of each token's unsalted SHA-256 (service-kit's `fingerprint`), so
// whoever reads the logs could test guesses at a token offline. They are now keyed with a secret the process
// draws at start, as the gateway's API keys are (4d0defb): they cannot be computed outside the process.
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { fingerprint } from '@platform/service-kit';
import { WebhookTokens, webhookTokenFingerprint } from '../src/config.js';

const TOKENS = ['webhook-token-one-0123456789', 'webhook-token-two-0123456789'];

/** What anyone can compute from a token alone: its digests (full and cut to 12 hex digits). */
function unkeyedDigests(token: string): string[] {
  return ['sha256', 'sha1', 'md5'].flatMap((algorithm) => {
    const hex = createHash(algorithm).update(token).digest('hex');
    return [hex, hex.slice(0, 12)];
  });
}

describe('issue 39: webhook token fingerprints are keyed', () => {
  it('shows no digest a guess could be checked against, in the fingerprints or the JSON form', () => {
    const tokens = new WebhookTokens(TOKENS);
    const shown = tokens.fingerprints();
    expect(shown).toHaveLength(TOKENS.length);
    for (const f of shown) expect(f).toMatch(/^hmac-sha256:[0-9a-f]{12}$/);
    // Before: sha256:<the first 12 hex digits of each token's SHA-256>, service-kit's unkeyed fingerprint.
    expect(shown).not.toEqual(TOKENS.map(fingerprint));
    const text = JSON.stringify(tokens);
    expect(text).toBe(JSON.stringify({ size: 2, fingerprints: shown }));
    for (const token of TOKENS) {
      expect(text).not.toContain(token);
      for (const digest of unkeyedDigests(token)) expect(text).not.toContain(digest);
    }
  });

  it('names a token within the process: the same token, the same fingerprint; another token, another', () => {
    const a = new WebhookTokens(TOKENS);
    const b = new WebhookTokens([TOKENS[1]!]);
    expect(b.fingerprints()[0]).toBe(a.fingerprints()[1]);
    expect(a.fingerprints()[0]).not.toBe(a.fingerprints()[1]);
    expect(webhookTokenFingerprint(TOKENS[0]!)).toBe(a.fingerprints()[0]);
    // Still a set of accepted tokens, checked as before.
    expect(a.has(TOKENS[0])).toBe(true);
    expect(a.has('webhook-token-three-0123456789')).toBe(false);
  });

  it('another process gives the same token another fingerprint (its key is drawn at start)', () => {
    const config = fileURLToPath(new URL('../dist/config.js', import.meta.url));
    const script = `const { webhookTokenFingerprint } = await import(${JSON.stringify(config)}); process.stdout.write(webhookTokenFingerprint(${JSON.stringify(TOKENS[0])}));`;
    const run = (): string =>
      execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' });
    const first = run();
    const second = run();
    expect(first).toMatch(/^hmac-sha256:[0-9a-f]{12}$/);
    expect(second).not.toBe(first);
    expect(webhookTokenFingerprint(TOKENS[0]!)).not.toBe(first);
  });
});
