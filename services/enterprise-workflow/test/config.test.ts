// Configuration: defaults, coercion, fail-fast messages that never echo secrets.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError } from '@platform/service-kit';
import { loadWorkflowConfig } from '../src/config.js';

const minimal = {
  DATABASE_URL: 'postgres://enterprise_api_login:secret-pw@db:5432/platform',
  OIDC_ISSUER_URL: 'https://id.example.com/realms/platform',
  S3_BUCKET: 'media',
  WEBHOOK_TOKENS: 'tok-a-0123456789abcdef, tok-b-0123456789abcdef',
};

describe('loadWorkflowConfig', () => {
  it('applies the documented defaults', () => {
    const config = loadWorkflowConfig(minimal);
    expect(config.http).toEqual({ port: 3800, host: '0.0.0.0', trustProxy: 1 });
    expect(config.oidc).toMatchObject({
      clientId: 'platform-enterprise-web',
      requiredRole: 'enterprise_portal_role',
      clockToleranceS: 30,
      jwksCooldownMs: 30000,
    });
    expect(config.media).toEqual({
      maxImageBytes: 25 * 1024 * 1024,
      maxVideoBytes: 2 * 1024 * 1024 * 1024,
      uploadUrlTtlS: 900,
      downloadUrlTtlS: 300,
    });
    expect(config.s3).toMatchObject({
      region: 'us-east-1',
      bucket: 'media',
      forcePathStyle: false,
      endpoint: undefined,
    });
    expect(config.webhookTokens).toEqual(['tok-a-0123456789abcdef', 'tok-b-0123456789abcdef']);
    expect(Object.isFrozen(config.media)).toBe(true);
  });

  it('coerces values and reads tokens from a file as well', () => {
    const dir = mkdtempSync(join(tmpdir(), 'wf-config-'));
    const file = join(dir, 'tokens');
    writeFileSync(file, '# rotated 2026-11\ntok-file-0123456789abcdef\n');
    const config = loadWorkflowConfig({
      ...minimal,
      PORT: '4000',
      S3_FORCE_PATH_STYLE: 'true',
      MEDIA_MAX_IMAGE_BYTES: '1048576',
      WEBHOOK_TOKENS_FILE: file,
    });
    expect(config.http.port).toBe(4000);
    expect(config.s3.forcePathStyle).toBe(true);
    expect(config.media.maxImageBytes).toBe(1048576);
    expect(config.webhookTokens).toEqual([
      'tok-a-0123456789abcdef',
      'tok-b-0123456789abcdef',
      'tok-file-0123456789abcdef',
    ]);
  });

  it('refuses to start without webhook tokens, issuer or database, naming every problem', () => {
    const { WEBHOOK_TOKENS: _t, ...noTokens } = minimal;
    expect(() => loadWorkflowConfig(noTokens)).toThrow(/WEBHOOK_TOKENS/);
    let error: unknown;
    try {
      loadWorkflowConfig({ PORT: 'eighty', S3_SECRET_ACCESS_KEY: 'very-secret-key' });
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const message = (error as Error).message;
    for (const name of ['DATABASE_URL', 'OIDC_ISSUER_URL', 'S3_BUCKET', 'PORT'])
      expect(message).toContain(name);
    expect(message).not.toContain('very-secret-key');
  });

  it('refuses a webhook token too short to be a secret (a placeholder, a truncated file), without echoing it', () => {
    let error: unknown;
    try {
      loadWorkflowConfig({ ...minimal, WEBHOOK_TOKENS: 'tok-a-0123456789abcdef, x' });
    } catch (err) {
      error = err;
    }
    expect((error as Error).message).toMatch(/WEBHOOK_TOKENS: 1 token\(s\) are shorter than 16 characters/);
  });

  it('refuses a webhook token no Authorization header can carry, without echoing it', () => {
    let error: unknown;
    try {
      loadWorkflowConfig({ ...minimal, WEBHOOK_TOKENS: 'tok-a-0123456789abcdef, token with spaces' });
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as Error).message).toMatch(/WEBHOOK_TOKENS: 1 token\(s\) are not RFC 6750 token68/);
    expect((error as Error).message).not.toContain('token with spaces');
  });

  it('refuses a media limit above the 5 GiB that one CopyObject can secure', () => {
    const fiveGiB = 5 * 1024 * 1024 * 1024;
    expect(
      loadWorkflowConfig({ ...minimal, MEDIA_MAX_VIDEO_BYTES: String(fiveGiB) }).media.maxVideoBytes,
    ).toBe(fiveGiB);
    expect(() => loadWorkflowConfig({ ...minimal, MEDIA_MAX_VIDEO_BYTES: String(fiveGiB + 1) })).toThrow(
      /MEDIA_MAX_VIDEO_BYTES/,
    );
  });

  it('requires S3 credentials in pairs and a readable token file', () => {
    expect(() => loadWorkflowConfig({ ...minimal, S3_ACCESS_KEY_ID: 'a' })).toThrow(/S3_SECRET_ACCESS_KEY/);
    expect(() => loadWorkflowConfig({ ...minimal, WEBHOOK_TOKENS_FILE: '/nonexistent/tokens' })).toThrow(
      /WEBHOOK_TOKENS_FILE/,
    );
  });
});
