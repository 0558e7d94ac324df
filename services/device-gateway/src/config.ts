import { userInfo } from 'node:os';
import {
  countNonBearerSecrets,
  databaseDeadlines,
  deepFreeze,
  loadConfig,
  LOG_LEVELS,
  readRegularFile,
  readSecretList,
  redactUrl,
  type SecretSet,
} from '@platform/service-kit';
import { ApiKeys, GatewayKeys, parseKeyFile } from './auth/api-keys.js';

export { ApiKeys, apiKeyFingerprint } from './auth/api-keys.js';

/** Every variable the gateway reads (design §5.1), validated once at boot; nothing else reads process.env. */
export const gatewayConfigSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['DATABASE_URL'],
  properties: {
    DATABASE_URL: {
      type: 'string',
      minLength: 1,
      writeOnly: true,
      description: 'read-only login (device_gateway_login)',
    },
    GATEWAY_HTTP_PORT: { type: 'integer', minimum: 0, maximum: 65535, default: 8080 },
    GATEWAY_HTTP_HOST: {
      type: 'string',
      minLength: 1,
      description: 'address the HTTP API listens on; default: every interface (npm start: 127.0.0.1)',
    },
    GATEWAY_COAP_PORT: { type: 'integer', minimum: 0, maximum: 65535, default: 5683 },
    GATEWAY_COAP_HOST: { type: 'string', default: '0.0.0.0' },
    GATEWAY_API_KEYS: { type: 'string', writeOnly: true, description: 'comma-separated API keys' },
    GATEWAY_API_KEYS_FILE: {
      type: 'string',
      description: 'file with API keys, one per line; re-read on SIGHUP',
    },
    GATEWAY_TRUST_PROXY: { type: 'boolean', default: false, description: 'trust exactly one proxy hop' },
    /**
     * People on /api (design §3.1): the platform realm's issuer (the tokens' `iss`). Unset: API keys only. The
     * tokens must be issued to GATEWAY_OIDC_CLIENT_ID and carry one of its roles (viewer, operator, admin).
     */
    GATEWAY_OIDC_ISSUER_URL: { type: 'string', format: 'uri' },
    /** Default: Keycloak's `{issuer}/protocol/openid-connect/certs`. */
    GATEWAY_OIDC_JWKS_URL: { type: 'string', format: 'uri' },
    GATEWAY_OIDC_CLIENT_ID: { type: 'string', minLength: 1, default: 'platform-operations' },
    /** Allowed clock skew for `exp`/`nbf`/`iat` (s). */
    GATEWAY_OIDC_CLOCK_TOLERANCE_S: { type: 'integer', minimum: 0, maximum: 300, default: 30 },
    /** A token claiming a longer life than this (s) is refused. */
    GATEWAY_OIDC_MAX_TOKEN_LIFETIME_S: { type: 'integer', minimum: 60, maximum: 86400, default: 3600 },
    /** Deadline of one JWKS fetch (ms); a request waiting on it gets 503 past it. */
    GATEWAY_OIDC_JWKS_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 60000, default: 5000 },
    /** A token under an unknown `kid` refetches the JWKS (a rotation) at most this often (ms). */
    GATEWAY_OIDC_JWKS_COOLDOWN_MS: { type: 'integer', minimum: 0, maximum: 600000, default: 30000 },
    LOG_LEVEL: { type: 'string', enum: LOG_LEVELS, default: 'info' },
    DB_POOL_MAX: { type: 'integer', minimum: 1, maximum: 50, default: 4 },
    /** Server-side bound on one statement (`statement_timeout`), ms. A 100,000-device reload reads in ~0.5 s. */
    DB_STATEMENT_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 600000, default: 4000 },
    /**
     * Client-side deadline of one statement, ms, above DB_STATEMENT_TIMEOUT_MS: ends the wait on a server that
     * stopped answering; the connection is discarded and the caller gets 503.
     */
    DB_QUERY_TIMEOUT_MS: { type: 'integer', minimum: 200, maximum: 600000, default: 5000 },
    /** Deadline for getting a pool connection (free, or newly opened and authenticated), ms. */
    DB_CONNECT_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 60000, default: 2000 },
    /** RFC 7252 ACK_TIMEOUT (ms) and MAX_RETRANSMIT. */
    COAP_ACK_TIMEOUT_MS: { type: 'integer', minimum: 10, maximum: 60000, default: 2000 },
    COAP_MAX_RETRANSMIT: { type: 'integer', minimum: 0, maximum: 10, default: 4 },
    /** RFC 7641 4.5: at least one confirmable notification per observer in this many seconds. */
    COAP_CONFIRMABLE_REFRESH_S: { type: 'integer', minimum: 1, maximum: 86400, default: 86400 },
    COAP_MAX_AGE_S: { type: 'integer', minimum: 0, maximum: 86400, default: 60 },
    /** Longest accepted token (RFC 8974 extended tokens), bytes; bounds memory per relation. */
    COAP_MAX_TOKEN_LENGTH: { type: 'integer', minimum: 8, maximum: 255, default: 64 },
    COAP_SOCKET_BUFFER_BYTES: { type: 'integer', minimum: 65536, maximum: 67108864, default: 4194304 },
    COAP_FANOUT_CHUNK: { type: 'integer', minimum: 1, maximum: 65536, default: 256 },
    /** Server-wide window of confirmable notifications awaiting their first ACK (paces large fan-outs). */
    COAP_MAX_INFLIGHT: { type: 'integer', minimum: 1, maximum: 1048576, default: 2048 },
    COAP_MAX_RELATIONS_PER_ENDPOINT: { type: 'integer', minimum: 1, maximum: 4096, default: 256 },
    /**
     * Observe relation caps (design §3.4): in all (the memory bound, ~0.9 KB RSS each) and per source IP address,
     * counted apart for authenticated (DTLS) and plain CoAP peers; a registration over either gets 5.03 with
     * Max-Age COAP_RELATION_RETRY_AFTER_S. See CoapServerOptions.
     */
    COAP_MAX_RELATIONS: { type: 'integer', minimum: 1, maximum: 10000000, default: 200000 },
    COAP_MAX_RELATIONS_PER_ADDRESS: { type: 'integer', minimum: 1, maximum: 10000000, default: 512 },
    COAP_RELATION_RETRY_AFTER_S: { type: 'integer', minimum: 1, maximum: 86400, default: 60 },
    SHUTDOWN_TIMEOUT_MS: { type: 'integer', minimum: 1000, maximum: 60000, default: 10000 },
    /** Only to choose GATEWAY_COAP_SECURITY's default: `production` means DTLS only. */
    NODE_ENV: { type: 'string' },
    /**
     * Which CoAP transports listen: `dtls` (coaps, devices authenticate with a pre-shared key), `plain` (coap,
     * no device authentication: only on a closed device network) or `both`. Default: `dtls` with
     * NODE_ENV=production, else `plain` (tests and local runs; `npm start` chooses `both`).
     */
    GATEWAY_COAP_SECURITY: { type: 'string', enum: ['dtls', 'plain', 'both'] },
    /** The coaps port (RFC 7252 §12.7 registers 5684). */
    GATEWAY_COAPS_PORT: { type: 'integer', minimum: 0, maximum: 65535, default: 5684 },
    /** DTLS limits (RFC 6347 §4.2.1 asks servers to bound the state an attacker can make them keep). */
    DTLS_MAX_SESSIONS: { type: 'integer', minimum: 1, maximum: 10000000, default: 100000 },
    /**
     * Per source IP: 256 devices behind one NAT address, the same site size COAP_MAX_RELATIONS_PER_ADDRESS
     * (512, two resources per device) allows.
     */
    DTLS_MAX_SESSIONS_PER_ADDRESS: { type: 'integer', minimum: 1, maximum: 1000000, default: 256 },
    /** One key's sessions: a device needs one; a few more cover a reboot whose old session has not ended yet. */
    DTLS_MAX_SESSIONS_PER_CREDENTIAL: { type: 'integer', minimum: 1, maximum: 100000, default: 4 },
    DTLS_MAX_HANDSHAKES: { type: 'integer', minimum: 1, maximum: 1000000, default: 2000 },
    /** Handshakes in progress from one source IP, apart from its sessions (a site rebooting at once retries). */
    DTLS_MAX_HANDSHAKES_PER_ADDRESS: { type: 'integer', minimum: 1, maximum: 1000000, default: 16 },
    DTLS_HANDSHAKE_TIMEOUT_MS: { type: 'integer', minimum: 1000, maximum: 600000, default: 30000 },
    /** A handshake with no ClientKeyExchange this long after its cookie-verified ClientHello ends (ms). */
    DTLS_UNAUTHENTICATED_TIMEOUT_MS: { type: 'integer', minimum: 500, maximum: 600000, default: 5000 },
    /** Every session's key is checked again this often (seconds), whatever revocation event was missed. */
    DTLS_CREDENTIAL_CHECK_INTERVAL_S: { type: 'integer', minimum: 1, maximum: 86400, default: 10 },
    /**
     * A session with no authenticated record from its device for this long ends (seconds). Default: the
     * confirmable refresh period plus an hour, so an observer whose device acknowledges the periodic
     * confirmable notification (RFC 7641 §4.5) keeps its session while it only listens.
     */
    DTLS_IDLE_TIMEOUT_S: { type: 'integer', minimum: 10, maximum: 1000000 },
    /**
     * The platform's sites are read again this often between reloads (ms, design §3.2): a site given to another
     * company reaches company scopes within it.
     */
    GATEWAY_SITES_REFRESH_MS: { type: 'integer', minimum: 100, maximum: 3600000, default: 10000 },
    /** Replicas (design §3.6): share overrides and reloads with the other replicas over PostgreSQL LISTEN/NOTIFY. */
    GATEWAY_CLUSTER_BUS: { type: 'boolean', default: true },
    /** Listener reconnect backoff (ms): first delay, doubling up to the cap. */
    GATEWAY_BUS_RECONNECT_MIN_MS: { type: 'integer', minimum: 10, maximum: 60000, default: 100 },
    GATEWAY_BUS_RECONNECT_MAX_MS: { type: 'integer', minimum: 100, maximum: 300000, default: 5000 },
    /** A query on the listener connection this often (ms) detects a silently dead connection. */
    GATEWAY_BUS_HEARTBEAT_MS: { type: 'integer', minimum: 500, maximum: 600000, default: 5000 },
    /** The delivery record (design §3.8): what each device was sent and acknowledged, kept in PostgreSQL. */
    GATEWAY_DELIVERY_RECORD: { type: 'boolean', default: true },
    /**
     * Delivery events are written in batches this often (ms), and sooner when a chunk's worth of rows (2,000)
     * waits. The record lags by one of these plus the write: a device about to be notified waits up to one
     * interval so that sent and acknowledged share a row, and is written when that interval ends. At the defaults
     * that is within 2 s while the database keeps up; a burst larger than the writers write in a second lags by
     * about burst × cost per row / writers (design §3.8).
     */
    GATEWAY_DELIVERY_FLUSH_MS: { type: 'integer', minimum: 50, maximum: 60000, default: 1000 },
    /**
     * Chunks of one flush written at once, each on its own connection of the pool; at most DB_POOL_MAX - 1 (the
     * HTTP API and the bus keep one), a larger value is lowered to that.
     */
    GATEWAY_DELIVERY_WRITERS: { type: 'integer', minimum: 1, maximum: 16, default: 2 },
    /**
     * How far (ms) this replica's clock may be from the database's (design §3.8): each replica measures the
     * difference every 10 s and dates its delivery events on the database's clock; one further off than this is
     * not ready (/api/ready 503), with a log line, as its versions still run on its own clock.
     */
    // At most 10 s: a replica within that of the database believes every version the database accepted
    // (version-clock.ts MAX_AHEAD_MICROS).
    GATEWAY_CLOCK_MAX_SKEW_MS: { type: 'integer', minimum: 100, maximum: 10000, default: 2000 },
    /** How long GET /api/devices/{device_id} waits for the other replicas' live parts (ms). */
    GATEWAY_DEVICE_VIEW_DEADLINE_MS: { type: 'integer', minimum: 50, maximum: 10000, default: 1000 },
    /** Staged rollouts (design §3.9): whether this replica may drive them (hold the lease and advance waves). */
    GATEWAY_ROLLOUT_DRIVER: { type: 'boolean', default: true },
    /**
     * The driver's lease (ms): a driver that died is replaced within this plus one tick (at once when its database
     * session ended). At most 60 s, the longest lease the database grants (migration 0019).
     */
    GATEWAY_ROLLOUT_LEASE_MS: { type: 'integer', minimum: 500, maximum: 60000, default: 3000 },
    /** A driver tick this often (ms): renews the lease and runs one step; at most a third of the lease. */
    GATEWAY_ROLLOUT_STEP_MS: { type: 'integer', minimum: 50, maximum: 200000, default: 500 },
    /** Devices one step assigns at most (one transaction); a busy driver steps again at once. */
    GATEWAY_ROLLOUT_STEP_MAX: { type: 'integer', minimum: 1, maximum: 100000, default: 5000 },
    /**
     * The longest the driver waits past a device's deadline for a delivery record that is behind (ms; design
     * §3.9): past it, devices are judged on the record as it stands. Never below the record's allowance.
     */
    GATEWAY_ROLLOUT_RECORD_WAIT_MS: { type: 'integer', minimum: 1000, maximum: 600000, default: 60000 },
    /**
     * The statement timeout of a rollout's creation (ms; design §3.9), which runs on a connection of its own: one
     * statement writes a row per target, about 20 µs a target on the development machine when idle and several
     * times that when loaded, more than the pool's DB_STATEMENT_TIMEOUT_MS allows a large rollout. Steps and
     * lease renewals wait for a creation (the writers' lock), each up to DB_STATEMENT_TIMEOUT_MS.
     */
    GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS: { type: 'integer', minimum: 1000, maximum: 600000, default: 30000 },
    /**
     * The most devices one rollout may target (design §3.9); a larger selector is refused with 400. Lowered to
     * what GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS allows at 100 µs a target (a loaded machine's cost, with room).
     */
    GATEWAY_ROLLOUT_MAX_TARGETS: { type: 'integer', minimum: 1, maximum: 10000000, default: 100000 },
  },
} as const;

