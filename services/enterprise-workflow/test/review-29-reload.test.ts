// Review of issue 29 item 8: SIGHUP re-reads WEBHOOK_TOKENS_FILE (service-kit installSecretReload with the
// workflow's readWebhookTokens, as main.ts wires them). A bad file must not lock valid tokens out, and no
// secret may reach a log line. Each test asserts the secure behaviour; a failing test is a finding.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { createLogger, installSecretReload, SecretSet } from '@platform/service-kit';
import { readWebhookTokens } from '../src/config.js';

function wired(file: string, env?: string) {
  const lines: string[] = [];
  const stream = new PassThrough();
  stream.on('data', (c: Buffer) => lines.push(c.toString('utf8')));
  const logger = createLogger({ service: 'review', level: 'debug', stream });
  let tokens = new SecretSet(readWebhookTokens({ value: env, file }));
  const handle = installSecretReload({
    logger,
    what: 'webhook tokens',
    signal: 'SIGUSR2',
    read: () => new SecretSet(readWebhookTokens({ value: env, file })),
    apply: (t) => {
      tokens = t;
    },
  });
  return { lines, tokens: () => tokens, handle };
}

const GOOD = 'good-webhook-token-0123456789abcdef';

it('a file that is unusable in any of these ways keeps the previous token and logs no secret', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'r29-reload-'));
  const file = join(dir, 'tokens');
  writeFileSync(file, `${GOOD}\n`);
  const w = wired(file);
  const bad: Array<[string, () => void]> = [
    ['a token with a space', () => writeFileSync(file, `${GOOD}-new secret-with space\n`)],
    ['a NUL inside', () => writeFileSync(file, `${GOOD}-new\0x\n`)],
    ['non-ASCII', () => writeFileSync(file, `${GOOD}-néw\n`)],
    ['only comments', () => writeFileSync(file, '# nothing\n  # still nothing\n')],
    ['empty', () => writeFileSync(file, '')],
  ];
  const wrong: string[] = [];
  for (const [name, make] of bad) {
    make();
    const applied = w.handle.reload();
    if (applied) wrong.push(`${name}: applied`);
    if (!w.tokens().has(GOOD)) wrong.push(`${name}: the good token was dropped`);
  }
  await new Promise((r) => setTimeout(r, 20));
  const text = w.lines.join('');
  for (const secret of [GOOD, 'secret-with', 'néw'])
    if (text.includes(secret)) wrong.push(`a log line holds ${secret}`);
  w.handle.dispose();
  expect(wrong).toEqual([]);
});

it('a reload does not accept a token too short to be a secret (e.g. a truncated or placeholder file)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'r29-reload-'));
  const file = join(dir, 'tokens');
  writeFileSync(file, `${GOOD}\n`);
  const w = wired(file);
  writeFileSync(file, 'x\n');
  const applied = w.handle.reload();
  w.handle.dispose();
  expect({ applied, goodStillValid: w.tokens().has(GOOD), weakAccepted: w.tokens().has('x') }).toEqual({
    applied: false,
    goodStillValid: true,
    weakAccepted: false,
  });
});
