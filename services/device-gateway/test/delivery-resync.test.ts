// After a bus resync a replica reports its relations to the delivery record at once and once more a statement
// timeout later (design §3.8): a write of another replica that read the live replicas before this one's bus
// session came up, and waited on a row lock meanwhile, may remove it after the first report.
import { describe, expect, it, jest } from '@jest/globals';
import { relationsResync } from '../src/delivery/resync.js';

describe('relationsResync', () => {
  it('reports at once and once more after laterMs; a resync meanwhile moves the second report', () => {
    jest.useFakeTimers();
    try {
      const reports: string[][] = [];
      let observed = ['d1', 'd2'];
      const r = relationsResync({ reportRelations: (ids) => reports.push([...ids]) }, () => observed, 5000);
      r.onSynchronised();
      expect(reports).toEqual([['d1', 'd2']]);
      jest.advanceTimersByTime(3000);
      observed = ['d2', 'd3'];
      // Another resync: reported at once, and its later report replaces the first one's.
      r.onSynchronised();
      expect(reports).toHaveLength(2);
      jest.advanceTimersByTime(4999);
      expect(reports).toHaveLength(2);
      jest.advanceTimersByTime(1);
      // The relations as they are then, not as they were at the resync.
      expect(reports).toEqual([
        ['d1', 'd2'],
        ['d2', 'd3'],
        ['d2', 'd3'],
      ]);
      jest.advanceTimersByTime(60_000);
      expect(reports).toHaveLength(3);
    } finally {
      jest.useRealTimers();
    }
  });
});