export type CoapSecurity = 'dtls' | 'plain' | 'both';

/**
 * What a rollout's creation is allowed per target within its statement timeout (µs): measured at 17-24 µs on the
 * two-core development machine (100,000 targets in 1.7-2.4 s, migration 0018), and 67 µs with the machine
 * loaded eight times over (60,000 in 4.0 s at a load average of 16): 100 µs leaves room above that.
 */
const ROLLOUT_CREATE_MICROS_PER_TARGET = 100;

/**
 * Loads and checks the environment once and returns the gateway's configuration, grouped by concern like the
 * workflow's (design §5.1); its type is derived from this function, so nothing is copied from the schema by
 * hand. Two values get defaults that depend on others: the CoAP security mode (on NODE_ENV) and the DTLS idle
 * timeout (on the confirmable refresh period).
 */
export function loadGatewayConfig(env: Record<string, string | undefined> = process.env) {
  const raw = loadConfig(gatewayConfigSchema, env);
  const security: CoapSecurity =
    raw.GATEWAY_COAP_SECURITY ?? (raw.NODE_ENV === 'production' ? 'dtls' : 'plain');
  return deepFreeze({
    nodeEnv: raw.NODE_ENV,
    logLevel: raw.LOG_LEVEL,
    http: { port: raw.GATEWAY_HTTP_PORT, host: raw.GATEWAY_HTTP_HOST, trustProxy: raw.GATEWAY_TRUST_PROXY },
    /** The API keys as configured (value and/or file); `readApiKeys` turns them into a SecretSet. */
    apiKeys: { value: raw.GATEWAY_API_KEYS, file: raw.GATEWAY_API_KEYS_FILE },
    /** People's access tokens (auth/tokens.ts); undefined without GATEWAY_OIDC_ISSUER_URL. */
    oidc:
      raw.GATEWAY_OIDC_ISSUER_URL === undefined
        ? undefined
        : {
            issuerUrl: raw.GATEWAY_OIDC_ISSUER_URL,
            jwksUrl: raw.GATEWAY_OIDC_JWKS_URL,
            clientId: raw.GATEWAY_OIDC_CLIENT_ID,
            clockToleranceS: raw.GATEWAY_OIDC_CLOCK_TOLERANCE_S,
            maxTokenLifetimeS: raw.GATEWAY_OIDC_MAX_TOKEN_LIFETIME_S,
            jwksTimeoutMs: raw.GATEWAY_OIDC_JWKS_TIMEOUT_MS,
            jwksCooldownMs: raw.GATEWAY_OIDC_JWKS_COOLDOWN_MS,
          },
    database: { url: raw.DATABASE_URL, poolMax: raw.DB_POOL_MAX, ...databaseDeadlines(raw) },
    coap: {
      security,
      host: raw.GATEWAY_COAP_HOST,
      port: raw.GATEWAY_COAP_PORT,
      coapsPort: raw.GATEWAY_COAPS_PORT,
      ackTimeoutMs: raw.COAP_ACK_TIMEOUT_MS,
      maxRetransmit: raw.COAP_MAX_RETRANSMIT,
      confirmableRefreshS: raw.COAP_CONFIRMABLE_REFRESH_S,
      maxAgeS: raw.COAP_MAX_AGE_S,
      maxTokenLength: raw.COAP_MAX_TOKEN_LENGTH,
      socketBufferBytes: raw.COAP_SOCKET_BUFFER_BYTES,
      fanoutChunk: raw.COAP_FANOUT_CHUNK,
      maxInflight: raw.COAP_MAX_INFLIGHT,
      maxRelationsPerEndpoint: raw.COAP_MAX_RELATIONS_PER_ENDPOINT,
      maxRelations: raw.COAP_MAX_RELATIONS,
      maxRelationsPerAddress: raw.COAP_MAX_RELATIONS_PER_ADDRESS,
      relationRetryAfterS: raw.COAP_RELATION_RETRY_AFTER_S,
    },
    dtls: {
      maxSessions: raw.DTLS_MAX_SESSIONS,
      maxSessionsPerAddress: raw.DTLS_MAX_SESSIONS_PER_ADDRESS,
      maxSessionsPerCredential: raw.DTLS_MAX_SESSIONS_PER_CREDENTIAL,
      maxHandshakes: raw.DTLS_MAX_HANDSHAKES,
      maxHandshakesPerAddress: raw.DTLS_MAX_HANDSHAKES_PER_ADDRESS,
      handshakeTimeoutMs: raw.DTLS_HANDSHAKE_TIMEOUT_MS,
      unauthenticatedTimeoutMs: raw.DTLS_UNAUTHENTICATED_TIMEOUT_MS,
      credentialCheckIntervalS: raw.DTLS_CREDENTIAL_CHECK_INTERVAL_S,
      idleTimeoutS: raw.DTLS_IDLE_TIMEOUT_S ?? raw.COAP_CONFIRMABLE_REFRESH_S + 3600,
    },
    cluster: {
      enabled: raw.GATEWAY_CLUSTER_BUS,
      reconnectMinMs: raw.GATEWAY_BUS_RECONNECT_MIN_MS,
      reconnectMaxMs: raw.GATEWAY_BUS_RECONNECT_MAX_MS,
      heartbeatMs: raw.GATEWAY_BUS_HEARTBEAT_MS,
    },
    delivery: {
      enabled: raw.GATEWAY_DELIVERY_RECORD,
      flushMs: raw.GATEWAY_DELIVERY_FLUSH_MS,
      // The pool's other connections serve the API and the bus (design §3.8); a pool of one shares its only one.
      writers: Math.max(1, Math.min(raw.GATEWAY_DELIVERY_WRITERS, raw.DB_POOL_MAX - 1)),
      viewDeadlineMs: raw.GATEWAY_DEVICE_VIEW_DEADLINE_MS,
      clockMaxSkewMs: raw.GATEWAY_CLOCK_MAX_SKEW_MS,
    },
    rollouts: {
      driver: raw.GATEWAY_ROLLOUT_DRIVER,
      leaseMs: raw.GATEWAY_ROLLOUT_LEASE_MS,
      // A tick renews the lease: three ticks fit in one lease, so one slow tick does not lose it.
      stepMs: Math.min(raw.GATEWAY_ROLLOUT_STEP_MS, Math.floor(raw.GATEWAY_ROLLOUT_LEASE_MS / 3)),
      stepMax: raw.GATEWAY_ROLLOUT_STEP_MAX,
      // How far the delivery record may lag a device (design §3.8): one flush interval and the write while the
      // database keeps up, more during a fleet-wide burst (about its rows × the cost per row / writers); two
      // intervals and a second are allowed. No device is judged failed before its deadline plus this, and a
      // plan whose deadline is shorter is refused (design §3.9).
      recordLagMs: 2 * raw.GATEWAY_DELIVERY_FLUSH_MS + 1000,
      // More when the live replicas report their record further behind (migration 0014), up to this.
      recordWaitMaxMs: Math.max(raw.GATEWAY_ROLLOUT_RECORD_WAIT_MS, 2 * raw.GATEWAY_DELIVERY_FLUSH_MS + 1000),
      createTimeoutMs: raw.GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS,
      // A creation is one statement of about 20 µs a target, idle (design §3.9): 100 µs a target must fit its
      // timeout.
      maxTargets: Math.max(
        1,
        Math.min(
          raw.GATEWAY_ROLLOUT_MAX_TARGETS,
          Math.floor((raw.GATEWAY_ROLLOUT_CREATE_TIMEOUT_MS * 1000) / ROLLOUT_CREATE_MICROS_PER_TARGET),
        ),
      ),
    },
    sitesRefreshMs: raw.GATEWAY_SITES_REFRESH_MS,
    shutdownTimeoutMs: raw.SHUTDOWN_TIMEOUT_MS,
  });
}

