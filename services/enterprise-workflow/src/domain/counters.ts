// Business counters of the workflow (docs/operations.md section 5 explains them), on the service registry.
import { Counter } from '@platform/service-kit';
import type { Registry } from '@platform/service-kit';

export interface WorkflowMetrics {
  intents: Counter<'content_kind'>;
  decisions: Counter<'decision' | 'outcome'>;
  webhookRecords: Counter<'outcome'>;
  multipart: Counter<'outcome'>;
}

/** Outcomes of the sweep of expired uploads in parts (design §4.4); it runs beside the HTTP app. */
export function createSweepMetrics(registry: Registry | undefined): Counter<'outcome'> {
  return new Counter({
    name: 'workflow_multipart_sweep_total',
    help: 'Uploads in parts handled by the sweep, by outcome (abandoned, completed, orphaned, failed).',
    labelNames: ['outcome'],
    registers: registry === undefined ? [] : [registry],
  });
}

/** Counters registered on `registry`, or unregistered ones when metrics are off (tests). */
export function createWorkflowMetrics(registry: Registry | undefined): WorkflowMetrics {
  const registers = registry === undefined ? [] : [registry];
  return {
    intents: new Counter({
      name: 'workflow_upload_intents_total',
      help: 'Upload intents created, by content kind (image, video).',
      labelNames: ['content_kind'],
      registers,
    }),
    decisions: new Counter({
      name: 'workflow_decisions_total',
      help: 'Work-item decisions answered, by decision and outcome (transition, unchanged, conflict, replayed).',
      labelNames: ['decision', 'outcome'],
      registers,
    }),
    webhookRecords: new Counter({
      name: 'workflow_webhook_records_total',
      help: 'Object-store event records handled, by outcome (available, rejected, duplicate, unknown_key, ignored).',
      labelNames: ['outcome'],
      registers,
    }),
    multipart: new Counter({
      name: 'workflow_multipart_uploads_total',
      help: 'Uploads in parts, by outcome (planned, completed, aborted).',
      labelNames: ['outcome'],
      registers,
    }),
  };
}
