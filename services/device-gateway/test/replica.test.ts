// The replica logic of the bus (design §3.6) without a database: what a message from the channel, an accepted
// override, a resync and a reload do to this replica's state, and what they ask the bus to do.
import { validateDesiredSettings } from '@platform/contracts';
import { Replica } from '../src/cluster/replica.js';
import type { OverrideMessage } from '../src/cluster/messages.js';
import { GatewayState, type SettingsValidator } from '../src/domain/gateway-state.js';
import { VersionClock } from '../src/domain/version-clock.js';
import { device } from './support/harness.js';

const quiet = { warn: () => undefined, error: () => undefined };

function setup(options: { maxDocumentBytes?: number; devices?: string[] } = {}) {
  const clock = new VersionClock(() => 1_000);
  const state = new GatewayState({
    clock,
    maxDocumentBytes: options.maxDocumentBytes ?? 1024,
    validateSettings: validateDesiredSettings,
  });
  state.replaceRegistry((options.devices ?? ['d1', 'd2']).map((id) => device(id)));
  const validations: unknown[] = [];
  const validateSettings: SettingsValidator = (data) => {
    validations.push(data);
    return validateDesiredSettings(data);
  };
  const replica = new Replica({ origin: 'self', target: state, clock, validateSettings, log: quiet });
  return { clock, state, replica, validations };
}

const override = (d: string, v: number, o: string, s: Record<string, unknown>): OverrideMessage => ({
  k: 'override',
  d,
  v,
  o,
  s,
});

