// The delivery recorder's own rules (design §3.8), without a database: one row per device per batch, newest
// parts win, a failed write loses nothing and is retried under newer events, the lag gauge. The SQL side
// (delivery_record, delivery_reap) is tested on PostgreSQL in delivery-list.test.ts and delivery.test.ts.
import { describe, expect, it, jest } from '@jest/globals';
import { createLogger } from '@platform/service-kit';
import {
  DeliveryRecorder,
  contentHash,
  type DeliveryRecorderOptions,
  type DeliveryRow,
  type DeliveryWriter,
} from '../src/delivery/recorder.js';
import type { DeliveryBatch } from '../src/delivery/row-builder.js';
import { fromBatch, record } from './support/delivery.js';
import { settingsDocument, prepareSettings } from '../src/domain/documents.js';

const logger = createLogger({ service: 'recorder-test', level: 'error' });
const doc = (deviceId: string, version: number, interval: number) => {
  const settings = { reporting_interval_s: interval };
  return settingsDocument(deviceId, version, 'registry', settings, prepareSettings(settings));
};

class FakeWriter implements DeliveryWriter {
  batches: DeliveryRow[][] = [];
  failNext = 0;
  /** Chunks written before every later one fails (until reset). */
  failAfter = Infinity;
  async record(_replica: string, batch: DeliveryBatch): Promise<void> {
    const rows = fromBatch(batch);
    await Promise.resolve();
    if (this.failNext > 0 || this.batches.length >= this.failAfter) {
      if (this.failNext > 0) this.failNext--;
      else this.failAfter = Infinity;
      throw new Error('database unreachable');
    }
    this.batches.push([...rows]);
  }
  async reap(): Promise<number> {
    return Promise.resolve(0);
  }
}

/** A writer whose first write waits until `open()`: what happens while a chunk is being written. */
class GatedWriter implements DeliveryWriter {
  readonly batches: DeliveryRow[][] = [];
  /** Writes that fail once the gate is open. */
  failNext = 0;
  private gate: Promise<void>;
  private release!: () => void;
  private began!: () => void;
  private readonly begun: Promise<void>;
  constructor() {
    this.gate = new Promise((res) => (this.release = res));
    this.begun = new Promise((res) => (this.began = res));
  }
  started(): Promise<void> {
    return this.begun;
  }
  open(): void {
    this.release();
  }
  async record(_replica: string, batch: DeliveryBatch): Promise<void> {
    const rows = fromBatch(batch); // read before the call returns: the recorder reuses the batch
    this.began();
    await this.gate;
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error('database unreachable');
    }
    this.batches.push(rows);
  }
  async reap(): Promise<number> {
    return Promise.resolve(0);
  }
  rows(): DeliveryRow[] {
    return this.batches.flat();
  }
}

/** Waits (up to 250 ms) until `w` has been given `n` rows: what a started recorder's early flushes write. */
async function rowsWritten(w: FakeWriter, n: number): Promise<void> {
  for (let k = 0; k < 50 && w.batches.flat().length < n; k++) await new Promise((res) => setTimeout(res, 5));
}

/** A recorder whose timer never fires (the tests flush), with `relations` relations per device. */
function recorder(
  writer: DeliveryWriter,
  relations = 1,
  options: Partial<DeliveryRecorderOptions> = {},
): DeliveryRecorder {
  return new DeliveryRecorder({
    replica: '0123456789abcdef',
    writer,
    logger,
    flushMs: 1_000_000,
    relationsOf: () => relations,
    ...options,
  });
}

/**
 * A started recorder over a FakeWriter, with `relations` relations per device: its early flushes run (its tick,
 * every 1,000 s as `recorder` sets it, does not come during a test); stopped after `body`.
 */
async function whileStarted(
  relations: number,
  options: Partial<DeliveryRecorderOptions>,
  body: (w: FakeWriter, r: DeliveryRecorder) => Promise<void>,
): Promise<void> {
  const w = new FakeWriter();
  const r = recorder(w, relations, options);
  r.start();
  try {
    await body(w, r);
  } finally {
    await r.stop();
  }
}

