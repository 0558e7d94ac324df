// RFC 7396 (JSON Merge Patch): the algorithm of §2 (src/domain/documents.ts mergePatch) against every example of
// the RFC's Appendix A, and the property a rollout's patch relies on (design §3.9): members it does not name stay.
import { describe, expect, it } from '@jest/globals';
import { mergePatch } from '../src/domain/documents.js';

// RFC 7396 Appendix A, in its order: [original, patch, result].
const APPENDIX_A: [unknown, unknown, unknown][] = [
  [{ a: 'b' }, { a: 'c' }, { a: 'c' }],
  [{ a: 'b' }, { b: 'c' }, { a: 'b', b: 'c' }],
  [{ a: 'b' }, { a: null }, {}],
  [{ a: 'b', b: 'c' }, { a: null }, { b: 'c' }],
  [{ a: ['b'] }, { a: 'c' }, { a: 'c' }],
  [{ a: 'c' }, { a: ['b'] }, { a: ['b'] }],
  [{ a: { b: 'c' } }, { a: { b: 'd', c: null } }, { a: { b: 'd' } }],
  [{ a: [{ b: 'c' }] }, { a: [1] }, { a: [1] }],
  [
    ['a', 'b'],
    ['c', 'd'],
    ['c', 'd'],
  ],
  [{ a: 'b' }, ['c'], ['c']],
  [{ a: 'foo' }, null, null],
  [{ a: 'foo' }, 'bar', 'bar'],
  [{ e: null }, { a: 1 }, { e: null, a: 1 }],
  [[1, 2], { a: 'b', c: null }, { a: 'b' }],
  [{}, { a: { bb: { ccc: null } } }, { a: { bb: {} } }],
];

describe('mergePatch (RFC 7396 §2)', () => {
  it.each(APPENDIX_A)('Appendix A: %j patched with %j is %j', (original, patch, result) => {
    const before = JSON.stringify(original);
    const patchBefore = JSON.stringify(patch);
    expect(mergePatch(original, patch)).toEqual(result);
    // Pure: neither argument changed.
    expect(JSON.stringify(original)).toBe(before);
    expect(JSON.stringify(patch)).toBe(patchBefore);
  });

  it("keeps what the patch does not name: a freezer monitor's thresholds survive a new reporting interval", () => {
    const freezer = {
      reporting_interval_s: 60,
      thresholds: { temperature_c: { min: -25, max: -15 }, door_open_s: { max: 120 } },
    };
    expect(mergePatch(freezer, { reporting_interval_s: 240 })).toEqual({
      reporting_interval_s: 240,
      thresholds: { temperature_c: { min: -25, max: -15 }, door_open_s: { max: 120 } },
    });
    // One threshold's bound removed, another threshold added, a third removed.
    expect(
      mergePatch(freezer, {
        thresholds: { temperature_c: { min: null }, humidity_pct: { max: 80 }, door_open_s: null },
      }),
    ).toEqual({
      reporting_interval_s: 60,
      thresholds: { temperature_c: { max: -15 }, humidity_pct: { max: 80 } },
    });
  });

  it('defines a member named __proto__ rather than setting a prototype', () => {
    const patch = JSON.parse('{"__proto__":{"polluted":true}}') as unknown;
    const merged = mergePatch({}, patch) as Record<string, unknown>;
    expect(Object.getPrototypeOf(merged)).toBe(Object.prototype);
    expect(Object.keys(merged)).toEqual(['__proto__']);
    expect((merged as { polluted?: unknown }).polluted).toBeUndefined();
  });
});
