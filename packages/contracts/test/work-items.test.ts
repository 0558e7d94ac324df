import { validateDecisionRequest, validateDecisionResponse } from '@platform/contracts';
import { errorsOf, pathsOf } from './helpers.js';

describe('decision request', () => {
  it.each([
    { decision: 'accept' },
    { decision: 'decline', note: 'not in budget' },
    { decision: 'defer', defer_until: '2025-09-01T00:00:00Z' },
    { decision: 'defer', defer_until: '2025-09-01T08:30:00.250+02:00', note: '' },
    { decision: 'accept', note: 'x'.repeat(2000) },
  ])('accepts %j', (body) => {
    expect(validateDecisionRequest(body)).toEqual({ ok: true, value: body });
  });

  it('requires defer_until for "defer"', () => {
    expect(errorsOf(validateDecisionRequest({ decision: 'defer' }))).toEqual([
      { path: '/defer_until', message: 'is required' },
    ]);
  });

  it.each(['accept', 'decline'])('rejects defer_until for "%s"', (decision) => {
    expect(errorsOf(validateDecisionRequest({ decision, defer_until: '2025-09-01T00:00:00Z' }))).toEqual([
      { path: '/defer_until', message: 'is not allowed here' },
    ]);
  });

  it.each(['2025-09-01', '2025-09-01T00:00:00', '2025-02-30T00:00:00Z', 'next week', 1767225600])(
    'rejects the defer_until %j',
    (deferUntil) => {
      expect(pathsOf(validateDecisionRequest({ decision: 'defer', defer_until: deferUntil }))).toEqual([
        '/defer_until',
      ]);
    },
  );

  it('limits the note to 2000 characters', () => {
    expect(errorsOf(validateDecisionRequest({ decision: 'accept', note: 'x'.repeat(2001) }))).toEqual([
      { path: '/note', message: 'must NOT have more than 2000 characters' },
    ]);
    expect(pathsOf(validateDecisionRequest({ decision: 'accept', note: null }))).toEqual(['/note']);
  });

  it.each([{}, { decision: 'approve' }, { decision: 'ACCEPT' }, { decision: 'accept', reason: 'x' }, []])(
    'rejects %j',
    (body) => {
      expect(validateDecisionRequest(body).ok).toBe(false);
    },
  );

  it('names the missing decision and the unknown member', () => {
    expect(errorsOf(validateDecisionRequest({ reason: 'x' }))).toEqual([
      { path: '/decision', message: 'is required' },
      { path: '/reason', message: 'is not an allowed property' },
    ]);
    expect(errorsOf(validateDecisionRequest({ decision: 'approve' }))).toEqual([
      { path: '/decision', message: 'must be one of "accept", "defer", "decline"' },
    ]);
  });
});

describe('decision response', () => {
  const state = {
    work_item_id: '6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b',
    site_id: '11111111-2222-4333-8444-555555555555',
    status: 'deferred',
    defer_until: '2025-09-01T00:00:00Z',
    decided_at: '2025-06-01T10:00:00.123Z',
    decided_by: '9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d',
    note: null,
  };

  it('accepts a decided and an undecided item', () => {
    expect(validateDecisionResponse(state).ok).toBe(true);
    expect(
      validateDecisionResponse({
        ...state,
        status: 'proposed',
        defer_until: null,
        decided_at: null,
        decided_by: null,
      }).ok,
    ).toBe(true);
  });

  it.each([
    [{ status: 'approved' }, '/status'],
    [{ site_id: 'acme' }, '/site_id'],
    [{ decided_at: 'yesterday' }, '/decided_at'],
    [{ history: [] }, '/history'],
  ])('rejects %j at %s', (change, path) => {
    expect(pathsOf(validateDecisionResponse({ ...state, ...change }))).toEqual([path]);
  });
});
