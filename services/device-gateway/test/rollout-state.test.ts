// Precedence of a device's settings (design §3.3): development override > rollout assignment > registry, in the
// domain state alone (the replica tests check it across processes and restarts).
import { DocumentTooLargeError, type DeviceChange } from '../src/domain/gateway-state.js';
import { device, newState } from './support/harness.js';

const ROLLOUT = { reporting_interval_s: 300 };

describe('rollout assignments in the gateway state', () => {
  it('an assignment replaces the registry settings; an override replaces both; removing each falls back', () => {
    const state = newState();
    state.replaceRegistry([device('a'), device('b')]);
    const changes: DeviceChange[][] = [];
    state.onChange((c) => changes.push(c));
    const v0 = state.settingsDocument('a')!.version;
    expect(state.applyAssignments([state.prepareAssignment('a', 'r1', ROLLOUT)])).toBe(1);
    const assigned = state.settingsDocument('a')!;
    expect(assigned.body).toMatchObject({ source: 'rollout', settings: ROLLOUT });
    expect(assigned.version).toBeGreaterThan(v0);
    // The same assignment again changes nothing visible.
    expect(state.applyAssignments([state.prepareAssignment('a', 'r1', ROLLOUT)])).toBe(0);
    state.setOverride('a', { reporting_interval_s: 20 });
    expect(state.settingsDocument('a')!.body).toMatchObject({ source: 'override' });
    // Under an override, a new assignment waits underneath.
    expect(state.applyAssignments([state.prepareAssignment('a', 'r2', { reporting_interval_s: 400 })])).toBe(
      0,
    );
    expect(state.assignmentOf('a')?.rolloutId).toBe('r2');
    expect(state.settingsDocument('a')!.body).toMatchObject({ source: 'override' });
    // Removal (a rollback to the registry) of b's assignment: the registry's settings, as a higher version.
    state.applyAssignments([state.prepareAssignment('b', 'r1', ROLLOUT)]);
    const vb = state.settingsDocument('b')!.version;
    expect(state.applyAssignments(['b'])).toBe(1);
    expect(state.settingsDocument('b')!.body).toMatchObject({
      source: 'registry',
      settings: { reporting_interval_s: 60 },
    });
    expect(state.settingsDocument('b')!.version).toBeGreaterThan(vb);
    expect(changes.flat().map((c) => c.deviceId)).toEqual(['a', 'a', 'b', 'b']);
  });

  it('a registry reload keeps assignments, also for a device whose row changed, and a new device gets its own', () => {
    const state = newState();
    state.applyAssignments([state.prepareAssignment('c', 'r1', ROLLOUT)]);
    state.replaceRegistry([device('a'), device('c')]);
    expect(state.settingsDocument('c')!.body).toMatchObject({ source: 'rollout', settings: ROLLOUT });
    state.applyAssignments([state.prepareAssignment('a', 'r1', ROLLOUT)]);
    const version = state.settingsDocument('a')!.version;
    state.replaceRegistry([
      device('a'),
      device('c', { name: 'renamed', desiredSettings: { reporting_interval_s: 90 } }),
    ]);
    expect(state.settingsDocument('a')!.version).toBe(version);
    expect(state.settingsDocument('c')!.body).toMatchObject({ source: 'rollout', settings: ROLLOUT });
  });

  it('settings whose document would not fit one datagram are refused', () => {
    const state = newState();
    const thresholds = Object.fromEntries(
      Array.from({ length: 16 }, (_, i) => [`t${'x'.repeat(30)}${i}`, { min: -1e15 - i, max: 1e15 + i }]),
    );
    expect(() =>
      state.prepareAssignment('d'.repeat(128), 'r1', {
        thresholds,
        timezone: 'America/Argentina/ComodRivadavia',
      }),
    ).toThrow(DocumentTooLargeError);
  });
});
