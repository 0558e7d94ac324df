import { collectDefaultMetrics, Counter, Histogram, Registry } from 'prom-client';
import type { RequestHandler } from 'express';

export { Counter, Gauge, Histogram, Registry } from 'prom-client';

export interface MetricsOptions {
  /** Added as the `service` label on every series. */
  service: string;
  /** Skip Node's process metrics (CPU, heap, event-loop lag); on by default. */
  defaultMetrics?: boolean;
}

/** Request latency buckets in seconds: 5 ms … 10 s. */
const DURATION_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

type HttpLabel = 'method' | 'route' | 'status';

export interface HttpMetrics {
  requests: Counter<HttpLabel>;
  duration: Histogram<HttpLabel>;
}

/**
 * A registry with Node's default metrics and the HTTP series `createHttpApp` records:
 * `http_requests_total{method,route,status}` and `http_request_duration_seconds`.
 * Services register their own metrics on the same registry (`registers: [registry]`).
 */
export function createMetrics(options: MetricsOptions): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ service: options.service });
  if (options.defaultMetrics !== false) collectDefaultMetrics({ register: registry });
  httpMetrics(registry);
  return registry;
}

/** The HTTP series on `registry`, each registered on first use (so any Registry may be passed). */
export function httpMetrics(registry: Registry): HttpMetrics {
  const requests = registry.getSingleMetric('http_requests_total');
  const duration = registry.getSingleMetric('http_request_duration_seconds');
  return {
    requests:
      requests instanceof Counter
        ? requests
        : new Counter({
            name: 'http_requests_total',
            help: 'HTTP requests answered, by method, matched route pattern and status.',
            labelNames: ['method', 'route', 'status'],
            registers: [registry],
          }),
    duration:
      duration instanceof Histogram
        ? duration
        : new Histogram({
            name: 'http_request_duration_seconds',
            help: 'Time from receiving the request to finishing the response, in seconds.',
            labelNames: ['method', 'route', 'status'],
            buckets: DURATION_BUCKETS_S,
            registers: [registry],
          }),
  };
}

/** `GET /metrics` in the Prometheus text format. */
export function metricsHandler(registry: Registry): RequestHandler {
  return async (_req, res) => {
    const body = await registry.metrics();
    res.setHeader('Content-Type', registry.contentType);
    res.send(body);
  };
}
