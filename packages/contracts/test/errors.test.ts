import {
  MAX_FIELD_ERRORS,
  compileValidator,
  errorCatalogue,
  errorCodes,
  isErrorCode,
  toFieldErrors,
  validateDeviceSettings,
  validateProblemDocument,
  type ErrorCode,
} from '@platform/contracts';
import { errorsOf, pathsOf } from './helpers.js';

describe('error catalogue', () => {
  // design §2: the statuses every service answers with.
  it.each([
    ['invalid_json', 400],
    ['invalid_body', 400],
    ['invalid_query', 400],
    ['settings_too_large', 400],
    ['unauthorized', 401],
    ['forbidden', 403],
    ['not_found', 404],
    ['unknown_device', 404],
    ['unknown_site', 404],
    ['method_not_allowed', 405],
    ['conflict', 409],
    ['concurrent_change', 409],
    ['idempotency_key_reused', 409],
    ['work_item_final', 409],
    ['media_pending', 409],
    ['upload_not_pending', 409],
    ['upload_expired', 409],
    ['upload_gone', 409],
    ['upload_assembled', 409],
    ['parts_mismatch', 409],
    ['malformed_request', 400],
    ['request_timeout', 408],
    ['payload_too_large', 413],
    ['headers_too_large', 431],
    ['unsupported_media_type', 415],
    ['internal_error', 500],
    ['backend_unavailable', 503],
    ['not_ready', 503],
  ] as const)('%s → %i', (code, status) => {
    expect(errorCatalogue[code].status).toBe(status);
  });

  it('has a title for every code and no entries beyond the code list', () => {
    expect(Object.keys(errorCatalogue).sort()).toEqual([...errorCodes].sort());
    for (const code of errorCodes) {
      expect(errorCatalogue[code].title.length).toBeGreaterThan(0);
      expect(errorCatalogue[code].status).toBeGreaterThanOrEqual(400);
      expect(errorCatalogue[code].status).toBeLessThan(600);
    }
  });

  it('recognises codes without inherited properties', () => {
    expect(isErrorCode('conflict')).toBe(true);
    expect(isErrorCode('toString')).toBe(false);
    expect(isErrorCode('Conflict')).toBe(false);
    expect(isErrorCode(409)).toBe(false);
  });
});

describe('problem document', () => {
  const problem = {
    type: 'https://platform.example/problems/invalid_body',
    title: 'Invalid request body',
    status: 400,
    detail: 'The request body does not match the schema.',
    code: 'invalid_body' satisfies ErrorCode,
    request_id: '3f2c1d8e-0b4a-4e6f-9a1b-2c3d4e5f6a7b',
    errors: [{ path: '/settings/timezone', message: 'must be an IANA time zone name' }],
  };

  it('accepts a full problem and one without errors', () => {
    expect(validateProblemDocument(problem).ok).toBe(true);
    const { errors: _errors, ...withoutErrors } = problem;
    expect(validateProblemDocument({ ...withoutErrors, type: 'about:blank' }).ok).toBe(true);
    expect(
      validateProblemDocument({ ...withoutErrors, errors: [{ path: '', message: 'must be object' }] }).ok,
    ).toBe(true);
  });

  it.each([
    [{ code: 'teapot' }, '/code'],
    [{ status: 200 }, '/status'],
    [{ status: '400' }, '/status'],
    [{ request_id: 'has space' }, '/request_id'],
    [{ request_id: '' }, '/request_id'],
    [{ errors: [{ path: 'settings.timezone', message: 'x' }] }, '/errors/0/path'],
    [{ errors: [{ path: '/a' }] }, '/errors/0/message'],
    [{ errors: [{ path: '/a', message: 'x', stack: 'Error: at ...' }] }, '/errors/0/stack'],
    [{ stack: 'Error: at ...' }, '/stack'],
  ])('rejects %j at %s', (change, path) => {
    expect(pathsOf(validateProblemDocument({ ...problem, ...change }))).toEqual([path]);
  });

  it('requires type, title, status, detail, code and request_id', () => {
    expect(pathsOf(validateProblemDocument({})).sort()).toEqual(
      ['/code', '/detail', '/request_id', '/status', '/title', '/type'].sort(),
    );
  });
});

describe('field errors', () => {
  it(`reports at most ${MAX_FIELD_ERRORS} errors for a hostile document`, () => {
    const hostile = Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`extra_${i}`, i]));
    const errors = errorsOf(validateDeviceSettings(hostile));
    expect(errors).toHaveLength(MAX_FIELD_ERRORS);
    expect(errors[0]).toEqual({ path: '/extra_0', message: 'is not an allowed property' });
  });

  it('maps an empty or missing ajv error list to no field errors', () => {
    expect(toFieldErrors(null)).toEqual([]);
    expect(toFieldErrors([])).toEqual([]);
  });

  it('compiles service-local schemas with the same formats and error paths', () => {
    const validate = compileValidator<{ site_id: string; at: string }>({
      $id: 'https://platform.example/schemas/test-local.json',
      type: 'object',
      additionalProperties: false,
      required: ['at'],
      properties: {
        at: { type: 'string', format: 'date-time' },
        zone: { type: 'string', format: 'iana-time-zone' },
      },
    });
    expect(validate({ at: '2025-01-01T00:00:00Z', zone: 'Europe/Kiev' }).ok).toBe(true);
    expect(pathsOf(validate({ at: 'soon', zone: 'Mars/Phobos', x: 1 }))).toEqual(['/x', '/at', '/zone']);
  });

  it('reuses the compiled validator when a schema id is compiled again', () => {
    const schema = { $id: 'https://platform.example/schemas/test-twice.json', type: 'integer' } as const;
    const first = compileValidator<number>(schema);
    const second = compileValidator<number>(schema);
    expect(first(1).ok && second(1).ok).toBe(true);
    expect(second('1').ok).toBe(false);
  });
});
