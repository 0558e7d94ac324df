import { Counter, Gauge, Histogram, type Registry } from '@platform/service-kit';
import type { CoapServer } from './coap/server.js';
import type { GatewayState } from './domain/gateway-state.js';

/**
 * A Prometheus counter fed from a monotonic figure the CoAP server already keeps: at scrape time it adds
 * what grew since the last scrape, so the datagram path pays nothing for metrics.
 */
function counterFrom<L extends string>(
  registry: Registry,
  name: string,
  help: string,
  labelName: L,
  read: () => Record<string, number>,
): void {
  const seen = new Map<string, number>();
  new Counter({
    name,
    help,
    labelNames: [labelName],
    registers: [registry],
    collect() {
      for (const [value, total] of Object.entries(read())) {
        const delta = total - (seen.get(value) ?? 0);
        if (delta > 0) this.inc({ [labelName]: value } as Record<L, string>, delta);
        seen.set(value, total);
      }
    },
  });
}

/** Reload timings, observed by GatewayService. */
export interface ReloadMetrics {
  duration: Histogram<'outcome'>;
}

export function createReloadMetrics(registry: Registry): ReloadMetrics {
  return {
    duration: new Histogram({
      name: 'gateway_registry_reload_duration_seconds',
      help: 'Registry reloads (database read and swap), by outcome (ok, failed)',
      labelNames: ['outcome'],
      // A 100k-row reload takes about a second on 2 cores; a small registry milliseconds.
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [registry],
    }),
  };
}

/** CoAP and registry figures, read from the live objects at scrape time (no per-datagram metric cost). */
export function registerGatewayMetrics(registry: Registry, state: GatewayState, coap: CoapServer): void {
  counterFrom(
    registry,
    'gateway_coap_notifications_total',
    'Observe notifications by outcome: sent (datagrams, retransmissions excluded), send_error (the socket refused), unacknowledged (confirmable never ACKed: observer removed)',
    'outcome',
    () => ({
      sent: coap.stats.notifications,
      send_error: coap.stats.sendErrors,
      unacknowledged: coap.stats.observersRemovedByTimeout,
    }),
  );
  counterFrom(
    registry,
    'gateway_coap_malformed_datagrams_total',
    'Datagrams dropped as malformed (RST for a CON, silence for a NON), by reason',
    'reason',
    () => ({ ...coap.stats.malformedByReason }),
  );
  counterFrom(
    registry,
    'gateway_coap_registrations_refused_total',
    'Observe registrations refused, by cap: endpoint_cap (answered as a plain GET), address_cap and total_cap (answered 5.03 with Max-Age)',
    'reason',
    () => ({
      endpoint_cap: coap.stats.registrationsRefused,
      address_cap: coap.stats.registrationsOverAddressCap,
      total_cap: coap.stats.registrationsOverTotalCap,
    }),
  );
  counterFrom(
    registry,
    'gateway_coap_retransmissions_total',
    'Confirmable notifications sent again because their ACK did not arrive in time',
    'kind',
    () => ({ notification: coap.stats.retransmissions }),
  );
  new Gauge({
    name: 'gateway_registry_devices',
    help: 'Visible (enabled, valid) devices in the loaded registry',
    registers: [registry],
    collect() {
      this.set(state.deviceCount);
    },
  });
  new Gauge({
    name: 'gateway_coap_observers',
    help: 'Current CoAP observe relations',
    registers: [registry],
    collect() {
      this.set(coap.observerCount);
    },
  });
  new Gauge({
    name: 'gateway_coap_events',
    help: 'CoAP counters since start (datagrams, malformed, notifications, retransmissions, removals)',
    labelNames: ['event'],
    registers: [registry],
    collect() {
      const s = coap.stats;
      for (const [event, value] of Object.entries(s)) {
        if (typeof value === 'number') this.set({ event }, value);
      }
      for (const [reason, value] of Object.entries(s.malformedByReason))
        this.set({ event: `malformed_${reason}` }, value);
    },
  });
}
