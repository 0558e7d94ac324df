// Delivery rows as objects, for tests that write the record directly or read what the recorder sends (it sends
// them as columns: PostgreSQL array literals, the parameters of delivery_record_arrays, migration 0011).
import type { DeliveryRow, DeliveryWriter } from '../../src/delivery/recorder.js';
import { COLUMNS, type DeliveryBatch } from '../../src/delivery/row-builder.js';
import type { DeviceRecord } from '../../src/domain/documents.js';

type Key = (typeof COLUMNS)[number];
const TEXT: ReadonlySet<Key> = new Set<Key>(['d', 'ds', 'dc', 'sc', 'st', 'ac', 'at']);

/** An array literal's element: quoted (with backslash escapes) always, NULL for undefined. */
const element = (v: string | number | boolean | undefined): string =>
  v === undefined ? 'NULL' : `"${String(v).replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`;

/** Rows as the recorder's columns (a column no row carries is null, as the recorder sends it). */
export function toBatch(rows: readonly DeliveryRow[]): DeliveryBatch {
  return {
    rows: rows.length,
    columns: COLUMNS.map((k) =>
      k !== 'd' && rows.every((r) => r[k] === undefined)
        ? null
        : `{${rows.map((r) => element(r[k])).join(',')}}`,
    ),
  };
}

/** One array literal's elements (the recorder writes no element that needs escaping; quotes are removed). */
function elements(literal: string): (string | null)[] {
  const inner = literal.slice(1, -1);
  if (inner === '') return [];
  return inner.split(',').map((e) => (e === 'NULL' ? null : e.replace(/^"(.*)"$/, '$1')));
}

/** The recorder's columns as rows (what a fake writer checks). */
export function fromBatch(batch: DeliveryBatch): DeliveryRow[] {
  const rows: Record<string, unknown>[] = Array.from({ length: batch.rows }, () => ({}));
  COLUMNS.forEach((k, c) => {
    const literal = batch.columns[c];
    if (literal === null || literal === undefined) return;
    elements(literal).forEach((e, i) => {
      if (e === null) return;
      rows[i]![k] = TEXT.has(k) ? e : k === 'sk' ? e === 't' || e === 'true' : Number(e);
    });
  });
  return rows as unknown as DeliveryRow[];
}

export const recordRows = (
  writer: DeliveryWriter,
  replica: string,
  rows: readonly DeliveryRow[],
): Promise<void> => writer.record(replica, toBatch(rows));

/** A registry record of `deviceId` (one site, enabled, no settings of its own): what the recorder's tests feed it. */
export const record = (deviceId: string): DeviceRecord => ({
  deviceId,
  siteId: '11111111-1111-4111-8111-111111111111',
  name: 'n',
  model: 'm',
  enabled: true,
  desiredSettings: {},
});
