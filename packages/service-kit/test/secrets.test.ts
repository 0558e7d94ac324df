import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { inspect } from 'node:util';
import {
  bearerToken,
  countNonBearerSecrets,
  fingerprint,
  installSecretReload,
  NotARegularFileError,
  readSecretList,
  SecretSet,
} from '../src/index.js';
import { captureLogs } from './log-capture.js';

describe('readSecretList', () => {
  it('merges a comma list and a mounted file, dropping blanks, comments and duplicates', () => {
    const dir = mkdtempSync(join(tmpdir(), 'secrets-'));
    const file = join(dir, 'keys');
    writeFileSync(file, '# rotated 2025-01\nkey-from-file-1\r\n\n  key-from-file-2  \nkey-a\n');
    expect(readSecretList({ value: ' key-a, key-b ,,', file })).toEqual([
      'key-a',
      'key-b',
      'key-from-file-1',
      'key-from-file-2',
    ]);
  });

  it('returns an empty list when nothing is configured and throws on an unreadable file', () => {
    expect(readSecretList({})).toEqual([]);
    expect(() => readSecretList({ file: '/nonexistent/keys' })).toThrow(/ENOENT/);
  });
});

describe('readSecretList: only a regular file is read (issue 39 §4)', () => {
  const distIndex = fileURLToPath(new URL('../dist/index.js', import.meta.url));

  /**
   * readSecretList in a child process, so a read that blocks (what a FIFO did: the SIGHUP reload then hung the
   * whole process) fails this test after 5 s instead of hanging it: the error's name and message, or 'blocked'.
   */
  function readInChild(file: string): string {
    const script =
      `const { readSecretList } = await import(${JSON.stringify(distIndex)});` +
      `try { readSecretList({ file: ${JSON.stringify(file)} }); console.log('read'); }` +
      'catch (err) { console.log(`${err.name} ${err.code}: ${err.message}`); }';
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
      timeout: 5000,
      encoding: 'utf8',
    });
    return child.signal === null ? child.stdout.trim() : 'blocked';
  }

  it('refuses a FIFO, a directory and a character device without reading them, naming what they are', () => {
    const dir = mkdtempSync(join(tmpdir(), 'secrets-fifo-'));
    const fifo = join(dir, 'keys');
    execFileSync('mkfifo', [fifo]);
    expect(readInChild(fifo)).toBe(`NotARegularFileError ENOTREGULAR: ${fifo} is a FIFO, not a regular file`);
    expect(readInChild(dir)).toBe(
      `NotARegularFileError ENOTREGULAR: ${dir} is a directory, not a regular file`,
    );
    expect(readInChild('/dev/zero')).toBe(
      'NotARegularFileError ENOTREGULAR: /dev/zero is a character device, not a regular file',
    );
    expect(() => readSecretList({ file: dir })).toThrow(NotARegularFileError);
  });

  it('still reads a regular file through a symbolic link, as a mounted Kubernetes Secret is', () => {
    const dir = mkdtempSync(join(tmpdir(), 'secrets-link-'));
    writeFileSync(join(dir, 'data'), 'linked-key-0123456789\n');
    symlinkSync(join(dir, 'data'), join(dir, 'keys'));
    expect(readSecretList({ file: join(dir, 'keys') })).toEqual(['linked-key-0123456789']);
  });
});

describe('SecretSet', () => {
  const set = new SecretSet(['current-key-0123456789', 'previous-key-abcdef', '']);

  it('accepts every configured secret and nothing else', () => {
    expect(set.size).toBe(2);
    expect(set.has('current-key-0123456789')).toBe(true);
    expect(set.has('previous-key-abcdef')).toBe(true);
    expect(set.has('current-key-012345678')).toBe(false);
    expect(set.has('current-key-0123456789 ')).toBe(false);
    expect(set.has('x'.repeat(10_000))).toBe(false);
    expect(set.has('')).toBe(false);
    expect(set.has(undefined)).toBe(false);
  });

  it('an empty set accepts nothing', () => {
    expect(new SecretSet([]).has('anything')).toBe(false);
  });

  it('never shows the secrets in JSON or inspect output', () => {
    expect(JSON.stringify(set)).not.toContain('current-key');
    expect(inspect(set, { depth: 5, showHidden: true })).not.toContain('current-key');
    expect(set.fingerprints()).toEqual([
      fingerprint('current-key-0123456789'),
      fingerprint('previous-key-abcdef'),
    ]);
  });
});

