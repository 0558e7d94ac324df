import { Gauge, type Registry } from '@platform/service-kit';
import type { ClusterBus } from './bus.js';

/** The replica bus, read at scrape time: listener up, and its counters since start. */
export function registerBusMetrics(registry: Registry, bus: ClusterBus): void {
  new Gauge({
    name: 'gateway_bus_listening',
    help: '1 while the LISTEN connection is up and synchronised, else 0',
    registers: [registry],
    collect() {
      this.set(bus.status === 'listening' ? 1 : 0);
    },
  });
  new Gauge({
    name: 'gateway_bus_events',
    help: 'Replica bus counters since start (received, published, applied, cleared, stale, malformed, refused, reconnects, resyncs, remoteReloads)',
    labelNames: ['event'],
    registers: [registry],
    collect() {
      const stats: Readonly<Record<string, number>> = { ...bus.stats };
      for (const [event, value] of Object.entries(stats)) this.set({ event }, value);
    },
  });
}
