// A cleared override in the replica logic of the bus (design §3.6, migration 0024), without a database: a clear
// (a tombstone row) ends the override under its own version, beats the override it clears in any order, is kept so
// an older override is never applied again, and is never published again at a resync; GatewayState.clearOverride
// serves the next layer (the rollout assignment, else the registry).
import { validateDesiredSettings } from '@platform/contracts';
import type { ClearMessage, OverrideMessage } from '../src/cluster/messages.js';
import { Replica } from '../src/cluster/replica.js';
import { GatewayState } from '../src/domain/gateway-state.js';
import { VersionClock } from '../src/domain/version-clock.js';
import { device } from './support/harness.js';

const quiet = { warn: () => undefined, error: () => undefined };

function setup() {
  const clock = new VersionClock(() => 1_000);
  const state = new GatewayState({
    clock,
    maxDocumentBytes: 1024,
    validateSettings: validateDesiredSettings,
  });
  state.replaceRegistry([device('d1', { desiredSettings: { reporting_interval_s: 300 } })]);
  const replica = new Replica({
    origin: 'self',
    target: state,
    clock,
    validateSettings: validateDesiredSettings,
    log: quiet,
  });
  return { clock, state, replica };
}

const override = (v: number, s: Record<string, unknown>, o = 'peer'): OverrideMessage => ({
  k: 'override',
  d: 'd1',
  v,
  o,
  s,
});
const clear = (v: number, o = 'peer'): ClearMessage => ({ k: 'clear', d: 'd1', v, o });

describe('a cleared override in the replica logic', () => {
  it('ends the override: the registry settings under the clear version, above the override', () => {
    const { state, replica } = setup();
    replica.receive(override(5_000, { reporting_interval_s: 90 }));
    expect(state.settingsDocument('d1')!.body).toMatchObject({ source: 'override' });
    expect(replica.receive(clear(6_000))).toBe('none');
    const doc = state.settingsDocument('d1')!;
    expect(doc.body).toMatchObject({ source: 'registry', settings: { reporting_interval_s: 300 } });
    expect(doc.version).toBe(6_000);
    expect(state.overrideOf('d1')).toBeUndefined();
    expect(replica.stats.cleared).toBe(1);
    expect(replica.retainedCount).toBe(0);
  });

  it('keeps the clear: an older override arriving after it is not applied, a newer one is', () => {
    const { state, replica } = setup();
    replica.receive(clear(6_000));
    expect(state.settingsDocument('d1')!.body).toMatchObject({ source: 'registry' });
    replica.receive(override(5_000, { reporting_interval_s: 90 }));
    expect(state.settingsDocument('d1')!.body).toMatchObject({ source: 'registry' });
    expect(replica.stats.stale).toBe(1);
    replica.receive(override(7_000, { reporting_interval_s: 91 }));
    expect(state.settingsDocument('d1')!.body).toMatchObject({ source: 'override' });
  });

  it('serves the rollout assignment, not the registry, when the device has one', () => {
    const { state, replica } = setup();
    state.applyAssignments([state.prepareAssignment('d1', 'r-1', { reporting_interval_s: 600 })]);
    replica.receive(override(5_000, { reporting_interval_s: 90 }));
    replica.receive(clear(6_000));
    expect(state.settingsDocument('d1')!.body).toMatchObject({
      source: 'rollout',
      settings: { reporting_interval_s: 600 },
    });
  });

  it('at a resync: reads tombstones, and does not publish again an override the table holds cleared', () => {
    const { state, replica } = setup();
    replica.receive(override(5_000, { reporting_interval_s: 90 }));
    const { republish } = replica.resync([clear(6_000)]);
    expect(republish).toEqual([]);
    expect(state.settingsDocument('d1')!.body).toMatchObject({ source: 'registry' });
    // An override the table lacks (a gap in which the table was emptied) is still published again.
    replica.receive(override(7_000, { reporting_interval_s: 92 }));
    expect(replica.resync([]).republish).toEqual([override(7_000, { reporting_interval_s: 92 })]);
  });

  it('a clear of a device without an override here changes nothing', () => {
    const { state, replica } = setup();
    const before = state.settingsDocument('d1');
    replica.receive(clear(6_000));
    expect(state.settingsDocument('d1')).toBe(before);
    expect(replica.stats.cleared).toBe(0);
  });

  it('a stamp below the version the device is served gives a fresh, higher version', () => {
    const { state, replica } = setup();
    // Stamped below the registry document's version: served under a fresh one.
    replica.receive(override(500, { reporting_interval_s: 90 }));
    const overridden = state.settingsDocument('d1')!.version;
    expect(overridden).toBeGreaterThan(500);
    replica.receive(clear(600));
    const doc = state.settingsDocument('d1')!;
    expect(doc.body).toMatchObject({ source: 'registry' });
    expect(doc.version).toBeGreaterThan(overridden);
  });
});
