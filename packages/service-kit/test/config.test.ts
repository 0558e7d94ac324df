import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, loadConfig } from '../src/index.js';

const schema = {
  type: 'object',
  required: ['DATABASE_URL', 'GATEWAY_API_KEYS'],
  properties: {
    DATABASE_URL: { type: 'string', format: 'uri' },
    GATEWAY_HTTP_PORT: { type: 'integer', minimum: 1, maximum: 65535, default: 8080 },
    S3_FORCE_PATH_STYLE: { type: 'boolean', default: false },
    LOG_LEVEL: { enum: ['error', 'warn', 'info', 'debug'], default: 'info' },
    GATEWAY_API_KEYS: { type: 'array', items: { type: 'string', minLength: 16 }, minItems: 1 },
    SIGNING_PEPPER: { type: 'string', minLength: 8, writeOnly: true },
  },
} as const;

describe('loadConfig', () => {
  it('coerces strings, fills defaults, splits lists and types the result', () => {
    const config = loadConfig(schema, {
      DATABASE_URL: 'postgres://u:p@localhost:5433/platform',
      GATEWAY_HTTP_PORT: '9090',
      S3_FORCE_PATH_STYLE: 'true',
      GATEWAY_API_KEYS: 'aaaaaaaaaaaaaaaa, bbbbbbbbbbbbbbbb',
      UNRELATED: 'ignored',
    });
    expect(config).toEqual({
      DATABASE_URL: 'postgres://u:p@localhost:5433/platform',
      GATEWAY_HTTP_PORT: 9090,
      S3_FORCE_PATH_STYLE: true,
      LOG_LEVEL: 'info',
      GATEWAY_API_KEYS: ['aaaaaaaaaaaaaaaa', 'bbbbbbbbbbbbbbbb'],
    });
    // Compile-time: the port is a number, the level a union.
    const port: number = config.GATEWAY_HTTP_PORT;
    const level: 'error' | 'warn' | 'info' | 'debug' = config.LOG_LEVEL;
    expect([port, level]).toEqual([9090, 'info']);
  });

  it('treats empty values as unset', () => {
    const config = loadConfig(schema, {
      DATABASE_URL: 'postgres://localhost/db',
      GATEWAY_API_KEYS: 'cccccccccccccccc',
      GATEWAY_HTTP_PORT: '',
    });
    expect(config.GATEWAY_HTTP_PORT).toBe(8080);
  });

  it('returns a deep-frozen object', () => {
    const config = loadConfig(schema, {
      DATABASE_URL: 'postgres://h/d',
      GATEWAY_API_KEYS: 'dddddddddddddddd',
    });
    expect(Object.isFrozen(config)).toBe(true);
    expect(Object.isFrozen(config.GATEWAY_API_KEYS)).toBe(true);
    expect(() => {
      (config as { GATEWAY_HTTP_PORT: number }).GATEWAY_HTTP_PORT = 1;
    }).toThrow(TypeError);
    expect(() => (config.GATEWAY_API_KEYS as string[]).push('x')).toThrow(TypeError);
  });

  it('fails fast listing every bad variable, never echoing secret values', () => {
    let caught: unknown;
    try {
      loadConfig(schema, {
        DATABASE_URL: 'not a url',
        GATEWAY_HTTP_PORT: 'eighty',
        LOG_LEVEL: 'loud',
        GATEWAY_API_KEYS: 'short-key-1',
        SIGNING_PEPPER: 'tiny',
      });
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(ConfigError);
    const error = caught as ConfigError;
    expect(error.problems.map((p) => p.variable).sort()).toEqual([
      'DATABASE_URL',
      'GATEWAY_API_KEYS',
      'GATEWAY_HTTP_PORT',
      'LOG_LEVEL',
      'SIGNING_PEPPER',
    ]);
    expect(error.message).toContain('Invalid configuration (5 problems)');
    expect(error.message).toContain('GATEWAY_HTTP_PORT: must be integer (got "eighty")');
    expect(error.message).toContain(
      'LOG_LEVEL: must be equal to one of the allowed values: error, warn, info, debug',
    );
    expect(error.message).not.toContain('short-key-1');
    expect(error.message).not.toContain('tiny');
  });

  it('reports missing required variables by name', () => {
    // A block body: jest's matcher types would otherwise expand the inferred config type past tsc's limit.
    expect(() => {
      loadConfig(schema, {});
    }).toThrow(/DATABASE_URL: is required but not set[\s\S]*GATEWAY_API_KEYS: is required but not set/);
  });

  it('masks URL passwords when echoing a bad value', () => {
    const strict = {
      type: 'object',
      properties: { UPSTREAM_URL: { type: 'string', pattern: '^https://' } },
    } as const;
    expect(() => {
      loadConfig(strict, { UPSTREAM_URL: 'http://user:pw-secret@host' });
    }).toThrow(/UPSTREAM_URL: must match pattern .*\(got "http:\/\/user:\*\*\*@host"\)/);
  });

  it('reads process.env by default', () => {
    const dir = mkdtempSync(join(tmpdir(), 'cfg-'));
    writeFileSync(join(dir, 'marker'), 'x');
    process.env.SERVICE_KIT_TEST_DIR = dir;
    try {
      const config = loadConfig({
        type: 'object',
        properties: { SERVICE_KIT_TEST_DIR: { type: 'string' } },
      } as const);
      expect(config.SERVICE_KIT_TEST_DIR).toBe(dir);
    } finally {
      delete process.env.SERVICE_KIT_TEST_DIR;
    }
  });
});
