// The report writer's queue (src/delivery/reports.ts) around a batch writer the test controls: reports that
// arrive while a call runs go in the next one, each is answered with its own row's result, a call that fails or
// outlives the deadline answers its reports 5.03 (`unavailable`), and a full queue refuses at once. The SQL
// behind the real batch writer is tested on PostgreSQL (device-word-reports.test.ts).
import { describe, expect, it } from '@jest/globals';
import { createLogger } from '@platform/service-kit';
import type { DeviceReport, ReportResult } from '../src/coap/report-resource.js';
import { ReportWriter, type ReportRow } from '../src/delivery/reports.js';

const logger = createLogger({ service: 'device-word-writer-test', level: 'error' });
const report = (version: number): DeviceReport => ({
  version,
  outcome: 'applied',
  reason: null,
  settings: null,
});

/** A batch writer whose calls wait until the test settles them. */
function controlled() {
  const calls: { rows: readonly ReportRow[]; settle: (r: ReportResult[] | Error) => void }[] = [];
  const write = (rows: readonly ReportRow[]): Promise<ReportResult[]> =>
    new Promise((resolve, reject) => {
      calls.push({ rows, settle: (r) => (r instanceof Error ? reject(r) : resolve(r)) });
    });
  return { calls, write };
}

const local = (deviceId: string) =>
  deviceId === 'none' ? null : { version: 100, content: '0123456789abcdef' };

describe('ReportWriter', () => {
  it('sends what arrives during a call in the next one, and answers each report with its row', async () => {
    const { calls, write } = controlled();
    const writer = new ReportWriter({ write, local, logger, maxBatch: 3 });
    const first = writer.report('a', report(1), 'plain');
    expect(calls).toHaveLength(1);
    const rest = ['b', 'c', 'none', 'e'].map((d, i) => writer.report(d, report(i + 2), 'dtls'));
    // One call at a time: the four wait for the first.
    expect(calls).toHaveLength(1);
    calls[0]!.settle(['recorded']);
    await expect(first).resolves.toBe('recorded');
    expect(calls).toHaveLength(2);
    expect(calls[1]!.rows.map((r) => r.deviceId)).toEqual(['b', 'c', 'none']);
    expect(calls[1]!.rows[2]).toMatchObject({ localVersion: null, localContent: null, transport: 'dtls' });
    expect(calls[1]!.rows[0]).toMatchObject({ localVersion: 100, localContent: '0123456789abcdef' });
    calls[1]!.settle(['older', 'not_issued', 'unknown']);
    await expect(Promise.all(rest.slice(0, 3))).resolves.toEqual(['older', 'not_issued', 'unknown']);
    calls[2]!.settle(['recorded']);
    await expect(rest[3]).resolves.toBe('recorded');
  });

  it('answers unavailable when the call fails or outlives the deadline, and when the queue is full', async () => {
    const { calls, write } = controlled();
    const writer = new ReportWriter({ write, local, logger, deadlineMs: 200, maxQueued: 2 });
    const failed = writer.report('a', report(1), 'plain');
    calls[0]!.settle(new Error('connection lost'));
    await expect(failed).resolves.toBe('unavailable');
    const slow = writer.report('b', report(2), 'plain');
    await expect(slow).resolves.toBe('unavailable');
    // Its call answering late changes nothing for it; the writer is free once that call has ended.
    calls[1]!.settle(['recorded']);
    await new Promise((r) => setImmediate(r));
    const busy = writer.report('c', report(3), 'plain');
    expect(calls[2]!.rows.map((r) => r.deviceId)).toEqual(['c']);
    // The call is busy: two wait, a third is refused at once.
    const waiting = [writer.report('d', report(4), 'plain'), writer.report('e', report(5), 'plain')];
    await expect(writer.report('f', report(6), 'plain')).resolves.toBe('unavailable');
    // Stopped: what waits is answered at once; the call in flight still answers its own.
    writer.stop();
    await expect(Promise.all(waiting)).resolves.toEqual(['unavailable', 'unavailable']);
    calls[2]!.settle(['recorded']);
    await expect(busy).resolves.toBe('recorded');
    await expect(writer.report('g', report(7), 'plain')).resolves.toBe('unavailable');
  });
});
