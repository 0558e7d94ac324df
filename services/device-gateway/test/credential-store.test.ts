import { inspect } from 'node:util';
import { Writable } from 'node:stream';
import { createLogger } from '@platform/service-kit';
import {
  CredentialSnapshot,
  CredentialStore,
  DuplicateIdentityError,
  type CredentialRecord,
} from '../src/domain/credentials.js';

const T0 = Date.parse('2026-01-01T00:00:00Z');
const DAY_MS = 86_400_000;
const KEY_TEXT = 'Zm9vYmFyLWJhei1xdXV4LWtleS10ZXh0';

function record(id: string, extra: Partial<CredentialRecord> = {}): CredentialRecord {
  return {
    credentialId: id,
    identity: `psk-${id}`,
    key: Buffer.from(`${KEY_TEXT}${id}`, 'utf8'),
    deviceId: `device-${id}`,
    notBeforeMs: T0,
    notAfterMs: T0 + 10 * DAY_MS,
    ...extra,
  };
}

function storeWith(records: CredentialRecord[], nowMs = T0): CredentialStore {
  const store = new CredentialStore();
  store.replace(CredentialSnapshot.from(records), nowMs);
  return store;
}

describe('CredentialStore lookup', () => {
  it('finds a credential by identity only inside not_before <= now < not_after', () => {
    const store = storeWith([record('1')]);
    expect(store.lookup('psk-1', T0 - 1)).toBeUndefined();
    const found = store.lookup('psk-1', T0);
    expect(found?.credentialId).toBe('1');
    expect(found?.deviceId).toBe('device-1');
    expect(found?.key.toString('utf8')).toBe(`${KEY_TEXT}1`);
    expect(store.lookup('psk-1', T0 + 10 * DAY_MS - 1)?.credentialId).toBe('1');
    // Expired at the handshake, with no reload in between (californium#1071).
    expect(store.lookup('psk-1', T0 + 10 * DAY_MS)).toBeUndefined();
  });

  it('a credential without not_after never expires; unknown identities are undefined', () => {
    const store = storeWith([record('1', { notAfterMs: undefined })]);
    expect(store.lookup('psk-1', T0 + 100_000 * DAY_MS)?.credentialId).toBe('1');
    expect(store.lookup('psk-2', T0)).toBeUndefined();
    expect(store.lookup('', T0)).toBeUndefined();
    // Identities compare exactly (the handshake sends bytes): no case folding, no trimming.
    expect(store.lookup('PSK-1', T0)).toBeUndefined();
    expect(store.lookup('psk-1 ', T0)).toBeUndefined();
  });

  it('several credentials of one device are valid at once (rotation with overlap)', () => {
    const store = storeWith([
      record('1', { deviceId: 'dev' }),
      record('2', { deviceId: 'dev', notBeforeMs: T0 + DAY_MS }),
    ]);
    expect(store.lookup('psk-1', T0 + 2 * DAY_MS)?.deviceId).toBe('dev');
    expect(store.lookup('psk-2', T0 + 2 * DAY_MS)?.deviceId).toBe('dev');
  });

  it('lookupPsk uses the current time', () => {
    const now = Date.now();
    const store = storeWith(
      [
        record('1', { notBeforeMs: now - DAY_MS, notAfterMs: now + DAY_MS }),
        record('2', { notBeforeMs: now - 2 * DAY_MS, notAfterMs: now - DAY_MS }),
      ],
      now,
    );
    expect(store.lookupPsk('psk-1')?.credentialId).toBe('1');
    expect(store.lookupPsk('psk-2')).toBeUndefined();
  });

  it('a snapshot with a duplicate identity is refused whole', () => {
    expect(() => CredentialSnapshot.from([record('1'), record('2', { identity: 'psk-1' })])).toThrow(
      DuplicateIdentityError,
    );
  });

  it('keeps its own copy of the key bytes', () => {
    const rec = record('1');
    const store = storeWith([rec]);
    rec.key.fill(0);
    expect(store.lookup('psk-1', T0)?.key.toString('utf8')).toBe(`${KEY_TEXT}1`);
  });
});