/** What `npm run device-key` needs: the owner login of the platform database (checked by the command). */
export interface DeviceKeyConfig {
  databaseUrl: string | undefined;
  /**
   * Who runs the command, for the audit (design §3.1): the user who ran `sudo` (SUDO_USER) if any, else the
   * process's OS user; undefined when neither can be read (a uid without a passwd entry in a container).
   */
  osUser: string | undefined;
}

function currentOsUser(): string | undefined {
  try {
    return userInfo().username;
  } catch {
    // SystemError: the uid has no passwd entry.
    return undefined;
  }
}

/** The device-key command's configuration from the environment (design §5.1: read here, passed in). */
export function deviceKeyConfig(env: Record<string, string | undefined> = process.env): DeviceKeyConfig {
  const sudoUser = env.SUDO_USER;
  return {
    databaseUrl: env.DATABASE_URL,
    osUser: sudoUser !== undefined && sudoUser !== '' ? sudoUser : currentOsUser(),
  };
}

/** The validated configuration (see loadGatewayConfig). */
export type GatewayConfig = ReturnType<typeof loadGatewayConfig>;

/** Whether plain CoAP (no device authentication) listens. */
export const servesPlainCoap = (config: GatewayConfig): boolean => config.coap.security !== 'dtls';
/** Whether CoAP over DTLS listens. */
export const servesCoaps = (config: GatewayConfig): boolean => config.coap.security !== 'plain';

