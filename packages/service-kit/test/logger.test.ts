import { isSensitiveKey, redactString, redactUrl, redactValue } from '../src/index.js';
import { captureLogs } from './log-capture.js';

const JWT =
  'eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.eyJzdWIiOiJhbGljZSIsInJvbGUiOiJlbnRlcnByaXNlX3BvcnRhbF9yb2xlIn0.c2lnbmF0dXJl';

async function flush(): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve));
}

describe('createLogger', () => {
  it('writes JSON lines with timestamp, level, service, message and child metadata', async () => {
    const logs = captureLogs('gateway');
    logs.logger.child({ request_id: 'req-1' }).info('hello', { device_id: 'acme-hq-hvac-01' });
    await flush();
    const [entry] = logs.entries();
    expect(entry).toMatchObject({
      level: 'info',
      service: 'gateway',
      message: 'hello',
      request_id: 'req-1',
      device_id: 'acme-hq-hvac-01',
    });
    expect(new Date(String(entry?.timestamp)).getTime()).not.toBeNaN();
  });

  it('redacts secrets under sensitive keys at any depth and inside strings', async () => {
    const logs = captureLogs();
    logs.logger.info(`calling with Bearer ${JWT}`, {
      headers: { Authorization: 'Bearer abc.def', cookie: 'sid=s3cr3t-cookie', 'x-api-key': 'k-123456' },
      config: {
        DATABASE_URL: 'postgres://app:pg-pass-1@db:5432/platform',
        GATEWAY_API_KEYS: ['key-one-aaaa', 'key-two-bbbb'],
        S3_SECRET_ACCESS_KEY: 'aws-secret-zzz',
        nested: { deeper: { password: 'p4ssw0rd', access_token: 'tok-9', keys: ['kk-1'] } },
      },
      presigned: 'https://s3.local/b/o?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=deadbeef&X-Amz-Expires=900',
      note: `token in text: ${JWT} and api_key=plain-key-77`,
      object_key: 'media/2025/abc.jpg',
      request_id: 'req-keep',
    });
    await flush();
    const text = logs.text();
    for (const secret of [
      'abc.def',
      's3cr3t-cookie',
      'k-123456',
      'pg-pass-1',
      'key-one-aaaa',
      'key-two-bbbb',
      'aws-secret-zzz',
      'p4ssw0rd',
      'tok-9',
      'kk-1',
      'deadbeef',
      'AKIA',
      'plain-key-77',
      JWT.slice(0, 40),
    ]) {
      expect(text).not.toContain(secret);
    }
    const [entry] = logs.entries();
    expect(entry?.message).toBe('calling with Bearer ***');
    const config = entry?.config as Record<string, unknown>;
    expect(config.DATABASE_URL).toBe('postgres://app:***@db:5432/platform');
    expect(entry?.presigned).toBe(
      'https://s3.local/b/o?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Expires=900',
    );
    // Ordinary fields stay readable.
    expect(entry?.object_key).toBe('media/2025/abc.jpg');
    expect(entry?.request_id).toBe('req-keep');
  });

  it('never throws on circular objects and keeps Error details', async () => {
    const logs = captureLogs();
    const loop: Record<string, unknown> = { name: 'loop' };
    loop.self = loop;
    const err = new Error('failed for postgres://u:pw-x@h/db');
    expect(() => logs.logger.error('circular', { loop, err })).not.toThrow();
    await flush();
    const [entry] = logs.entries();
    expect(entry?.loop).toEqual({ name: 'loop', self: '[Circular]' });
    const logged = entry?.err as Record<string, string>;
    expect(logged.message).toBe('failed for postgres://u:***@h/db');
    expect(logged.stack).toContain('logger.test.ts');
    expect(logs.text()).not.toContain('pw-x');
  });

  it('honours the level', async () => {
    const logs = captureLogs();
    logs.logger.level = 'warn';
    logs.logger.info('quiet');
    logs.logger.warn('loud');
    await flush();
    expect(logs.entries().map((e) => e.message)).toEqual(['loud']);
  });
});

describe('redaction helpers', () => {
  it.each([
    ['authorization', true],
    ['Authorization', true],
    ['set-cookie', true],
    ['access_token', true],
    ['apiKey', true],
    ['GATEWAY_API_KEYS', true],
    ['WEBHOOK_TOKENS', true],
    ['client_secret', true],
    ['password', true],
    ['key', true],
    ['keys', true],
    ['request_id', false],
    ['object_key', false],
    ['device_id', false],
    ['message', false],
  ])('isSensitiveKey(%s) = %s', (key, expected) => {
    expect(isSensitiveKey(key)).toBe(expected);
  });

  it('redactUrl masks only the password', () => {
    expect(redactUrl('postgres://enterprise_api_login:s3cret@db:5432/platform?sslmode=require')).toBe(
      'postgres://enterprise_api_login:***@db:5432/platform?sslmode=require',
    );
    expect(redactUrl('http://localhost:8180/realms/platform')).toBe('http://localhost:8180/realms/platform');
    expect(redactUrl('postgres://user@host/db')).toBe('postgres://user@host/db');
  });

  it('redactString masks Basic and Bearer credentials', () => {
    expect(redactString('Authorization: Basic dXNlcjpwYXNz')).toBe('Authorization: Basic ***');
    expect(redactString('bearer abc123')).toBe('bearer ***');
  });

  it('redactValue copies, leaving the input untouched', () => {
    const input = { password: 'x', list: [{ token: 'y' }] };
    expect(redactValue(input)).toEqual({ password: '***', list: [{ token: '***' }] });
    expect(input.password).toBe('x');
  });
});
