import { Gauge, type Registry } from '@platform/service-kit';
import type { CoapServer } from './coap/server.js';
import type { GatewayState } from './domain/gateway-state.js';

/** CoAP and registry figures, read from the live objects at scrape time (no per-datagram metric cost). */
export function registerGatewayMetrics(registry: Registry, state: GatewayState, coap: CoapServer): void {
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