describe('DeliveryRecorder', () => {
  it('writes one row per device with the newest of each part', async () => {
    const w = new FakeWriter();
    const r = recorder(w);
    const v1 = doc('d1', 1, 60);
    const v2 = doc('d1', 2, 120);
    r.desired(record('d1'), v2);
    r.sent('d1', v1, 'plain', true);
    r.sent('d1', v2, 'dtls', false);
    r.acknowledged('d1', v1, 'plain');
    r.relationsChanged('d1');
    await r.flush();
    expect(w.batches).toHaveLength(1);
    const [row] = w.batches[0]!;
    expect(row).toMatchObject({
      d: 'd1',
      dv: 2,
      dc: contentHash(v2),
      sv: 2,
      st: 'dtls',
      sk: false,
      av: 1,
      ac: contentHash(v1),
      r: 1,
    });
    expect(row!.h).toBeDefined();
    // Content, not version: the same settings under another number hash alike; other settings do not.
    expect(contentHash(doc('d1', 99, 120))).toBe(contentHash(v2));
    expect(contentHash(v1)).not.toBe(contentHash(v2));
  });

  it('a failed write loses nothing: it is retried under the events that came meanwhile', async () => {
    const w = new FakeWriter();
    const r = recorder(w);
    const v1 = doc('d1', 1, 60);
    const v2 = doc('d1', 2, 120);
    r.sent('d1', v1, 'plain', true);
    r.acknowledged('d1', v1, 'plain');
    r.heard('d2', 'plain');
    w.failNext = 1;
    await r.flush();
    expect(w.batches).toHaveLength(0);
    expect(r.stats.failures).toBe(1);
    expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
    r.sent('d1', v2, 'plain', true);
    await r.flush();
    const rows = new Map(w.batches.flat().map((row) => [row.d, row]));
    // The newer send wins; the older acknowledgement, which nothing newer replaced, is kept.
    expect(rows.get('d1')).toMatchObject({ sv: 2, av: 1 });
    expect(rows.get('d2')?.h).toBeDefined();
    expect(r.lagSeconds()).toBe(0);
  });

  it('a failed write leaves the lag at the age of the oldest unwritten event, also for a row queued again meanwhile', async () => {
    // A cold review's finding: the rows of a failed chunk were queued again as if their events had just
    // happened, so the lag (the gauge, and what the rollout driver waits for) stayed near 0 while nothing
    // was written.
    const w = new GatedWriter();
    const r = recorder(w);
    r.acknowledged('d1', doc('d1', 1, 60), 'plain');
    r.heard('d2', 'plain');
    await new Promise((res) => setTimeout(res, 300));
    const flushing = r.flush();
    await w.started();
    // d2 is heard again while its row is being written: queued again, with this event's time.
    r.heard('d2', 'plain');
    w.failNext = 1;
    w.open();
    await flushing;
    expect(r.stats.failures).toBe(1);
    expect(r.lagSeconds()).toBeGreaterThanOrEqual(0.3);
    await r.flush();
    expect(r.lagSeconds()).toBe(0);
  });

  it('a confirmable send held while its row was in flight, then the write fails: the row is queued again and the lag counts its older part', async () => {
    // A cold review's finding (the held list's entry knew only the send, so an early round cleared the gauge).
    const w = new GatedWriter();
    const r = recorder(w, 1, { chunkRows: 10 });
    r.start(); // no tick during the test
    try {
      r.acknowledged('x', doc('x', 1, 60), 'plain');
      await new Promise((res) => setTimeout(res, 400));
      const flushing = r.flush();
      await w.started(); // x's acknowledgement is in flight
      r.sent('x', doc('x', 2, 120), 'plain', true); // nothing else unwritten: held at once
      w.failNext = 1;
      w.open();
      await flushing;
      expect(r.stats.failures).toBe(1);
      expect(r.lagSeconds()).toBeGreaterThanOrEqual(0.4);
      // An early round (a chunk's worth of other rows) before any tick writes x's acknowledgement again.
      for (let i = 0; i < 10; i++) r.heard(`o${i}`, 'plain');
      for (let k = 0; k < 100 && !w.rows().some((row) => row.d === 'x' && row.av === 1); k++)
        await new Promise((res) => setTimeout(res, 5));
      expect(w.rows().some((row) => row.d === 'x' && row.av === 1)).toBe(true);
    } finally {
      await r.stop();
    }
  });

  it("relations reported after stop (a resync's later report) are not recorded", async () => {
    const w = new FakeWriter();
    const r = recorder(w);
    r.start();
    await r.stop();
    r.reportRelations(['d1']);
    await r.flush();
    expect(w.batches.flat()).toEqual([]);
  });

  it('a clean stop writes the rows it holds', async () => {
    // A cold review's finding: a young desired part of an observed device stayed held through the last flush.
    const w = new FakeWriter();
    const r = recorder(w, 1, { flushMs: 60_000 });
    r.start();
    r.desired(record('s1'), doc('s1', 5, 60));
    await r.flush(); // held: observed, desired younger than an interval
    expect(w.batches.flat()).toEqual([]);
    await r.stop();
    expect(w.batches.flat().map((row) => row.d)).toEqual(['s1']);
  });

  it('splits large batches into chunks and reports its lag while events wait', async () => {
    const w = new FakeWriter();
    const r = recorder(w, 0, { chunkRows: 100 });
    expect(r.lagSeconds()).toBe(0);
    for (let i = 0; i < 250; i++) r.heard(`d${i}`, 'plain');
    await new Promise((res) => setTimeout(res, 20));
    expect(r.lagSeconds()).toBeGreaterThan(0.01);
    await r.flush();
    expect(w.batches.map((b) => b.length)).toEqual([100, 100, 50]);
    expect(r.stats.rows).toBe(250);
  });

  it('a device about to be notified waits up to one interval, so sent and acknowledged share its row', async () => {
    const w = new FakeWriter();
    const r = recorder(w, 1, { flushMs: 100 });
    const v2 = doc('d1', 2, 120);
    r.desired(record('d1'), v2);
    r.desired(record('d9'), doc('d9', 2, 120));
    await r.flush();
    expect(w.batches.flat()).toEqual([]);
    r.sent('d1', v2, 'plain', true);
    r.acknowledged('d1', v2, 'plain');
    await r.flush();
    expect(w.batches.flat().map((row) => row.d)).toEqual(['d1']);
    expect(w.batches.flat()[0]).toMatchObject({ dv: 2, sv: 2, av: 2 });
    // d9 was never sent: written once its desired part is an interval old (the lag bound), never later.
    await new Promise((res) => setTimeout(res, 110));
    await r.flush();
    const d9 = w.batches.flat().find((row) => row.d === 'd9');
    expect(d9).toMatchObject({ dv: 2 });
    expect(d9!.sv).toBeUndefined();
  });

  it('a step of the wall clock neither holds a row back nor hides the lag; rows are dated on the clock as it reads then', async () => {
    const w = new FakeWriter();
    const r = recorder(w, 1, { flushMs: 100 });
    const real = Date.now.bind(Date);
    let step = 0;
    const clock = jest.spyOn(Date, 'now').mockImplementation(() => real() - step);
    try {
      r.desired(record('d1'), doc('d1', 2, 120)); // observed here: held up to an interval for its notification
      await r.flush();
      expect(w.batches.flat()).toEqual([]);
      step = 3_600_000; // NTP steps the clock back an hour (a virtual machine resumed)
      await new Promise((res) => setTimeout(res, 150));
      // On the wall clock the event lay an hour in the future: the gauge read 0 and the row stayed held for the
      // hour (it was written only once a new part of the device arrived).
      expect(r.lagSeconds()).toBeGreaterThanOrEqual(0.1);
      await r.flush();
      const row = w.batches.flat().find((x) => x.d === 'd1');
      expect(row).toMatchObject({ dv: 2 });
      expect(row!.sv).toBeUndefined();
      expect(row!.da).toBeGreaterThan(real() - step - 1000);
      expect(row!.da).toBeLessThanOrEqual(real() - step);
      expect(r.lagSeconds()).toBe(0);
    } finally {
      clock.mockRestore();
    }
  });

  it('a desired part waiting for its notification is written within a few intervals even while newer rows never let a round finish its batch', async () => {
    // Each call writes its chunk and, meanwhile, 30 more devices are heard: the queue never empties, so a round
    // never reaches the end of its batch, where due rows waiting for their notification (`later`) are taken.
    const calls: DeliveryRow[][] = [];
    let fresh = 0;
    const stopAt = 400;
    const writer: DeliveryWriter = {
      async record(_replica, batch) {
        calls.push(fromBatch(batch));
        await new Promise((res) => setTimeout(res, 1));
        if (calls.length < stopAt && !calls.flat().some((row) => row.d === 'late'))
          for (let k = 0; k < 30; k++) r.heard(`busy${fresh++}`, 'plain');
      },
      reap: () => Promise.resolve(0),
    };
    const r = recorder(writer, 1, { flushMs: 25, chunkRows: 10 });
    r.desired(record('late'), doc('late', 2, 120)); // observed here: held for its notification, which never comes
    for (let k = 0; k < 100; k++) r.heard(`busy${fresh++}`, 'plain');
    await new Promise((res) => setTimeout(res, 30)); // its desired part is due
    await r.flush();
    const at = calls.findIndex((rows) => rows.some((row) => row.d === 'late'));
    // Before: written only once the stream stopped (call 400 and after); now once four intervals old.
    expect(at).toBeGreaterThanOrEqual(0);
    expect(at).toBeLessThan(stopAt - 1);
    expect(calls[at]!.find((row) => row.d === 'late')).toMatchObject({ dv: 2 });
  });

  it('holds a device only while it has events: quiet ones are forgotten after one to two reap intervals', async () => {
    const w = new FakeWriter();
    const r = recorder(w, 0, { reapMs: 0 });
    for (let i = 0; i < 100; i++) r.heard(`d${i}`, 'plain');
    await r.flush(); // written; every device had an event since the last sweep
    expect(r.devicesHeld).toBe(100);
    r.heard('d7', 'plain');
    await r.flush(); // d7 had another event: kept; the rest were quiet for a whole sweep interval
    expect(r.devicesHeld).toBe(1);
    await r.flush();
    expect(r.devicesHeld).toBe(0);
    // A forgotten device starts again from nothing: its next event is written as usual.
    r.heard('d3', 'plain');
    await r.flush();
    expect(w.batches.flat().filter((row) => row.d === 'd3')).toHaveLength(2);
  });

  it('events during a flush are not lost: a device taken for a chunk is queued again by its next event', async () => {
    const w = new GatedWriter();
    const r = recorder(w, 0, { chunkRows: 10 });
    const v1 = doc('d0', 1, 60);
    const v2 = doc('d0', 2, 120);
    for (let i = 0; i < 25; i++) r.sent(`d${i}`, v1, 'plain', true);
    const flushing = r.flush();
    await w.started(); // the first chunk (d0..d9) is being written
    // Newer facts for devices already taken (d0), waiting in this batch (d15) and new ones (d30..d2029: the
    // table grows while the batch is written).
    r.sent('d0', v2, 'dtls', true);
    r.acknowledged('d15', v1, 'plain');
    for (let i = 30; i < 2030; i++) r.heard(`d${i}`, 'plain');
    expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
    w.open();
    await flushing;
    await r.flush();
    const rows = w.rows();
    expect(new Set(rows.map((row) => row.d)).size).toBe(25 + 2000);
    const d0 = rows.filter((row) => row.d === 'd0');
    expect(d0.map((row) => [row.sv, row.st])).toEqual([
      [1, 'plain'],
      [2, 'dtls'],
    ]);
    // d15 was still waiting in the batch: its one row carries both parts.
    expect(rows.filter((row) => row.d === 'd15')).toEqual([expect.objectContaining({ sv: 1, av: 1 })]);
    expect(r.lagSeconds()).toBe(0);
  });

  it('a chunk that fails is written again, with the rest of its batch, at the next flush', async () => {
    const w = new FakeWriter();
    const r = recorder(w, 2, { chunkRows: 10 });
    for (let i = 0; i < 25; i++) r.relationsChanged(`d${i}`);
    w.failAfter = 1; // the first chunk is written, the second fails
    await r.flush();
    expect(w.batches.map((b) => b.length)).toEqual([10]);
    expect(r.stats.failures).toBe(1);
    expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
    await r.flush();
    const rows = w.batches.flat();
    expect(rows).toHaveLength(25);
    expect(new Set(rows.map((row) => row.d)).size).toBe(25);
    expect(rows.every((row) => row.r === 2)).toBe(true);
    expect(r.lagSeconds()).toBe(0);
  });

  it('writes each row as the function reads it: µs versions exact, digests, sources, transports, odd ids NULL', async () => {
    const texts: (string | null)[][] = [];
    const w = new FakeWriter();
    const writer: DeliveryWriter = {
      record: (replica, batch) => {
        texts.push([...batch.columns]);
        return w.record(replica, batch);
      },
      reap: () => w.reap(),
    };
    const r = recorder(writer, 3);
    // Versions are µs clock readings (above 2^32, exact below 2^53); an id outside the registry's pattern (no
    // registry row can have it: sent as NULL, which the function skips); every source and transport; a device
    // heard from only.
    const version = 1_764_172_800_123_456;
    const odd = 'dé"v\\ice\u0001';
    const before = Date.now();
    r.desired(record(odd), settingsDocument(odd, version, 'override', { a: 1 }, prepareSettings({ a: 1 })));
    r.sent(odd, doc(odd, version + 1, 30), 'dtls', false);
    r.acknowledged(odd, doc(odd, version + 2, 31), 'dtls');
    r.relationsChanged(odd);
    r.desired(record('d2'), settingsDocument('d2', 7, 'rollout', { b: 2 }, prepareSettings({ b: 2 })));
    r.sent('d2', doc('d2', 8, 40), 'plain', true);
    r.heard('d3', 'plain');
    r.desired(record('d4'), doc('d4', 9, 50));
    r.heard('d4', 'plain'); // not only its desired part (which would wait for the send)
    await r.flush();
    await r.stop();
    const after = Date.now();
    expect(texts).toHaveLength(1);
    // The ids' column: quoted ids of the registry's pattern, NULL for the odd one; no column is left out that a
    // row carries, and none is sent that no row carries (h is carried by three rows, r by one).
    expect(texts[0]![0]).toBe('{NULL,"d2","d3","d4"}');
    expect(texts[0]![15]).toBe('{3,NULL,NULL,NULL}');
    // Times are kept on the monotonic clock in whole ms and dated on the wall clock when taken: within 1 ms.
    const time = (t: unknown) =>
      typeof t === 'number' && Number.isInteger(t) && t >= before - 1 && t <= after + 1;
    const rows = w.batches.flat();
    const times = rows.flatMap((row) => [row.da, row.sa, row.aa, row.h].filter((t) => t !== undefined));
    expect(times.filter((t) => !time(t))).toEqual([]);
    const strip = (row: DeliveryRow) => ({
      ...row,
      da: undefined,
      sa: undefined,
      aa: undefined,
      h: undefined,
    });
    expect(rows.map(strip)).toEqual([
      {
        dv: version,
        ds: 'override',
        dc: contentHash(settingsDocument('x', 1, 'override', { a: 1 }, prepareSettings({ a: 1 }))),
        sv: version + 1,
        sc: contentHash(doc('x', 1, 30)),
        st: 'dtls',
        sk: false,
        av: version + 2,
        ac: contentHash(doc('x', 1, 31)),
        at: 'dtls',
        r: 3,
      },
      {
        d: 'd2',
        dv: 7,
        ds: 'rollout',
        dc: contentHash(settingsDocument('x', 1, 'rollout', { b: 2 }, prepareSettings({ b: 2 }))),
        sv: 8,
        sc: contentHash(doc('x', 1, 40)),
        st: 'plain',
        sk: true,
      },
      { d: 'd3' },
      { d: 'd4', dv: 9, ds: 'registry', dc: contentHash(doc('x', 1, 50)) },
    ]);
    // The times are there (and only) where a part was carried.
    expect(
      rows.map((row) =>
        Object.keys(row)
          .filter((k) => ['da', 'sa', 'aa', 'h'].includes(k))
          .sort(),
      ),
    ).toEqual([['aa', 'da', 'h', 'sa'], ['da', 'sa'], ['h'], ['da', 'h']]);
  });

  it("a slot freed by the sweep and given to another device carries none of the first one's facts", async () => {
    const w = new FakeWriter();
    const r = recorder(w, 0, { reapMs: 0 });
    const v1 = doc('d1', 1, 60);
    r.desired(record('d1'), v1);
    r.sent('d1', v1, 'dtls', true);
    r.acknowledged('d1', v1, 'dtls');
    await r.flush();
    await r.flush(); // d1 quiet for a sweep: forgotten
    expect(r.devicesHeld).toBe(0);
    r.relationsChanged('d2');
    r.sent('d3', v1, 'plain', false);
    await r.flush();
    const rows = w.batches.flat();
    expect(rows.find((row) => row.d === 'd2')).toEqual({ d: 'd2', r: 0 });
    expect(rows.find((row) => row.d === 'd3')).toMatchObject({ sv: 1, st: 'plain', sk: false });
    expect(rows.find((row) => row.d === 'd3')!.av).toBeUndefined();
    expect(rows.find((row) => row.d === 'd3')!.dv).toBeUndefined();
  });

  it("a caller's DeliveryRef saves the lookup and is never trusted blindly: stale or foreign slots are looked up", async () => {
    const w = new FakeWriter();
    const r = recorder(w, 0, { reapMs: 0 });
    const a = { deliverySlot: -1 };
    const b = { deliverySlot: -1 };
    r.heard('a', 'plain', a);
    r.heard('b', 'plain', b);
    expect(a.deliverySlot).not.toBe(b.deliverySlot);
    const v1 = doc('a', 1, 60);
    r.sent('a', v1, 'plain', true, b); // b's slot for device a: looked up, and the ref now names a's slot
    expect(b.deliverySlot).toBe(a.deliverySlot);
    r.acknowledged('a', v1, 'plain', { deliverySlot: 1_000_000 });
    await r.flush();
    const first = w.batches.flat();
    expect(first.map((row) => row.d)).toEqual(['a', 'b']);
    expect(first[0]).toMatchObject({ sv: 1, av: 1 });
    expect(Object.keys(first[1]!).sort()).toEqual(['d', 'h']);
    await r.flush(); // both quiet for a sweep: forgotten, their slots free
    expect(r.devicesHeld).toBe(0);
    r.heard('c', 'plain'); // takes a freed slot, perhaps a's
    r.relationsChanged('a', a);
    await r.flush();
    const last = w.batches.at(-1)!;
    expect(last.map((row) => row.d).sort()).toEqual(['a', 'c']);
    expect(last.find((row) => row.d === 'a')).toEqual({ d: 'a', r: 0 });
  });
  it('with two writers a flush writes two chunks at once, never one device in both; a failed chunk among them requeues exactly its rows', async () => {
    // Each call waits until released, so the test sees which calls are in flight together.
    const inFlight = new Set<string>();
    const calls: { rows: DeliveryRow[]; overlap: boolean; concurrent: number }[] = [];
    const written: DeliveryRow[] = [];
    let failCall = 2; // the second call fails (while the first is still in flight)
    const releases: (() => void)[] = [];
    const writer: DeliveryWriter = {
      async record(_replica, batch) {
        const rows = fromBatch(batch);
        const ids = rows.map((row) => row.d);
        const overlap = ids.some((d) => inFlight.has(d));
        ids.forEach((d) => inFlight.add(d));
        calls.push({ rows, overlap, concurrent: releases.length + 1 });
        const n = calls.length;
        await new Promise<void>((res) => releases.push(res));
        ids.forEach((d) => inFlight.delete(d));
        if (n === failCall) throw new Error('database unreachable');
        written.push(...rows);
      },
      reap: () => Promise.resolve(0),
    };
    const r = recorder(writer, 1, { chunkRows: 10, writers: 2 });
    const v1 = doc('d0', 1, 60);
    for (let i = 0; i < 45; i++) r.sent(`d${i}`, v1, 'plain', false);
    const release = async (): Promise<void> => {
      // Let every waiting call go, until the flush is over.
      for (let k = 0; k < 50 && releases.length === 0; k++) await new Promise((res) => setImmediate(res));
      releases.splice(0).forEach((go) => go());
    };
    const flushing = r.flush();
    await new Promise((res) => setImmediate(res));
    // Two calls at once: the first two chunks.
    expect(calls.map((c) => c.rows.length)).toEqual([10, 10]);
    expect(calls[1]!.concurrent).toBe(2);
    let done = false;
    void flushing.then(() => (done = true));
    while (!done) await release();
    expect(r.stats.failures).toBe(1);
    expect(calls.every((c) => !c.overlap)).toBe(true);
    // The second call's ten devices, and the devices no chunk had taken yet, are unwritten again.
    const failed = calls[1]!.rows.map((row) => row.d);
    expect(written.map((row) => row.d)).not.toEqual(expect.arrayContaining([failed[0]]));
    expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
    failCall = 0;
    const again = r.flush();
    done = false;
    void again.then(() => (done = true));
    while (!done) await release();
    // Every device written exactly once over the two flushes: nothing lost, nothing written twice.
    const ids = written.map((row) => row.d).sort();
    expect(ids).toEqual(Array.from({ length: 45 }, (_, i) => `d${i}`).sort());
    expect(calls.every((c) => !c.overlap)).toBe(true);
    expect(Math.max(...calls.map((c) => c.concurrent))).toBe(2);
    expect(r.lagSeconds()).toBe(0);
    expect(r.stats.rows).toBe(45);
  });

  it('once started, writes a chunk as soon as a chunk is ready rather than at the tick', async () => {
    await whileStarted(0, { chunkRows: 10, writers: 2 }, async (w, r) => {
      const v1 = doc('d0', 1, 60);
      for (let i = 0; i < 9; i++) r.sent(`d${i}`, v1, 'plain', false);
      await new Promise((res) => setTimeout(res, 20));
      expect(w.batches).toEqual([]); // fewer than a chunk: they wait for the tick
      for (let i = 9; i < 30; i++) r.sent(`d${i}`, v1, 'plain', false);
      await rowsWritten(w, 30);
      expect(w.batches.flat()).toHaveLength(30);
      expect(r.stats.earlyFlushes).toBeGreaterThan(0);
      expect(r.lagSeconds()).toBe(0);
    });
  });

  it('an early flush leaves out a confirmable notification not yet acknowledged, so its row carries the acknowledgement', async () => {
    await whileStarted(1, { chunkRows: 10 }, async (w, r) => {
      const v1 = doc('d0', 1, 60);
      r.sent('c0', v1, 'plain', true); // CON, in flight
      for (let i = 0; i < 10; i++) r.sent(`d${i}`, v1, 'plain', false);
      await rowsWritten(w, 10);
      expect(w.batches.flat().map((row) => row.d)).not.toContain('c0');
      r.acknowledged('c0', v1, 'plain');
      await r.flush(); // the tick's rules
      const c0 = w.batches.flat().filter((row) => row.d === 'c0');
      expect(c0).toEqual([expect.objectContaining({ sv: 1, sk: true, av: 1 })]);
    });
  });

  it('rows held back are read again once a tick, not at every round, and their relations are looked up once until a relation event', async () => {
    let asked = 0;
    const w = new FakeWriter();
    const r = recorder(w, 1, {
      chunkRows: 10,
      relationsOf: () => {
        asked++;
        return 1;
      },
    });
    const v1 = doc('d0', 1, 60);
    // 1,000 observed devices whose settings just changed (held for an interval), then 100 rows to write now:
    // five rounds of at most two chunks of 10.
    for (let i = 0; i < 1000; i++) r.desired(record(`h${i}`), v1);
    await r.flush();
    expect(asked).toBe(1000);
    for (let i = 0; i < 100; i++) r.sent(`s${i}`, v1, 'plain', false);
    asked = 0;
    await r.flush();
    expect(w.batches.flat().map((row) => row.d)).toEqual(Array.from({ length: 100 }, (_, i) => `s${i}`));
    expect(w.batches.length).toBeGreaterThanOrEqual(5);
    expect(asked).toBe(0); // known since the first flush
    // A relation event: that device is written now (its relation count read again), the others still wait.
    r.relationsChanged('h7');
    await r.flush();
    expect(asked).toBe(1);
    expect(w.batches.flat().filter((row) => row.d.startsWith('h'))).toEqual([
      expect.objectContaining({ d: 'h7', dv: 1 }),
    ]);
    expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
  });

  it('a held row that gets a new part is written by the next early flush, without waiting for the tick', async () => {
    await whileStarted(1, { chunkRows: 10 }, async (w, r) => {
      const v1 = doc('d0', 1, 60);
      for (let i = 0; i < 100; i++) r.desired(record(`h${i}`), v1);
      await r.flush(); // every row held: observed, its desired part younger than an interval
      expect(w.batches).toEqual([]);
      expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
      // The fan-out reaches 20 of them (sent and acknowledged: two new parts each, a chunk's worth).
      for (let i = 0; i < 20; i++) {
        r.sent(`h${i}`, v1, 'plain', true);
        r.acknowledged(`h${i}`, v1, 'plain');
      }
      await rowsWritten(w, 20);
      const rows = w.batches.flat();
      expect(rows.map((row) => row.d).sort()).toEqual(Array.from({ length: 20 }, (_, i) => `h${i}`).sort());
      expect(rows.every((row) => row.dv === 1 && row.sv === 1 && row.av === 1)).toBe(true);
      expect(r.stats.earlyFlushes).toBeGreaterThan(0);
      expect(r.lagSeconds()).toBeGreaterThan(0); // the other 80 still wait
    });
  });

  it('a confirmable notification to a held row leaves it held: sends alone start no early flush, its acknowledgement does', async () => {
    await whileStarted(1, { chunkRows: 10 }, async (w, r) => {
      const v1 = doc('d0', 1, 60);
      for (let i = 0; i < 100; i++) r.desired(record(`h${i}`), v1);
      await r.flush(); // every row held: observed, its desired part younger than an interval
      const early = r.stats.earlyFlushes;
      // The fan-out sends 50 of them a confirmable notification: five chunks' worth of sends, none acknowledged.
      for (let i = 0; i < 50; i++) r.sent(`h${i}`, v1, 'plain', true);
      await new Promise((res) => setTimeout(res, 30));
      expect(r.stats.earlyFlushes).toBe(early); // an early round would only have held them again
      expect(w.batches).toEqual([]);
      // Their acknowledgements bring them back: one row each, desired, sent and acknowledged.
      for (let i = 0; i < 20; i++) r.acknowledged(`h${i}`, v1, 'plain');
      await rowsWritten(w, 20);
      const rows = w.batches.flat();
      expect(rows.map((row) => row.d).sort()).toEqual(Array.from({ length: 20 }, (_, i) => `h${i}`).sort());
      expect(rows.every((row) => row.dv === 1 && row.sv === 1 && row.sk === true && row.av === 1)).toBe(true);
      expect(r.stats.earlyFlushes).toBeGreaterThan(early);
      // The tick's rules write the 30 sent and not acknowledged, with their send; the 50 not reached still wait.
      await r.flush();
      const rest = w.batches.flat().slice(20);
      expect(rest.map((row) => row.d).sort()).toEqual(
        Array.from({ length: 30 }, (_, i) => `h${i + 20}`).sort(),
      );
      expect(rest.every((row) => row.dv === 1 && row.sv === 1 && row.av === undefined)).toBe(true);
      expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
    });
  });

  it('a confirmable notification to a device with nothing unwritten is held at once: no early flush until acknowledgements', async () => {
    await whileStarted(1, { chunkRows: 10 }, async (w, r) => {
      const v1 = doc('d0', 1, 60);
      for (let i = 0; i < 30; i++) r.sent(`c${i}`, v1, 'plain', true);
      await new Promise((res) => setTimeout(res, 30));
      expect(r.stats.earlyFlushes).toBe(0); // an early round would only have held them
      expect(w.batches).toEqual([]);
      expect(r.lagSeconds()).toBeGreaterThanOrEqual(0);
      for (let i = 0; i < 20; i++) r.acknowledged(`c${i}`, v1, 'plain');
      await rowsWritten(w, 20);
      const rows = w.batches.flat();
      expect(rows.map((row) => row.d).sort()).toEqual(Array.from({ length: 20 }, (_, i) => `c${i}`).sort());
      expect(rows.every((row) => row.sv === 1 && row.sk === true && row.av === 1)).toBe(true);
      expect(r.stats.earlyFlushes).toBeGreaterThan(0);
      await r.flush(); // the tick's rules: the other 10 with their send
      expect(
        w.batches
          .flat()
          .slice(20)
          .map((row) => row.d)
          .sort(),
      ).toEqual(Array.from({ length: 10 }, (_, i) => `c${i + 20}`).sort());
      expect(r.lagSeconds()).toBe(0);
    });
  });

  it('with two writers a long reap runs beside the rounds instead of holding them', async () => {
    const w = new FakeWriter();
    let reaps = 0;
    let endReap!: () => void;
    const writer: DeliveryWriter = {
      record: (replica, batch) => w.record(replica, batch),
      reap: () => {
        reaps++;
        return reaps === 1 ? new Promise<number>((res) => (endReap = () => res(0))) : Promise.resolve(0);
      },
    };
    const r = recorder(writer, 0, { writers: 2 });
    r.heard('d1', 'plain');
    await r.flush(); // writes d1, then starts the reap (the first flush reaps) and returns
    expect(reaps).toBe(1);
    r.heard('d2', 'plain');
    await r.flush(); // not held by the reap still running
    expect(w.batches.flat().map((row) => row.d)).toEqual(['d1', 'd2']);
    endReap();
    await r.stop();
  });
});