describe('CredentialStore invalidation', () => {
  it('replace reports removed and changed credentials, not unchanged or newly added ones', () => {
    const store = storeWith([record('1'), record('2'), record('3'), record('4'), record('5')]);
    const next = CredentialSnapshot.from([
      record('1'), // unchanged
      // 2: gone (revoked, deleted or device disabled)
      record('3', { key: Buffer.from('another-key-text-of-32-chars-xyz') }),
      record('4', { deviceId: 'someone-else' }),
      record('5', { notAfterMs: T0 + DAY_MS }), // window changed
      record('6'), // new
    ]);
    expect(store.replace(next, T0 + 1).sort()).toEqual(['2', '3', '4', '5']);
    expect(store.lookup('psk-2', T0 + 1)).toBeUndefined();
    expect(store.lookup('psk-6', T0 + 1)?.credentialId).toBe('6');
  });

  it('replace reports a credential that expired before the reload, unless expiredSince did', () => {
    const store = storeWith([record('1', { notAfterMs: T0 + 5 }), record('2', { notAfterMs: T0 + 5 })]);
    expect(store.expiredSince(T0 + 4)).toEqual([]);
    expect(store.expiredSince(T0 + 5)).toEqual(['1', '2']);
    // Each once.
    expect(store.expiredSince(T0 + 6)).toEqual([]);
    const store2 = storeWith([record('1', { notAfterMs: T0 + 5 })]);
    // The reload still carries the row (the database's clock lags ours): it is reported once, here.
    expect(store2.replace(CredentialSnapshot.from([record('1', { notAfterMs: T0 + 5 })]), T0 + 6)).toEqual([
      '1',
    ]);
    expect(store2.expiredSince(T0 + 7)).toEqual([]);
    expect(store2.replace(CredentialSnapshot.from([]), T0 + 8)).toEqual([]);
  });

  it('a credential issued for later is not reported while it waits', () => {
    const later = record('1', { notBeforeMs: T0 + DAY_MS });
    const store = storeWith([later]);
    expect(store.replace(CredentialSnapshot.from([later]), T0 + 1)).toEqual([]);
    expect(store.lookup('psk-1', T0 + 1)).toBeUndefined();
    expect(store.lookup('psk-1', T0 + DAY_MS)?.credentialId).toBe('1');
  });

  it('nextExpiryMs names the next not_after still ahead', () => {
    const store = storeWith([
      record('1', { notAfterMs: T0 + 30 }),
      record('2', { notAfterMs: T0 + 20 }),
      record('3', { notAfterMs: undefined }),
    ]);
    expect(store.nextExpiryMs(T0)).toBe(T0 + 20);
    expect(store.nextExpiryMs(T0 + 20)).toBe(T0 + 30);
    expect(store.nextExpiryMs(T0 + 30)).toBeUndefined();
    expect(store.isValid('1', T0 + 29)).toBe(true);
    expect(store.isValid('1', T0 + 30)).toBe(false);
    expect(store.isValid('9', T0)).toBe(false);
  });
});

describe('keys never leave in text', () => {
  const rec = record('1');
  const keyText = rec.key.toString('utf8');
  const forms = [keyText, rec.key.toString('hex'), rec.key.toString('base64')];

  function expectNoKey(text: string): void {
    for (const form of forms) expect(text).not.toContain(form);
    // A Buffer serialised by JSON.stringify: {"type":"Buffer","data":[…]}.
    expect(text).not.toContain('Buffer');
  }

  it('JSON.stringify, util.inspect and spread of a credential, a snapshot and a store', () => {
    const store = storeWith([rec]);
    const credential = store.lookup('psk-1', T0)!;
    expect(credential.key.toString('utf8')).toBe(keyText);
    const texts = [
      JSON.stringify(credential),
      JSON.stringify({ credential }),
      inspect(credential, { showHidden: true, depth: 10 }),
      inspect({ nested: [credential] }, { depth: 10 }),
      JSON.stringify({ ...credential }),
      inspect({ ...credential }, { showHidden: true }),
      JSON.stringify(Object.entries(credential)),
      JSON.stringify(store),
      inspect(store, { showHidden: true, depth: 10 }),
      JSON.stringify(CredentialSnapshot.from([rec])),
      inspect(CredentialSnapshot.from([rec]), { showHidden: true, depth: 10 }),
    ];
    for (const text of texts) expectNoKey(text);
    expect(JSON.stringify(credential)).toContain('psk-1');
    expect(Object.keys(credential)).not.toContain('key');
  });

  it('a structured log line with the credential carries the identity, not the key', () => {
    const chunks: string[] = [];
    const stream = new Writable({
      write(chunk: Buffer, _enc, done) {
        chunks.push(chunk.toString('utf8'));
        done();
      },
    });
    const logger = createLogger({ service: 'test', level: 'info', stream });
    const credential = storeWith([rec]).lookup('psk-1', T0)!;
    logger.info('handshake', { psk: credential, identity: credential.identity });
    expect(chunks.join('')).toContain('psk-1');
    expectNoKey(chunks.join(''));
  });
});
