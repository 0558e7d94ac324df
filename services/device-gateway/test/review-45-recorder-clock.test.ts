// Review 45 (cold): the recorder's clock change (monoNow for scheduling, event times dated on the wall clock as a
// round takes them). The wall clock is stepped (jest.spyOn(Date, 'now')) across a failed write and its retry;
// the times written must be the event's moment on the clock of the round that finally writes it, never the
// offset added twice, never a 0/absent time turned into a date.
import { describe, expect, it, jest } from '@jest/globals';
import { createLogger } from '@platform/service-kit';
import {
  DeliveryRecorder,
  type DeliveryRecorderOptions,
  type DeliveryRow,
  type DeliveryWriter,
} from '../src/delivery/recorder.js';
import type { DeliveryBatch } from '../src/delivery/row-builder.js';
import { fromBatch, record } from './support/delivery.js';
import { settingsDocument, prepareSettings } from '../src/domain/documents.js';

const logger = createLogger({ service: 'review45', level: 'error' });
const doc = (deviceId: string, version: number) => {
  const settings = { reporting_interval_s: 60 + version };
  return settingsDocument(deviceId, version, 'registry', settings, prepareSettings(settings));
};

class Writer implements DeliveryWriter {
  batches: DeliveryRow[][] = [];
  failNext = 0;
  calls = 0;
  onCall: (() => void) | undefined;
  async record(_replica: string, batch: DeliveryBatch): Promise<void> {
    const rows = fromBatch(batch);
    this.calls++;
    this.onCall?.();
    await new Promise((r) => setTimeout(r, 2));
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error('database unreachable');
    }
    this.batches.push(rows);
  }
  reap(): Promise<number> {
    return Promise.resolve(0);
  }
}

const HOUR = 3_600_000;

/** Date.now is the real clock plus `clock.step` ms while `body` runs. */
async function withSteppedClock(
  body: (clock: { step: number; real: () => number }) => Promise<void>,
): Promise<void> {
  const real = Date.now.bind(Date);
  const clock = { step: 0, real };
  const spy = jest.spyOn(Date, 'now').mockImplementation(() => real() + clock.step);
  try {
    await body(clock);
  } finally {
    spy.mockRestore();
  }
}

/** A recorder over `w` whose tick never comes (the tests flush), no device observed: nothing is held. */
const recorderOn = (w: Writer, options: Partial<DeliveryRecorderOptions> = {}): DeliveryRecorder =>
  new DeliveryRecorder({
    replica: '0123456789abcdef',
    writer: w,
    logger,
    flushMs: 1_000_000,
    relationsOf: () => 0,
    ...options,
  });

describe('review 45: recorder times across wall-clock steps', () => {
  it("a failed write retried after two steps writes each time once, on the retry round's clock", async () => {
    await withSteppedClock(async (clock) => {
      const w = new Writer();
      const r = recorderOn(w, { writers: 2, chunkRows: 1 });
      const atEvent = clock.real();
      r.desired(record('d1'), doc('d1', 2));
      r.sent('d1', doc('d1', 2), 'plain', false);
      r.acknowledged('d1', doc('d1', 2), 'plain');
      r.heard('d2', 'plain');
      r.desired(record('d3'), doc('d3', 1)); // never heard: heard_at must stay absent
      clock.step = HOUR; // wall clock forward an hour before the first round
      w.failNext = 10;
      await r.flush();
      expect(w.batches.flat()).toEqual([]);
      clock.step = -2 * HOUR; // then back two hours before the retry
      w.failNext = 1; // the retry's first chunk fails again, the next round writes it
      await r.flush();
      await r.flush();
      await r.flush();
      const rows = w.batches.flat();
      const d1 = rows.filter((x) => x.d === 'd1').at(-1)!;
      const d2 = rows.filter((x) => x.d === 'd2').at(-1)!;
      const d3 = rows.filter((x) => x.d === 'd3').at(-1)!;
      const expected = atEvent - 2 * HOUR;
      for (const t of [d1.da, d1.sa, d1.aa, d1.h, d2.h, d3.da])
        expect(Math.abs((t as number) - expected)).toBeLessThan(1000);
      expect(d3.h).toBeUndefined();
      expect(d2.da).toBeUndefined();
    });
  });

  it('a newer event while a chunk is in flight, then a failure and a step: every time once, on one clock', async () => {
    await withSteppedClock(async (clock) => {
      const w = new Writer();
      const r = recorderOn(w);
      const t0 = clock.real();
      r.heard('e1', 'plain');
      w.failNext = 1;
      // While the first (failing) call is in flight: the clock steps and a new part arrives.
      w.onCall = () => {
        if (w.calls === 1) {
          clock.step = 5 * HOUR;
          r.sent('e1', doc('e1', 3), 'plain', false);
        }
      };
      await r.flush();
      await r.flush();
      const row = w.batches.flat().find((x) => x.d === 'e1')!;
      expect(Math.abs(row.h! - (t0 + 5 * HOUR))).toBeLessThan(1000);
      expect(Math.abs(row.sa! - (t0 + 5 * HOUR))).toBeLessThan(1000);
    });
  });
});
