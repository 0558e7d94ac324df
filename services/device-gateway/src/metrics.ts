import { Counter, Gauge, Histogram, type Registry } from '@platform/service-kit';
import type { CoapServer } from './coap/server.js';
import type { GatewayState } from './domain/gateway-state.js';
import type { DatabaseClock } from './delivery/db-clock.js';
import type { DeliveryRecorder } from './delivery/recorder.js';
import type { DtlsServer } from './dtls/index.js';
import type { AssignmentSync } from './rollout/assignments.js';
import type { RolloutDriver } from './rollout/driver.js';

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
export function registerGatewayMetrics(
  registry: Registry,
  state: GatewayState,
  coap: CoapServer,
  limits?: { maxRelations: number },
): void {
  if (limits !== undefined)
    new Gauge({
      name: 'gateway_coap_max_relations',
      help: 'Cap on Observe relations in all (COAP_MAX_RELATIONS), held apart to each peer of gateway_coap_relations (authenticated, unauthenticated); registrations over it get 5.03',
      registers: [registry],
      collect() {
        this.set(limits.maxRelations);
      },
    });
  counterFrom(
    registry,
    'gateway_coap_notifications_total',
    'Observe notifications by outcome: sent (datagrams, retransmissions excluded), send_error (the socket refused), acknowledged (a confirmable one ACKed), unacknowledged (a confirmable one timed out: never ACKed, observer removed)',
    'outcome',
    () => ({
      sent: coap.stats.notifications,
      send_error: coap.stats.sendErrors,
      acknowledged: coap.stats.notificationsAcknowledged,
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
    'gateway_coap_reports_total',
    "Devices' reports (/devices/{id}/reported) by answer: recorded and older (2.04), not_issued (4.09), malformed (4.00), too_large (4.13), content_format (4.15), forbidden (4.01), not_found and unknown_device (4.04), unknown and unavailable (5.03, retry), disabled (5.01)",
    'result',
    () => ({ ...coap.stats.reportsByResult }),
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
    name: 'gateway_coap_relations',
    help: 'Current CoAP observe relations by peer: authenticated (DTLS sessions) and unauthenticated (plain CoAP), each capped apart by COAP_MAX_RELATIONS',
    labelNames: ['peer'],
    registers: [registry],
    collect() {
      const counts = coap.observerCounts;
      this.set({ peer: 'authenticated' }, counts.authenticated);
      this.set({ peer: 'unauthenticated' }, counts.unauthenticated);
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

/**
 * The coaps endpoint (design §3.5): handshakes, refusals, dropped records, sessions and limits. Nothing here
 * carries an identity or key; the counters are read from the DTLS server at scrape time.
 */
export function registerDtlsMetrics(
  registry: Registry,
  dtls: DtlsServer,
  limits: { maxSessions: number; maxHandshakes: number },
): void {
  const s = dtls.stats;
  counterFrom(registry, 'gateway_dtls_handshakes_total', 'DTLS handshakes by outcome', 'outcome', () => ({
    started: s.handshakesStarted,
    completed: s.handshakesCompleted,
  }));
  counterFrom(
    registry,
    'gateway_dtls_handshake_failures_total',
    'DTLS handshakes that failed, by reason (decrypt_error: unknown identity or wrong key, alike)',
    'reason',
    () => ({ ...s.handshakeFailures }),
  );
  counterFrom(
    registry,
    'gateway_dtls_cookies_total',
    'HelloVerifyRequests sent (stateless cookie exchange) and ClientHellos with a wrong or expired cookie',
    'kind',
    () => ({ sent: s.cookiesSent, bad: s.badCookies }),
  );
  counterFrom(
    registry,
    'gateway_dtls_records_dropped_total',
    'DTLS records dropped silently, by reason (mac: failed authentication, replay, epoch, malformed …)',
    'reason',
    () => ({ ...s.recordsDropped }),
  );
  counterFrom(
    registry,
    'gateway_dtls_limit_rejections_total',
    'Cookie-verified ClientHellos refused by a handshake limit (none while a full table can evict; see handshake_failures_total{reason="evicted"})',
    'limit',
    () => ({ ...s.limitRejections }),
  );
  counterFrom(
    registry,
    'gateway_dtls_sessions_ended_total',
    'DTLS sessions ended, by reason (close_notify, idle, replaced, revoked, evicted: a session cap made room for a newer one, fatal_alert, server_close)',
    'reason',
    () => ({ ...s.sessionsEnded }),
  );
  counterFrom(registry, 'gateway_dtls_alerts_sent_total', 'DTLS alerts sent, by alert', 'alert', () => ({
    ...s.alertsSent,
  }));
  counterFrom(
    registry,
    'gateway_dtls_errors_total',
    'DTLS internal, callback and send errors',
    'kind',
    () => ({
      internal: s.internalErrors,
      callback: s.callbackErrors,
      send: s.sendErrors,
    }),
  );
  new Gauge({
    name: 'gateway_dtls_sessions',
    help: 'Established DTLS sessions, and handshakes in progress',
    labelNames: ['state'],
    registers: [registry],
    collect() {
      const snapshot = dtls.snapshot();
      this.set({ state: 'established' }, snapshot.sessions);
      this.set({ state: 'handshaking' }, snapshot.handshakes);
    },
  });
  new Gauge({
    name: 'gateway_dtls_limits',
    help: 'Configured DTLS limits (DTLS_MAX_SESSIONS, DTLS_MAX_HANDSHAKES)',
    labelNames: ['limit'],
    registers: [registry],
    collect() {
      this.set({ limit: 'sessions' }, limits.maxSessions);
      this.set({ limit: 'handshakes' }, limits.maxHandshakes);
    },
  });
}

/** The delivery record's writer (design §3.8): its lag, and what its batches wrote. */
export function registerDeliveryMetrics(
  registry: Registry,
  delivery: DeliveryRecorder,
  clock?: DatabaseClock,
): void {
  if (clock !== undefined)
    new Gauge({
      name: 'gateway_clock_ahead_seconds',
      help: "This replica's clock minus the database's, as last measured (delivery events are dated on the database's)",
      registers: [registry],
      collect() {
        const m = clock.measurement;
        if (m !== undefined) this.set(-m.offsetMs / 1000);
      },
    });
  new Gauge({
    name: 'gateway_delivery_record_lag_seconds',
    help: 'Age of the oldest delivery event (sent, acknowledged, heard, relations) not yet written to PostgreSQL',
    registers: [registry],
    collect() {
      this.set(delivery.lagSeconds());
    },
  });
  counterFrom(
    registry,
    'gateway_delivery_record_writes_total',
    'Delivery record batches: rows written, flushes, failed flushes (retried at the next tick)',
    'kind',
    () => ({ rows: delivery.stats.rows, flushes: delivery.stats.flushes, failures: delivery.stats.failures }),
  );
}

/** Staged rollouts (design §3.9): the driver's work, the assignments served here, and open rollouts. */
export function registerRolloutMetrics(
  registry: Registry,
  driver: RolloutDriver,
  assignments: AssignmentSync,
  state: GatewayState,
): void {
  new Gauge({
    name: 'gateway_rollout_driver',
    help: '1 while this replica holds the rollout driver lease',
    registers: [registry],
    collect() {
      this.set(driver.isDriver ? 1 : 0);
    },
  });
  counterFrom(
    registry,
    'gateway_rollout_driver_total',
    'Rollout driver: steps run, devices assigned, failed steps, terms begun (lease taken) on this replica',
    'kind',
    () => ({
      steps: driver.stats.steps,
      assigned: driver.stats.assigned,
      failures: driver.stats.failures,
      terms: driver.stats.terms,
    }),
  );
  new Gauge({
    name: 'gateway_rollout_assignments',
    help: 'Rollout assignments this replica holds (served unless a development override wins)',
    registers: [registry],
    collect() {
      this.set(state.assignmentCount);
    },
  });
  counterFrom(
    registry,
    'gateway_rollout_assignment_reads_total',
    'Rollout assignment reads: reads, documents changed, assignments refused, failed reads',
    'kind',
    () => ({
      reads: assignments.stats.reads,
      applied: assignments.stats.applied,
      refused: assignments.stats.refused,
      failures: assignments.stats.failures,
    }),
  );
  new Gauge({
    name: 'gateway_rollouts',
    help: 'Open rollouts by state, as the driver last read them (reported by the driver replica only)',
    labelNames: ['state'],
    registers: [registry],
    collect() {
      this.reset();
      if (!driver.isDriver) return;
      const by = { active: 0, paused: 0 } as Record<string, number>;
      for (const c of driver.counts) by[c.state] = (by[c.state] ?? 0) + c.n;
      for (const [s, n] of Object.entries(by)) this.set({ state: s }, n);
    },
  });
  new Gauge({
    name: 'gateway_rollouts_aborted',
    help: 'Rollouts paused by their abort criterion and not resumed, cancelled or rolled back (driver replica only)',
    registers: [registry],
    collect() {
      this.set(driver.counts.filter((c) => c.aborted && c.state === 'paused').reduce((n, c) => n + c.n, 0));
    },
  });
}
