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
import { CoapServer } from './coap/server.js';
import { maxDocumentBytes } from './coap/wire.js';
import type { GatewayConfig } from './config.js';
import type { GatewayDatabase } from './db/tables.js';
import { GatewayState } from './domain/gateway-state.js';
import { VersionClock } from './domain/version-clock.js';
import { requireApiKey } from './http/auth.js';
import { gatewayRoutes, PUBLIC_PATHS } from './http/routes.js';
import { createReloadMetrics, registerGatewayMetrics } from './metrics.js';
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
  state: GatewayState;
  service: GatewayService;
  /** Inert until `service.useCluster(bus)` and `bus.start()` (main.ts does both unless GATEWAY_CLUSTER_BUS=false). */
  bus: ClusterBus;
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
  const coap = new CoapServer(state, {
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
  });
  const service = new GatewayService({
    config,
    db: deps.db,
    state,
    coap,
    apiKeys: deps.apiKeys,
    logger,
    ...(deps.metrics === undefined ? {} : { reloadMetrics: createReloadMetrics(deps.metrics) }),
  });
  const bus = new ClusterBus({
    databaseUrl: config.DATABASE_URL,
    db: deps.db,
    state,
    clock,
    reload: () => service.reload(),
    validateSettings: validateDesiredSettings,
    logger,
    reconnectMinMs: config.GATEWAY_BUS_RECONNECT_MIN_MS,
    reconnectMaxMs: config.GATEWAY_BUS_RECONNECT_MAX_MS,
    heartbeatMs: config.GATEWAY_BUS_HEARTBEAT_MS,
  });
  const apiKey = requireApiKey(deps.apiKeys);
  const http = createHttpApp({
    logger,
    trustProxy: config.GATEWAY_TRUST_PROXY,
    ...(deps.metrics === undefined ? {} : { metrics: deps.metrics }),
    // Every route but the public ones needs the key: check it before a body is read.
    authenticateBody: (req, res, next) => {
      if (PUBLIC_PATHS.has(req.path)) next();
      else apiKey(req, res, next);
    },
  });
  addRoutes(http, gatewayRoutes(service, apiKey));
  if (deps.metrics !== undefined) {
    registerGatewayMetrics(deps.metrics, state, coap);
    registerBusMetrics(deps.metrics, bus);
    addRoutes(http, [{ method: 'GET', path: '/metrics', handler: metricsHandler(deps.metrics) }]);
  }
  finishHttpApp(http, logger);
  return { http, coap, state, service, bus };
}
