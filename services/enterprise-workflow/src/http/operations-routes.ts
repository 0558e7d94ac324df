// Liveness, readiness and metrics, with their entries in the API document.
import { healthResponseSchema, readyResponseSchema } from '@platform/contracts';
import { metricsHandler } from '@platform/service-kit';
import type { RouteDefinition } from '@platform/service-kit';
import type { WorkflowContext } from '../domain/context.js';
import { ERRORS } from '../domain/errors.js';
import { handle } from './request-parts.js';

export function operationsRoutes(
  ctx: WorkflowContext,
  checkReady: () => Promise<Record<string, 'ok' | 'failed'>>,
): RouteDefinition[] {
  return [
    {
      method: 'GET',
      path: '/health',
      // Liveness: the process answers; no dependency is called (a database outage must not restart pods).
      handler: (_req, res) => {
        res.json({ status: 'ok' });
      },
      doc: {
        tags: ['operations'],
        operationId: 'health',
        summary: 'Liveness (calls no dependency)',
        responses: { 200: { description: 'The process serves requests.', schema: healthResponseSchema } },
      },
    },
    {
      method: 'GET',
      path: '/ready',
      handler: handle(async (_req, res) => {
        const checks = await checkReady();
        const failed = Object.entries(checks)
          .filter(([, state]) => state !== 'ok')
          .map(([name]) => name);
        if (failed.length > 0) throw ERRORS.notReady(failed);
        res.json({ status: 'ready', checks });
      }),
      doc: {
        tags: ['operations'],
        operationId: 'ready',
        summary: 'Readiness (database reachable, token signing keys loaded)',
        responses: { 200: { description: 'Ready to serve.', schema: readyResponseSchema } },
        errors: ['not_ready'],
      },
    },
    ...(ctx.metrics === undefined
      ? []
      : [
          {
            method: 'GET',
            path: '/metrics',
            handler: metricsHandler(ctx.metrics),
            doc: {
              tags: ['operations'],
              operationId: 'metrics',
              summary: 'Prometheus metrics (text exposition format)',
              responses: {
                200: { description: 'Metrics.', schema: { type: 'string' }, contentType: 'text/plain' },
              },
            },
          } satisfies RouteDefinition,
        ]),
  ];
}
