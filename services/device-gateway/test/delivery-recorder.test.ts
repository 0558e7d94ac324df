// The delivery recorder's own rules (design §3.8), without a database: one row per device per batch, newest
// parts win, a failed write loses nothing and is retried under newer events, the lag gauge. The SQL side
// (delivery_record, delivery_reap) is tested on PostgreSQL in delivery-list.test.ts and delivery.test.ts.
import { describe, expect, it } from '@jest/globals';
import { createLogger } from '@platform/service-kit';
import {
  DeliveryRecorder,
  contentHash,
  type DeliveryRow,
  type DeliveryWriter,
} from '../src/delivery/recorder.js';
import { settingsDocument, prepareSettings, type DeviceRecord } from '../src/domain/documents.js';

const logger = createLogger({ service: 'recorder-test', level: 'error' });
const record = (deviceId: string): DeviceRecord => ({
  deviceId,
  siteId: '11111111-1111-4111-8111-111111111111',
  name: 'n',
  model: 'm',
  enabled: true,
  desiredSettings: {},
});
const doc = (deviceId: string, version: number, interval: number) => {
  const settings = { reporting_interval_s: interval };
  return settingsDocument(deviceId, version, 'registry', settings, prepareSettings(settings));
};

class FakeWriter implements DeliveryWriter {
  batches: DeliveryRow[][] = [];
  failNext = 0;
  async record(_replica: string, rowsJson: string): Promise<void> {
    const rows = JSON.parse(rowsJson) as DeliveryRow[];
    await Promise.resolve();
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error('database unreachable');
    }
    this.batches.push([...rows]);
  }
  async reap(): Promise<number> {
    return Promise.resolve(0);
  }
}

function recorder(writer: FakeWriter, relations = 1): DeliveryRecorder {
  return new DeliveryRecorder({
    replica: '0123456789abcdef',
    writer,
    logger,
    flushMs: 1_000_000,
    relationsOf: () => relations,
  });
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

  it('splits large batches into chunks and reports its lag while events wait', async () => {
    const w = new FakeWriter();
    const r = new DeliveryRecorder({
      replica: '0123456789abcdef',
      writer: w,
      logger,
      flushMs: 1_000_000,
      relationsOf: () => 0,
      chunkRows: 100,
    });
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
    const r = new DeliveryRecorder({
      replica: '0123456789abcdef',
      writer: w,
      logger,
      flushMs: 100,
      relationsOf: () => 1,
    });
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

  it('holds a device only while it has events: quiet ones are forgotten after one to two reap intervals', async () => {
    const w = new FakeWriter();
    const r = new DeliveryRecorder({
      replica: '0123456789abcdef',
      writer: w,
      logger,
      flushMs: 1_000_000,
      relationsOf: () => 0,
      reapMs: 0,
    });
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
});
