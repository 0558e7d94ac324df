import { validateDesiredSettings } from '@platform/contracts';
import {
  addRoutes,
  createDb,
  createHttpApp,
  finishHttpApp,
  metricsHandler,
  type Logger,
  type Registry,
  type SecretSet,
} from '@platform/service-kit';
import type { Express } from 'express';
import type { Kysely } from 'kysely';
import { ClusterBus, newReplicaId } from './cluster/bus.js';
import { Inspector, ownPart, type LocalView } from './cluster/inspect.js';
import { registerBusMetrics } from './cluster/metrics.js';
import { DtlsTransport } from './coap/dtls-transport.js';
import { CoapServer } from './coap/server.js';
import { maxDocumentBytes } from './coap/representations.js';
import { servesCoaps, servesPlainCoap, type GatewayConfig } from './config.js';
import type { GatewayDatabase } from './db/tables.js';
import { GatewayState } from './domain/gateway-state.js';
import { CredentialStore } from './domain/credentials.js';
import { VersionClock } from './domain/version-clock.js';
import { DtlsServer } from './dtls/index.js';
import { requirePrincipal } from './http/auth.js';
import { auditRoutes } from './http/audit-routes.js';
import { AuditQueue } from './audit/queue.js';
import { CursorSeal } from './http/cursor-seal.js';
import { apiKeyStep } from './http/route-parts.js';
import { createOperationsTokenVerifier } from './auth/tokens.js';
import { gatewayRoutes } from './http/routes.js';
import { overrideRoutes } from './http/override-routes.js';
import {
  createReloadMetrics,
  registerDeliveryMetrics,
  registerDtlsMetrics,
  registerGatewayMetrics,
  registerRolloutMetrics,
} from './metrics.js';
import { DeliveryRecorder, UNAUTHENTICATED_ONLY, type DeliveryWriter } from './delivery/recorder.js';
import { DatabaseClock } from './delivery/db-clock.js';
import { ReportWriter, reportBatchWriter } from './delivery/reports.js';
import { deliveryWriter, inspectStore } from './delivery/sql.js';
import { relationsResync } from './delivery/resync.js';
import { RegistryLoader } from './registry-loader.js';
import { AssignmentSync } from './rollout/assignments.js';
import { RolloutDriver } from './rollout/driver.js';
import { RolloutService } from './rollout/service.js';
import { GatewayService } from './service.js';
import { Turns } from './deadline.js';

export interface GatewayDeps {
  config: GatewayConfig;
  logger: Logger;
  /** Kysely over the read-only login. */
  db: Kysely<GatewayDatabase>;
  /** Current API keys; a function so SIGHUP can swap them. */
  apiKeys: () => SecretSet;
  metrics?: Registry;
  clock?: VersionClock;
  /** Where the delivery record's batches go (default: PostgreSQL through `db`); bench:gateway replaces it. */
  deliveryWriter?: DeliveryWriter;
  /** This host's wall clock (ms since the epoch), as the comparison with the database's reads it; tests skew it. */
  wallClock?: () => number;
}

export interface GatewayApp {
  http: Express;
  coap: CoapServer;
  /** The coaps endpoint's DTLS server; undefined when GATEWAY_COAP_SECURITY is `plain`. */
  dtls: DtlsServer | undefined;
  state: GatewayState;
  /** The registry and its device keys, loaded from PostgreSQL (design §3.2, §3.5). */
  registry: RegistryLoader;
  service: GatewayService;
  /**
   * The replica bus (design §3.6), unless GATEWAY_CLUSTER_BUS=false: overrides and requested reloads go through
   * it from the start; it listens once `bus.start()` is called (main.ts).
   */
  bus: ClusterBus | undefined;
  /** The delivery record's writer (design §3.8), unless GATEWAY_DELIVERY_RECORD=false; main.ts starts it. */
  delivery: DeliveryRecorder | undefined;
  /**
   * The database's clock as this replica measures it (design §3.8): what the delivery record's times are dated on,
   * and a readiness condition. Started and stopped with `delivery`.
   */
  dbClock: DatabaseClock | undefined;
  /** This replica's id: the bus origin, and the replica the delivery record names. */
  replicaId: string;
  /**
   * Staged rollouts (design §3.9): the assignments this replica serves (read from the database) and the driver
   * loop (main.ts starts it unless GATEWAY_ROLLOUT_DRIVER=false).
   */
  rollouts: { assignments: AssignmentSync; driver: RolloutDriver; service: RolloutService };
  /** The batched audit rows of notifies and clears (flushed at shutdown). */
  audit: AuditQueue;
  /** Devices' reports waiting for the record (design §3.8), unless GATEWAY_DELIVERY_RECORD=false; stopped at shutdown. */
  reports: ReportWriter | undefined;
}

