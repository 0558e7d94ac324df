// What a replica does for the delivery record after its bus session is up again (design §3.8): while it was
// down another replica may have removed it from observed_by (delivery_reap, and since 0015 a registration
// that adds its own replica), and nothing but this replica's own report puts it back.

/** The recorder's part this needs (DeliveryRecorder). */
export interface RelationsSink {
  reportRelations(deviceIds: Iterable<string>): void;
}

/**
 * A bus resync's handler: reports this replica's relations at once, and once more `laterMs` later. A write of
 * another replica that read the live replicas before this session came up (once a call, from
 * pg_stat_activity) may still remove this replica after the first report, if it was waiting for a row lock
 * meanwhile; every such call has ended within a statement timeout, so `laterMs` is that plus a margin, and
 * the second report puts back what it removed (a cold review's race, design §3.8). One later report pending at
 * a time: a resync meanwhile moves it. The timer does not hold the process open, and a report after the
 * recorder stopped is ignored by it.
 */
export function relationsResync(
  sink: RelationsSink,
  observed: () => Iterable<string>,
  laterMs: number,
): { onSynchronised: () => void } {
  let again: NodeJS.Timeout | undefined;
  return {
    onSynchronised() {
      sink.reportRelations(observed());
      if (again !== undefined) clearTimeout(again);
      again = setTimeout(() => {
        again = undefined;
        sink.reportRelations(observed());
      }, laterMs);
      again.unref();
    },
  };
}