describe('fingerprint', () => {
  it('is a short, stable sha256 prefix', () => {
    // sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
    expect(fingerprint('abc')).toBe('sha256:ba7816bf8f01');
    expect(fingerprint('abd')).not.toBe(fingerprint('abc'));
  });
});

describe('bearerToken', () => {
  it.each([
    ['Bearer abc.DEF-123_~+/==', 'abc.DEF-123_~+/=='],
    ['bearer  lower-case-scheme', 'lower-case-scheme'],
    ['Basic dXNlcjpwYXNz', undefined],
    ['Bearer', undefined],
    ['Bearer two tokens', undefined],
    ['Bearer tok\u00e9n', undefined],
  ])('%j → %j', (header, expected) => {
    expect(bearerToken({ headers: { authorization: header } })).toBe(expected);
  });

  it('is undefined without an Authorization header', () => {
    expect(bearerToken({ headers: {} })).toBeUndefined();
  });

  it("is '' (no credential can match it) when the header is repeated, whatever the copies say", () => {
    for (const copies of [
      ['Bearer good', 'Bearer junk'],
      ['Bearer good', 'Bearer good'],
      ['Bearer good', ''],
    ]) {
      // node:http keeps only the first copy in `headers` (it drops repeated Authorization headers);
      // headersDistinct keeps each.
      const req = {
        headers: { authorization: copies[0] },
        headersDistinct: { authorization: copies },
      };
      expect(bearerToken(req)).toBe('');
    }
    expect(
      bearerToken({
        headers: { authorization: 'Bearer good' },
        headersDistinct: { authorization: ['Bearer good'] },
      }),
    ).toBe('good');
  });
});

describe('countNonBearerSecrets', () => {
  it('counts the secrets no Authorization: Bearer header can carry', () => {
    expect(countNonBearerSecrets(['dev-key_0.1~a+b/c==', 'AbC123'])).toBe(0);
    expect(countNonBearerSecrets(['has space', 'k!y', 'pct%41', 'ümlaut', 'a=b', 'ok'])).toBe(5);
    for (const secret of ['has space', 'k!y', 'a=b']) {
      expect(bearerToken({ headers: { authorization: `Bearer ${secret}` } })).not.toBe(secret);
    }
  });
});

describe('installSecretReload', () => {
  it('re-reads on SIGHUP and applies the new set; a failing read keeps the current one; no secret is logged', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'reload-'));
    const file = join(dir, 'keys');
    writeFileSync(file, 'first-secret-000000\n');
    const logs = captureLogs();
    let current = new SecretSet(readSecretList({ file }));
    const handle = installSecretReload({
      logger: logs.logger,
      what: 'test keys',
      read: () => {
        const secrets = readSecretList({ file });
        if (secrets.length === 0) throw new Error('the file holds no key');
        return new SecretSet(secrets);
      },
      apply: (secrets) => {
        current = secrets;
      },
    });
    try {
      writeFileSync(file, 'second-secret-11111\n');
      process.emit('SIGHUP', 'SIGHUP');
      expect(current.has('second-secret-11111')).toBe(true);
      expect(current.has('first-secret-000000')).toBe(false);
      writeFileSync(file, '# empty\n');
      process.emit('SIGHUP', 'SIGHUP');
      expect(handle.reload()).toBe(false);
      expect(current.has('second-secret-11111')).toBe(true);
      await new Promise((resolve) => setImmediate(resolve));
      expect(logs.entries().map((e) => [e.level, e.message])).toEqual([
        ['info', 'test keys reloaded'],
        ['error', 'test keys reload failed; the previous test keys stay valid'],
        ['error', 'test keys reload failed; the previous test keys stay valid'],
      ]);
      expect(logs.entries()[0]).toMatchObject({
        count: 1,
        fingerprints: [fingerprint('second-secret-11111')],
      });
      expect(logs.text()).not.toMatch(/first-secret|second-secret/);
    } finally {
      handle.dispose();
    }
    expect(process.listenerCount('SIGHUP')).toBe(0);
  });
});