describe('Replica (bus logic, no database)', () => {
  it('applies an override from another replica under the version that replica stamped', () => {
    const { state, replica, clock } = setup();
    expect(replica.receive(override('d1', 5_000, 'peer', { reporting_interval_s: 90 }))).toBe('none');
    const doc = state.settingsDocument('d1')!;
    expect(doc.version).toBe(5_000);
    expect(doc.body).toMatchObject({ source: 'override', settings: { reporting_interval_s: 90 } });
    expect(clock.next()).toBeGreaterThan(5_000);
    expect(replica.stats).toMatchObject({ received: 1, applied: 1, malformed: 0 });
  });

  it('checks what arrives from the channel once, and drops what is malformed or invalid', () => {
    const { state, replica, validations } = setup();
    const before = state.settingsDocument('d1');
    expect(replica.receive('{not json')).toBe('none');
    expect(replica.receive({ k: 'override', d: 'd1', v: 7, o: 'p' })).toBe('none');
    expect(replica.receive(override('d1', 6_000, 'peer', { reporting_interval_s: -1 }))).toBe('none');
    expect(replica.receive(override('d1', 6_001, 'peer', {}))).toBe('none');
    expect(state.settingsDocument('d1')).toBe(before);
    expect(replica.stats.malformed).toBe(4);
    expect(replica.retainedCount).toBe(0);
    expect(validations).toHaveLength(1);
  });

  it('refuses a version past 2^53 - 1 or more than 70 s ahead of its clock: nothing applied, the clock unmoved', () => {
    const { state, replica, clock } = setup();
    const before = state.settingsDocument('d1');
    const top = clock.current;
    for (const v of [Number.MAX_SAFE_INTEGER, 2 ** 53, 1_000 + 70_000_001]) {
      expect(replica.receive(override('d1', v, 'peer', { reporting_interval_s: 90 }))).toBe('none');
      expect(replica.receive({ k: 'reload', v, o: 'peer' })).toBe('none');
    }
    expect(state.settingsDocument('d1')).toBe(before);
    expect(clock.current).toBe(top);
    expect(replica.stats).toMatchObject({ refused: 4, malformed: 2, applied: 0, remoteReloads: 0 });
    // Just inside the bound is believed.
    expect(replica.receive(override('d1', 1_000 + 70_000_000, 'peer', { reporting_interval_s: 90 }))).toBe(
      'none',
    );
    expect(state.settingsDocument('d1')!.version).toBe(70_001_000);
  });

  it('applies an override this replica accepted without checking it again', () => {
    const { state, replica, validations } = setup();
    const accepted = state.prepareOverride('d1', { reporting_interval_s: 120 });
    expect(replica.accepted(override('d1', 7_000, 'self', { reporting_interval_s: 120 }), accepted)).toBe(
      'none',
    );
    expect(state.settingsDocument('d1')!.version).toBe(7_000);
    // Its own echo from the channel changes nothing and is not stale.
    replica.receive(override('d1', 7_000, 'self', { reporting_interval_s: 120 }));
    expect(validations).toHaveLength(0);
    expect(replica.stats).toMatchObject({ applied: 1, stale: 0 });
  });

  it('keeps the last writer on (version, origin), whatever the order of arrival', () => {
    const { state, replica } = setup();
    replica.receive(override('d1', 8_000, 'b', { reporting_interval_s: 20 }));
    replica.receive(override('d1', 8_000, 'a', { reporting_interval_s: 10 }));
    replica.receive(override('d1', 7_999, 'z', { reporting_interval_s: 30 }));
    expect(state.settingsDocument('d1')!.body.settings).toEqual({ reporting_interval_s: 20 });
    expect(replica.stats.stale).toBe(2);
  });

  it('asks for a reload on another replica’s reload, never on its own', () => {
    const { replica, clock } = setup();
    expect(replica.receive({ k: 'reload', v: 9_000, o: 'self' })).toBe('none');
    expect(replica.receive({ k: 'reload', v: 9_001, o: 'peer' })).toBe('reload');
    expect(clock.current).toBeGreaterThanOrEqual(9_001);
    expect(replica.stats.remoteReloads).toBe(1);
  });

  it('holds an override for a device its registry lacks, asks for one reload, applies it once the device arrives', () => {
    const { state, replica } = setup();
    expect(replica.receive(override('d3', 10_000, 'peer', { reporting_interval_s: 50 }))).toBe('reload');
    expect(replica.receive(override('d3', 10_001, 'peer', { reporting_interval_s: 61 }))).toBe('none');
    expect(state.settingsDocument('d3')).toBeUndefined();
    state.replaceRegistry(['d1', 'd2', 'd3'].map((id) => device(id)));
    replica.reconcile();
    // The reload issued newer versions than the stamp meanwhile: the override gets a fresh, higher one.
    expect(state.settingsDocument('d3')!.body).toMatchObject({
      source: 'override',
      settings: { reporting_interval_s: 61 },
    });
    expect(state.settingsDocument('d3')!.version).toBeGreaterThan(10_001);
  });

  it('forgets the override of a device that left the registry', () => {
    const { state, replica } = setup();
    replica.receive(override('d2', 11_000, 'peer', { reporting_interval_s: 50 }));
    expect(replica.retainedCount).toBe(1);
    state.replaceRegistry([device('d1')]);
    replica.reconcile();
    expect(replica.retainedCount).toBe(0);
  });

  it('resync applies valid retained rows and returns what the table lacks or holds older', () => {
    const { state, replica } = setup();
    replica.receive(override('d1', 12_000, 'peer', { reporting_interval_s: 70 }));
    replica.receive(override('d2', 12_001, 'peer', { reporting_interval_s: 80 }));
    const { decision, republish } = replica.resync([
      override('d2', 11_999, 'old', { reporting_interval_s: 10 }),
      override('d1', 12_000, 'peer', { reporting_interval_s: 70 }),
    ]);
    expect(decision).toBe('none');
    expect(republish.map((m) => [m.d, m.v])).toEqual([['d2', 12_001]]);
    const fresh = setup();
    fresh.replica.resync([
      override('d1', 13_000, 'peer', { reporting_interval_s: 90 }),
      override('d2', 13_001, 'peer', { reporting_interval_s: 'x' }),
    ]);
    expect(fresh.state.settingsDocument('d1')!.version).toBe(13_000);
    expect(fresh.state.settingsDocument('d2')!.body.source).toBe('registry');
    expect(state.settingsDocument('d2')!.version).toBe(12_001);
  });

  it('retains but never applies an override that does not fit a datagram on this replica', () => {
    const { state, replica } = setup({ maxDocumentBytes: 120 });
    const before = state.settingsDocument('d1');
    const big = { timezone: 'America/Argentina/ComodRivadavia', firmware_channel: 'stable' };
    expect(replica.receive(override('d1', 14_000, 'peer', big))).toBe('none');
    expect(state.settingsDocument('d1')).toBe(before);
    expect(replica.retainedCount).toBe(1);
    expect(replica.stats.applied).toBe(0);
  });
});
