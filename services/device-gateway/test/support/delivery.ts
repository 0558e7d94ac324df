// Delivery rows as objects, for tests that write the record directly (the recorder sends them as JSON text).
import type { DeliveryRow, DeliveryWriter } from '../../src/delivery/recorder.js';

export const recordRows = (
  writer: DeliveryWriter,
  replica: string,
  rows: readonly DeliveryRow[],
): Promise<void> => writer.record(replica, JSON.stringify(rows));
