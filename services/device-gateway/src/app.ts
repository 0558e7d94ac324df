import { validateDesiredSettings } from '@platform/contracts';
import {
  addRoutes,
  createHttpApp,
  finishHttpApp,
  metricsHandler,
  type Logger,
  type Registry,
  type SecretSet,
} from '@platform/service-kit';
import type { Express } from 'express';
import type { Kysely } from 'kysely';
import { ClusterBus } from './cluster/bus.js';
import { registerBusMetrics } from './cluster/metrics.js';
import { DtlsTransport } from './coap/dtls-transport.js';
import { CoapServer } from './coap/server.js';
import { maxDocumentBytes } from './coap/wire.js';
import { servesCoaps, servesPlainCoap, type GatewayConfig } from './config.js';
import type { GatewayDatabase } from './db/tables.js';
import { GatewayState } from './domain/gateway-state.js';
import { CredentialStore } from './domain/credentials.js';
import { VersionClock } from './domain/version-clock.js';
import { DtlsServer } from './dtls/index.js';
import { requireApiKey } from './http/auth.js';
import { gatewayRoutes } from './http/routes.js';
import { createReloadMetrics, registerDtlsMetrics, registerGatewayMetrics } from './metrics.js';
import { RegistryLoader } from './registry-loader.js';
import { GatewayService } from './service.js';

export interface GatewayDeps {
  config: GatewayConfig;
  logger: Logger;
  /** Kysely over the read-only login. */
  db: Kysely<GatewayDatabase>;
  /** Current API keys; a function so SIGHUP can swap them. */
  apiKeys: () => SecretSet;
  metrics?: Registry;
  clock?: VersionClock;
}

export interface GatewayApp {
  http: Express;
  coap: CoapServer;
  /** The coaps endpoint's DTLS server; undefined when GATEWAY_COAP_SECURITY is `plain`. */
  dtls: DtlsServer | undefined;
  state: GatewayState;
  service: GatewayService;
  /**
   * The replica bus (design §3.6), unless GATEWAY_CLUSTER_BUS=false: overrides and requested reloads go through
   * it from the start; it listens once `bus.start()` is called (main.ts).
   */
  bus: ClusterBus | undefined;
}

/** Wires the gateway without listening: tests drive `http` with supertest and bind `coap` to a free port. */
export function buildApp(deps: GatewayDeps): GatewayApp {
  const { config, logger } = deps;
  const clock = deps.clock ?? new VersionClock();
  const state = new GatewayState({
    clock,
    maxDocumentBytes: maxDocumentBytes(config.COAP_MAX_TOKEN_LENGTH),
    validateSettings: validateDesiredSettings,
  });
  // Device keys (design §3.5): loaded with the registry by every reload; the DTLS server looks identities up here
  // at the moment of each handshake, so an expired key is refused even before the next reload.
  const credentials = new CredentialStore();
  const dtls = servesCoaps(config)
    ? new DtlsServer({
        lookupPsk: credentials.lookupPsk,
        logger: logger.child({ component: 'dtls' }),
        maxSessions: config.DTLS_MAX_SESSIONS,
        maxSessionsPerAddress: config.DTLS_MAX_SESSIONS_PER_ADDRESS,
        maxHandshakes: config.DTLS_MAX_HANDSHAKES,
        handshakeTimeoutMs: config.DTLS_HANDSHAKE_TIMEOUT_MS,
        idleTimeoutMs: config.DTLS_IDLE_TIMEOUT_S * 1000,
        socketBufferBytes: config.COAP_SOCKET_BUFFER_BYTES,
      })
    : undefined;
  const coap = new CoapServer(
    state,
    {
      logger: logger.child({ component: 'coap' }),
      maxTokenLength: config.COAP_MAX_TOKEN_LENGTH,
      socketBufferBytes: config.COAP_SOCKET_BUFFER_BYTES,
      ackTimeoutMs: config.COAP_ACK_TIMEOUT_MS,
      ackRandomFactor: 1.5,
      maxRetransmit: config.COAP_MAX_RETRANSMIT,
      confirmableRefreshMs: config.COAP_CONFIRMABLE_REFRESH_S * 1000,
      maxAgeS: config.COAP_MAX_AGE_S,
      fanoutChunk: config.COAP_FANOUT_CHUNK,
      maxInflight: config.COAP_MAX_INFLIGHT,
      maxRelationsPerEndpoint: config.COAP_MAX_RELATIONS_PER_ENDPOINT,
      maxRelations: config.COAP_MAX_RELATIONS,
      maxRelationsPerAddress: config.COAP_MAX_RELATIONS_PER_ADDRESS,
      relationRetryAfterS: config.COAP_RELATION_RETRY_AFTER_S,
    },
    {
      plain: servesPlainCoap(config),
      transports:
        dtls === undefined
          ? []
          : [
              {
                transport: new DtlsTransport(dtls),
                port: config.GATEWAY_COAPS_PORT,
                host: config.GATEWAY_COAP_HOST,
              },
            ],
    },
  );
  const registry = new RegistryLoader({
    db: deps.db,
    state,
    logger,
    credentials,
    ...(deps.metrics === undefined ? {} : { reloadMetrics: createReloadMetrics(deps.metrics) }),
  });
  if (dtls !== undefined) {
    // A revoked, deleted or expired key ends its sessions at once (close_notify), and with them their Observe
    // relations (DtlsTransport reports each ended session to the message layer).
    registry.onCredentialsChanged((invalidated) => {
      const ids = new Set(invalidated);
      const ended = dtls.endSessions((session) => ids.has(session.credentialId), 'revoked');
      if (ended > 0) logger.info('dtls sessions ended: key no longer valid', { sessions: ended });
    });
  }
  const bus = config.GATEWAY_CLUSTER_BUS
    ? new ClusterBus({
        databaseUrl: config.DATABASE_URL,
        db: deps.db,
        state,
        registry,
        clock,
        validateSettings: validateDesiredSettings,
        logger,
        reconnectMinMs: config.GATEWAY_BUS_RECONNECT_MIN_MS,
        reconnectMaxMs: config.GATEWAY_BUS_RECONNECT_MAX_MS,
        heartbeatMs: config.GATEWAY_BUS_HEARTBEAT_MS,
      })
    : undefined;
  const service = new GatewayService({
    config,
    state,
    coap,
    apiKeys: deps.apiKeys,
    registry,
    ...(bus === undefined ? {} : { cluster: bus }),
  });
  const apiKey = requireApiKey(deps.apiKeys);
  const http = createHttpApp({
    logger,
    trustProxy: config.GATEWAY_TRUST_PROXY,
    ...(deps.metrics === undefined ? {} : { metrics: deps.metrics }),
  });
  addRoutes(http, gatewayRoutes(service, apiKey));
  if (deps.metrics !== undefined) {
    registerGatewayMetrics(deps.metrics, state, coap, { maxRelations: config.COAP_MAX_RELATIONS });
    if (dtls !== undefined)
      registerDtlsMetrics(deps.metrics, dtls, {
        maxSessions: config.DTLS_MAX_SESSIONS,
        maxHandshakes: config.DTLS_MAX_HANDSHAKES,
      });
    if (bus !== undefined) registerBusMetrics(deps.metrics, bus);
    addRoutes(http, [{ method: 'GET', path: '/metrics', handler: metricsHandler(deps.metrics) }]);
  }
  finishHttpApp(http, logger);
  return { http, coap, dtls, state, service, bus };
}