/**
 * The API keys from `GATEWAY_API_KEYS` (anonymous keys) and `GATEWAY_API_KEYS_FILE` (anonymous and named keys,
 * auth/api-keys.ts) together (rotation: old and new both listed). Throws when there is none (the gateway refuses
 * to start without a key) and when the file is malformed (KeyFileError, naming the line, never a key).
 */
export function readApiKeys(config: GatewayConfig): GatewayKeys {
  const fromEnv = readSecretList({ value: config.apiKeys.value });
  const file = config.apiKeys.file;
  const fromFile =
    file === undefined || file === '' ? { anonymous: [], named: [] } : parseKeyFile(readRegularFile(file));
  const anonymous = [...new Set([...fromEnv, ...fromFile.anonymous])];
  if (anonymous.length + fromFile.named.length === 0) {
    throw new Error('no API key configured: set GATEWAY_API_KEYS or GATEWAY_API_KEYS_FILE');
  }
  const unusable = countNonBearerSecrets(anonymous);
  if (unusable > 0) {
    throw new Error(
      `${unusable} configured API key(s) cannot be used in an Authorization header (RFC 6750 token68: letters, digits and -._~+/ with trailing =)`,
    );
  }
  const namedKeys = new Set(fromFile.named.map((k) => k.key));
  if (anonymous.some((k) => namedKeys.has(k)))
    throw new Error('a named API key is also configured as an anonymous key (GATEWAY_API_KEYS)');
  return new GatewayKeys(anonymous, fromFile.named);
}