/** Wires the gateway without listening: tests drive `http` with supertest and bind `coap` to a free port. */
export function buildApp(deps: GatewayDeps): GatewayApp {
  const { config, logger } = deps;
  const clock = deps.clock ?? new VersionClock();
  const state = new GatewayState({
    clock,
    maxDocumentBytes: maxDocumentBytes(config.coap.maxTokenLength),
    validateSettings: validateDesiredSettings,
  });
  // Device keys (design §3.5): loaded with the registry by every reload; the DTLS server looks identities up here
  // at the moment of each handshake, so an expired key is refused even before the next reload.
  const credentials = new CredentialStore();
  const dtls = servesCoaps(config)
    ? new DtlsServer({
        lookupPsk: credentials.lookupPsk,
        logger: logger.child({ component: 'dtls' }),
        maxSessions: config.dtls.maxSessions,
        maxSessionsPerAddress: config.dtls.maxSessionsPerAddress,
        maxSessionsPerCredential: config.dtls.maxSessionsPerCredential,
        maxHandshakes: config.dtls.maxHandshakes,
        maxHandshakesPerAddress: config.dtls.maxHandshakesPerAddress,
        handshakeTimeoutMs: config.dtls.handshakeTimeoutMs,
        unauthenticatedTimeoutMs: config.dtls.unauthenticatedTimeoutMs,
        credentialCheckIntervalMs: config.dtls.credentialCheckIntervalS * 1000,
        idleTimeoutMs: config.dtls.idleTimeoutS * 1000,
        socketBufferBytes: config.coap.socketBufferBytes,
      })
    : undefined;
  const coap = new CoapServer(
    state,
    {
      logger: logger.child({ component: 'coap' }),
      maxTokenLength: config.coap.maxTokenLength,
      socketBufferBytes: config.coap.socketBufferBytes,
      ackTimeoutMs: config.coap.ackTimeoutMs,
      ackRandomFactor: 1.5,
      maxRetransmit: config.coap.maxRetransmit,
      confirmableRefreshMs: config.coap.confirmableRefreshS * 1000,
      maxAgeS: config.coap.maxAgeS,
      fanoutChunk: config.coap.fanoutChunk,
      maxInflight: config.coap.maxInflight,
      maxRelationsPerEndpoint: config.coap.maxRelationsPerEndpoint,
      maxRelations: config.coap.maxRelations,
      maxRelationsPerAddress: config.coap.maxRelationsPerAddress,
      relationRetryAfterS: config.coap.relationRetryAfterS,
    },
    {
      plain: servesPlainCoap(config),
      transports:
        dtls === undefined
          ? []
          : [
              {
                transport: new DtlsTransport(dtls),
                port: config.coap.coapsPort,
                host: config.coap.host,
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
    // relations (DtlsTransport reports each ended session to the message layer), and abandons its handshakes
    // in progress. The DTLS server also checks every session's key periodically, should an event be missed.
    registry.onCredentialsChanged((invalidated) => {
      const ended = dtls.invalidateCredentials(invalidated);
      if (ended > 0) logger.info('dtls sessions ended: key no longer valid', { sessions: ended });
    });
  }
  const replicaId = newReplicaId();
  // The device view's live part here (design §3.8): relations and DTLS sessions, never key material.
  const local: LocalView = (deviceId, limit) => {
    const { relations, total } = coap.relationsOf(deviceId, limit);
    const all = dtls?.sessionsOf(deviceId) ?? [];
    const sessions = all.slice(0, limit).map((v) => ({
      identity: v.identity,
      address: v.address,
      port: v.port,
      established_at: v.establishedAt,
      last_record_at: v.lastRecordAt,
    }));
    return {
      relations,
      relations_total: total,
      dtls_sessions: sessions,
      dtls_sessions_total: all.length,
    };
  };
  const inspector = config.cluster.enabled
    ? new Inspector({
        origin: replicaId,
        local,
        store: inspectStore(deps.db, logger.child({ component: 'device-view' })),
        deadlineMs: config.delivery.viewDeadlineMs,
        logger: logger.child({ component: 'device-view' }),
      })
    : undefined;
  // A device with a key speaks for itself over DTLS only (design §3.8): plain CoAP carries no identity.
  const dtlsOnly = (deviceId: string): boolean => dtls !== undefined && credentials.hasKeys(deviceId);
  const dbClock = config.delivery.enabled
    ? new DatabaseClock({
        db: deps.db,
        logger: logger.child({ component: 'clock' }),
        maxSkewMs: config.delivery.clockMaxSkewMs,
        ...(deps.wallClock === undefined ? {} : { wallNow: deps.wallClock }),
      })
    : undefined;
  const delivery = config.delivery.enabled
    ? new DeliveryRecorder({
        replica: replicaId,
        writer: deps.deliveryWriter ?? deliveryWriter(deps.db),
        logger: logger.child({ component: 'delivery' }),
        flushMs: config.delivery.flushMs,
        writers: config.delivery.writers,
        relationsOf: (deviceId) => {
          if (!dtlsOnly(deviceId)) return coap.settingsRelationsOf(deviceId);
          const speaking = coap.settingsRelationsOf(deviceId, true);
          return speaking > 0 || coap.settingsRelationsOf(deviceId) === 0 ? speaking : UNAUTHENTICATED_ONLY;
        },
        trusts: (deviceId, transport) => transport === 'dtls' || !dtlsOnly(deviceId),
        ...(dbClock === undefined ? {} : { clock: dbClock }),
      })
    : undefined;
  if (delivery !== undefined) {
    coap.delivery = delivery;
    state.onSettings((record, doc, ref) => delivery.desired(record, doc, ref));
  }
  // Devices' reports (design §3.4, §3.8): written to the record as they come, answered once written.
  const reports = config.delivery.enabled
    ? new ReportWriter({
        write: reportBatchWriter(deps.db, replicaId, config.rollouts.recordLagMs),
        local: (deviceId) => {
          const doc = state.settingsDocument(deviceId);
          return doc === undefined ? null : { version: doc.version, content: doc.contentDigest };
        },
        logger: logger.child({ component: 'reports' }),
        // One call at a time (up to 2,000 reports each): the recorder's writers take up to DB_POOL_MAX - 1
        // connections, and the HTTP API and the bus must keep one (design §3.8).
        writers: 1,
      })
    : undefined;
  coap.reports = {
    sink: reports,
    trusts: (deviceId, transport) => transport === 'dtls' || !dtlsOnly(deviceId),
    known: (deviceId) => state.settingsDocument(deviceId) !== undefined,
  };
  // Rollouts (design §3.9): every replica serves the assignments from the database; one drives.
  const assignments = new AssignmentSync({
    db: deps.db,
    state,
    validateSettings: validateDesiredSettings,
    logger: logger.child({ component: 'rollouts' }),
  });
  const syncHere = (): Promise<void> => assignments.sync();
  // The lease belongs to a replica that is up (migration 0019): its bus session says so, or without the bus the
  // driver's own connection, one more than DB_POOL_MAX, named after the replica.
  const driverDb = config.cluster.enabled
    ? deps.db
    : createDb<GatewayDatabase>(config.database.url, {
        max: 1,
        applicationName: `device-gateway-driver ${replicaId}`,
        statementTimeoutMs: config.database.statementTimeoutMs,
        queryTimeoutMs: config.database.queryTimeoutMs,
        connectionTimeoutMs: config.database.connectionTimeoutMs,
        // Kept open between ticks (a tick is at most a third of the lease, the lease at most 60 s).
        idleTimeoutMs: 120_000,
        logger,
      });
  // A rollout's creation is one statement writing a row per target (design §3.9): on a connection of its own with
  // a statement timeout of its own (GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS), not the pool's, which a 60,000-device
  // creation outlived on a loaded machine (503). Creations run one at a time anyway (a table lock).
  const createDbPool = createDb<GatewayDatabase>(config.database.url, {
    max: 1,
    applicationName: 'device-gateway-rollout-create',
    statementTimeoutMs: config.rollouts.createTimeoutMs,
    queryTimeoutMs: config.rollouts.createTimeoutMs + 1000,
    connectionTimeoutMs: config.database.connectionTimeoutMs,
    idleTimeoutMs: 10_000,
    logger,
  });
  // The connections the rollouts opened besides the shared pool, closed when the driver stops (at shutdown).
  const ownPools = driverDb === deps.db ? [createDbPool] : [createDbPool, driverDb];
  const driver = new RolloutDriver({
    db: driverDb,
    closeDb: async () => {
      await Promise.all(ownPools.map((p) => p.destroy()));
    },
    replica: replicaId,
    logger: logger.child({ component: 'rollout-driver' }),
    leaseMs: config.rollouts.leaseMs,
    stepMs: config.rollouts.stepMs,
    maxAssign: config.rollouts.stepMax,
    recordLagMs: config.rollouts.recordLagMs,
    recordWaitMaxMs: config.rollouts.recordWaitMaxMs,
    // With the bus, the wake-up after the step (and every replica's timed read) tells every replica, this one included.
    ...(config.cluster.enabled ? {} : { onAssigned: () => assignments.receive() }),
  });
  const rollouts = new RolloutService({
    db: deps.db,
    createDb: createDbPool,
    state,
    afterChange: syncHere,
    wake: () => driver.wake(),
    minDeadlineMs: config.rollouts.recordLagMs,
    maxTargets: config.rollouts.maxTargets,
    logger: logger.child({ component: 'rollouts' }),
  });
  const resync =
    delivery === undefined
      ? undefined
      : relationsResync(delivery, () => coap.settingsObserved(), config.database.statementTimeoutMs + 1000);
  const bus = config.cluster.enabled
    ? new ClusterBus({
        origin: replicaId,
        ...(inspector === undefined ? {} : { inspector }),
        rollouts: assignments,
        // While this replica's bus session was down another one may have reaped it from observed_by: reported
        // again at once, and once more after any write that could still remove it has ended (resync.ts).
        ...(resync === undefined ? {} : { onSynchronised: resync.onSynchronised }),
        databaseUrl: config.database.url,
        db: deps.db,
        state,
        registry,
        clock,
        validateSettings: validateDesiredSettings,
        logger,
        reconnectMinMs: config.cluster.reconnectMinMs,
        reconnectMaxMs: config.cluster.reconnectMaxMs,
        heartbeatMs: config.cluster.heartbeatMs,
      })
    : undefined;
  const auditQueue = new AuditQueue(deps.db, logger.child({ component: 'audit' }), () => registry.sites);
  const cursors = new CursorSeal(deps.db);
  const service = new GatewayService({
    config,
    audit: auditQueue,
    state,
    coap,
    apiKeys: deps.apiKeys,
    registry,
    ...(bus === undefined ? {} : { cluster: bus }),
    ...(dbClock === undefined ? {} : { clock: dbClock }),
    db: deps.db,
    credentials: (deviceId) => credentials.summaryOf(deviceId, Date.now()),
    rollouts,
    replicas: async (deviceId) =>
      inspector === undefined ? [ownPart(replicaId, local, deviceId)] : inspector.gather(deviceId),
    // One at a time: a read takes about a millisecond, and views never hold more than one pooled connection.
    recordReads: new Turns(1),
    speaks: (deviceId, transport) => transport === 'dtls' || !dtlsOnly(deviceId),
    cursors,
  });
  // Keys and people's tokens (design §3.1, issue 42 §2); the route's role is checked in the same step.
  const apiKey = requirePrincipal({
    keys: deps.apiKeys,
    tokens: config.oidc === undefined ? undefined : createOperationsTokenVerifier(config.oidc),
    audit: auditQueue,
  });
  const http = createHttpApp({
    logger,
    trustProxy: config.http.trustProxy,
    ...(deps.metrics === undefined ? {} : { metrics: deps.metrics }),
  });
  addRoutes(http, gatewayRoutes(service, apiKey));
  addRoutes(http, auditRoutes({ db: deps.db, sites: () => registry.sites, cursors }, apiKeyStep(apiKey)));
  addRoutes(
    http,
    overrideRoutes(
      {
        state,
        bus,
        db: deps.db,
        sites: () => registry.sites,
        audit: auditQueue,
        refreshSites: () => void registry.refreshSites(),
      },
      apiKeyStep(apiKey),
    ),
  );
  if (deps.metrics !== undefined) {
    registerGatewayMetrics(deps.metrics, state, coap, { maxRelations: config.coap.maxRelations });
    if (dtls !== undefined)
      registerDtlsMetrics(deps.metrics, dtls, {
        maxSessions: config.dtls.maxSessions,
        maxHandshakes: config.dtls.maxHandshakes,
      });
    if (bus !== undefined) registerBusMetrics(deps.metrics, bus);
    if (delivery !== undefined) registerDeliveryMetrics(deps.metrics, delivery, dbClock);
    registerRolloutMetrics(deps.metrics, driver, assignments, state);
    addRoutes(http, [{ method: 'GET', path: '/metrics', handler: metricsHandler(deps.metrics) }]);
  }
  finishHttpApp(http, logger);
  return {
    http,
    coap,
    dtls,
    state,
    registry,
    service,
    bus,
    delivery,
    dbClock,
    replicaId,
    rollouts: { assignments, driver, service: rollouts },
    audit: auditQueue,
    reports,
  };
}