/**
 * `/api/config`: the effective configuration, secrets shown only as a count and keyed fingerprints (ApiKeys; a
 * plain SecretSet's unkeyed ones are never shown: none then).
 */
export function publicConfig(config: GatewayConfig, apiKeys: SecretSet): Record<string, unknown> {
  return {
    http_port: config.http.port,
    coap_port: config.coap.port,
    coap_host: config.coap.host,
    database_url: redactUrl(config.database.url),
    api_keys: { count: apiKeys.size, fingerprints: apiKeys instanceof ApiKeys ? apiKeys.fingerprints() : [] },
    // Named keys by name, role and scope (issue 42 §2), never the key.
    named_api_keys: apiKeys instanceof GatewayKeys ? apiKeys.namedKeys() : [],
    api_keys_file: config.apiKeys.file ?? null,
    oidc:
      config.oidc === undefined
        ? null
        : { issuer_url: config.oidc.issuerUrl, client_id: config.oidc.clientId },
    trust_proxy: config.http.trustProxy,
    log_level: config.logLevel,
    db_pool_max: config.database.poolMax,
    db_statement_timeout_ms: config.database.statementTimeoutMs,
    db_query_timeout_ms: config.database.queryTimeoutMs,
    db_connect_timeout_ms: config.database.connectionTimeoutMs,
    coap_security: config.coap.security,
    coaps_port: config.coap.coapsPort,
    dtls: {
      max_sessions: config.dtls.maxSessions,
      max_sessions_per_address: config.dtls.maxSessionsPerAddress,
      max_sessions_per_credential: config.dtls.maxSessionsPerCredential,
      max_handshakes: config.dtls.maxHandshakes,
      max_handshakes_per_address: config.dtls.maxHandshakesPerAddress,
      handshake_timeout_ms: config.dtls.handshakeTimeoutMs,
      unauthenticated_timeout_ms: config.dtls.unauthenticatedTimeoutMs,
      credential_check_interval_s: config.dtls.credentialCheckIntervalS,
      idle_timeout_s: config.dtls.idleTimeoutS,
    },
    coap: {
      ack_timeout_ms: config.coap.ackTimeoutMs,
      max_retransmit: config.coap.maxRetransmit,
      confirmable_refresh_s: config.coap.confirmableRefreshS,
      max_age_s: config.coap.maxAgeS,
      max_token_length: config.coap.maxTokenLength,
      socket_buffer_bytes: config.coap.socketBufferBytes,
      fanout_chunk: config.coap.fanoutChunk,
      max_inflight: config.coap.maxInflight,
      max_relations_per_endpoint: config.coap.maxRelationsPerEndpoint,
      max_relations: config.coap.maxRelations,
      max_relations_per_address: config.coap.maxRelationsPerAddress,
      relation_retry_after_s: config.coap.relationRetryAfterS,
    },
    shutdown_timeout_ms: config.shutdownTimeoutMs,
    cluster_bus: {
      enabled: config.cluster.enabled,
      reconnect_min_ms: config.cluster.reconnectMinMs,
      reconnect_max_ms: config.cluster.reconnectMaxMs,
      heartbeat_ms: config.cluster.heartbeatMs,
    },
    delivery: {
      record: config.delivery.enabled,
      flush_ms: config.delivery.flushMs,
      view_deadline_ms: config.delivery.viewDeadlineMs,
      clock_max_skew_ms: config.delivery.clockMaxSkewMs,
    },
    rollouts: {
      driver: config.rollouts.driver,
      lease_ms: config.rollouts.leaseMs,
      step_ms: config.rollouts.stepMs,
      step_max: config.rollouts.stepMax,
      record_lag_ms: config.rollouts.recordLagMs,
      record_wait_max_ms: config.rollouts.recordWaitMaxMs,
      create_timeout_ms: config.rollouts.createTimeoutMs,
      max_targets: config.rollouts.maxTargets,
    },
  };
}
