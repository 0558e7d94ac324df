// The workflow's whole configuration, read once from the environment at boot (design §5.1) and passed
// in; nothing else reads process.env.
import {
  ConfigError,
  countNonBearerSecrets,
  databaseDeadlines,
  deepFreeze,
  LOG_LEVELS,
  loadConfig,
  NotARegularFileError,
  keyedFingerprint,
  KeyedSecretSet,
  readSecretList,
} from '@platform/service-kit';
import type { DatabaseDeadlines, LogLevel } from '@platform/service-kit';
import type { S3Settings } from './storage/s3-client.js';
import type { TokenVerifierSettings } from './auth/token-verifier.js';
import type { MediaLimits } from './domain/media-rules.js';
import type { MultipartSettings } from './domain/context.js';

const MiB = 1024 * 1024;
/** The least MULTIPART_SWEEP_GRACE_S, in seconds, whatever the deadlines (see sweepGraceFloorS). */
export const MIN_SWEEP_GRACE_S = 60;

export const configSchema = {
  $id: 'https://platform.example/schemas/enterprise-workflow-config.json',
  type: 'object',
  additionalProperties: false,
  required: ['DATABASE_URL', 'OIDC_ISSUER_URL', 'S3_BUCKET'],
  properties: {
    PORT: { type: 'integer', minimum: 0, maximum: 65535, default: 3800 },
    HOST: { type: 'string', default: '0.0.0.0' },
    LOG_LEVEL: { type: 'string', enum: LOG_LEVELS, default: 'info' },
    /** Proxy hops trusted for client addresses (the Ingress, design §5). */
    TRUST_PROXY: { type: 'integer', minimum: 0, maximum: 10, default: 1 },
    /** The `enterprise_api_login` connection (design §4.4). */
    DATABASE_URL: { type: 'string', minLength: 1 },
    DB_POOL_MAX: { type: 'integer', minimum: 1, maximum: 200, default: 10 },
    /** Server-side bound on one statement (`statement_timeout`), in ms: a slow statement is cancelled, 503. */
    DB_STATEMENT_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 600000, default: 3000 },
    /**
     * Client-side deadline of one statement, in ms, above DB_STATEMENT_TIMEOUT_MS: ends the wait on a server
     * that stopped answering (where no server-side timeout can fire); the connection is discarded, 503.
     */
    DB_QUERY_TIMEOUT_MS: { type: 'integer', minimum: 200, maximum: 600000, default: 4000 },
    /** Deadline for getting a connection (free in the pool, or newly opened and authenticated), in ms. */
    DB_CONNECT_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 60000, default: 2000 },
    OIDC_ISSUER_URL: { type: 'string', format: 'uri' },
    OIDC_CLIENT_ID: { type: 'string', minLength: 1, default: 'platform-enterprise-web' },
    /** Overrides Keycloak's `{issuer}/protocol/openid-connect/certs`. */
    OIDC_JWKS_URL: { type: 'string', format: 'uri' },
    /** Allowed clock skew for exp/nbf, in seconds. */
    OIDC_CLOCK_TOLERANCE_S: { type: 'integer', minimum: 0, maximum: 300, default: 30 },
    /**
     * Longest token lifetime accepted (exp - now), in seconds. Keycloak's access tokens default to 5 minutes;
     * an hour leaves room for a realm that lengthens them, and refuses a token claiming to live for years.
     */
    OIDC_MAX_TOKEN_LIFETIME_S: { type: 'integer', minimum: 60, maximum: 86400, default: 3600 },
    /** Minimum interval between JWKS refetches caused by an unknown kid, in milliseconds. */
    OIDC_JWKS_COOLDOWN_MS: { type: 'integer', minimum: 0, default: 30000 },
    /** JWKS cache lifetime, in milliseconds. */
    OIDC_JWKS_MAX_AGE_MS: { type: 'integer', minimum: 1000, default: 600000 },
    OIDC_JWKS_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 60000, default: 5000 },
    /**
     * How long a fully verified access token is remembered, in milliseconds (0: off); also how long a
     * token signed with a key removed from the JWKS stays accepted.
     */
    OIDC_TOKEN_CACHE_TTL_MS: { type: 'integer', minimum: 0, maximum: 300000, default: 60000 },
    OIDC_TOKEN_CACHE_MAX_ENTRIES: { type: 'integer', minimum: 0, maximum: 1000000, default: 10000 },
    S3_ENDPOINT: { type: 'string', format: 'uri' },
    /** Endpoint put into presigned URLs when clients reach the store by another address. */
    S3_PUBLIC_ENDPOINT: { type: 'string', format: 'uri' },
    S3_REGION: { type: 'string', minLength: 1, default: 'us-east-1' },
    S3_BUCKET: { type: 'string', minLength: 3, maxLength: 63 },
    S3_ACCESS_KEY_ID: { type: 'string', minLength: 1 },
    S3_SECRET_ACCESS_KEY: { type: 'string', minLength: 1, writeOnly: true },
    S3_FORCE_PATH_STYLE: { type: 'boolean', default: false },
    /** Deadline to connect to the object store, ms (a store that does not accept: 503 after it). */
    S3_CONNECT_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 60000, default: 2000 },
    /** Deadline of one request to the object store, ms (a frozen store: 503 after about twice it). */
    S3_REQUEST_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 300000, default: 3000 },
    /** Deadline of the store's long calls (CompleteMultipartUpload, the acceptance copy), ms. */
    S3_LONG_REQUEST_TIMEOUT_MS: { type: 'integer', minimum: 1000, maximum: 900000, default: 120000 },
    WEBHOOK_TOKENS: { type: 'string', writeOnly: true },
    /** File with webhook tokens, one per line; re-read on SIGHUP (the previous tokens stay if it is unusable). */
    WEBHOOK_TOKENS_FILE: { type: 'string' },
    /**
     * Largest image and video uploads, in bytes (defaults 25 MiB and 2 GiB). At most 5 GiB: an accepted upload
     * is copied to its immutable key with one CopyObject (design §4.6), which S3 limits to 5 GiB.
     */
    MEDIA_MAX_IMAGE_BYTES: { type: 'integer', minimum: 1, maximum: 5 * 1024 * MiB, default: 25 * MiB },
    MEDIA_MAX_VIDEO_BYTES: { type: 'integer', minimum: 1, maximum: 5 * 1024 * MiB, default: 2048 * MiB },
    /** Lifetime of a presigned PUT, in seconds (SigV4 allows at most 7 days). */
    UPLOAD_URL_TTL_S: { type: 'integer', minimum: 60, maximum: 604800, default: 900 },
    /** Lifetime of a presigned GET, in seconds. */
    DOWNLOAD_URL_TTL_S: { type: 'integer', minimum: 10, maximum: 604800, default: 300 },
    /** Files larger than this, in bytes, are uploaded in parts (design §4.4; default 64 MiB). */
    MULTIPART_THRESHOLD_BYTES: { type: 'integer', minimum: 5 * MiB, default: 64 * MiB },
    /** Preferred part size, in bytes (S3: at least 5 MiB; raised when a file would need over 10,000 parts). */
    MULTIPART_PART_SIZE_BYTES: { type: 'integer', minimum: 5 * MiB, maximum: 5120 * MiB, default: 16 * MiB },
    /** How long an upload in parts may take from intent to completion, in seconds (default 24 h). */
    MULTIPART_UPLOAD_TTL_S: { type: 'integer', minimum: 60, maximum: 604800, default: 86400 },
    /**
     * The most uploads in parts one user may have open at once (pending, intent not expired), across sites; a
     * further intent is 409 too_many_open_uploads (design §4.4).
     */
    MULTIPART_MAX_OPEN_PER_USER: { type: 'integer', minimum: 1, maximum: 10000, default: 20 },
    /** The most uploads in parts open at once at one site, whoever started them. */
    MULTIPART_MAX_OPEN_PER_SITE: { type: 'integer', minimum: 1, maximum: 100000, default: 200 },
    /** Interval of the sweep that aborts expired uploads in parts, in seconds; 0 turns it off. */
    MULTIPART_SWEEP_INTERVAL_S: { type: 'integer', minimum: 0, maximum: 86400, default: 300 },
    /**
     * How long after its intent expired an unfinished upload in parts is aborted, and how old a store upload no
     * item names, or a planned intent never started, must be before the sweep touches it, in seconds. At least
     * MIN_SWEEP_GRACE_S and longer than an intent's start can take (see sweepGraceFloorS): a shorter grace
     * abandons intents that another replica is still starting.
     */
    MULTIPART_SWEEP_GRACE_S: { type: 'integer', minimum: MIN_SWEEP_GRACE_S, maximum: 86400, default: 600 },
    /** How long a stored Idempotency-Key answer is replayed, in seconds. */
    IDEMPOTENCY_TTL_S: { type: 'integer', minimum: 60, default: 86400 },
    /** Bound on the shutdown sequence, in milliseconds. */
    SHUTDOWN_TIMEOUT_MS: { type: 'integer', minimum: 1000, default: 15000 },
  },
} as const;

export interface WorkflowConfig {
  http: { port: number; host: string; trustProxy: number };
  logLevel: LogLevel;
  database: DatabaseDeadlines & { url: string; poolMax: number };
  oidc: TokenVerifierSettings;
  s3: S3Settings;
  webhookTokens: string[];
  /** Where the webhook tokens come from: read at start and again on SIGHUP (`readWebhookTokens`). */
  webhookTokenSource: { value: string | undefined; file: string | undefined };
  media: MediaLimits & { uploadUrlTtlS: number; downloadUrlTtlS: number };
  multipart: MultipartSettings & { sweepIntervalS: number; sweepGraceS: number };
  idempotencyTtlS: number;
  shutdownTimeoutMs: number;
}

/**
 * The webhook's bearer tokens from `WEBHOOK_TOKENS` and `WEBHOOK_TOKENS_FILE` together (rotation: old and new
 * listed at once), checked: at least one, each usable in an Authorization header. At start and on SIGHUP;
 * throws `ConfigError`, which names the variable and never a value.
 */
export function readWebhookTokens(source: { value: string | undefined; file: string | undefined }): string[] {
  let webhookTokens: string[];
  try {
    webhookTokens = readSecretList(source);
  } catch (err) {
    throw new ConfigError([
      {
        variable: 'WEBHOOK_TOKENS_FILE',
        message:
          err instanceof NotARegularFileError
            ? `is ${err.kind}, not a regular file: refused unread (reading one can block the process)`
            : `cannot be read (${(err as NodeJS.ErrnoException).code ?? 'error'})`,
      },
    ]);
  }
  if (webhookTokens.length === 0) {
    // design §5.1: refuse to start without a webhook token rather than accept unauthenticated events.
    throw new ConfigError([
      {
        variable: 'WEBHOOK_TOKENS',
        message: 'set WEBHOOK_TOKENS or WEBHOOK_TOKENS_FILE (at least one token)',
      },
    ]);
  }
  const unusable = countNonBearerSecrets(webhookTokens);
  if (unusable > 0) {
    // Such a token could never arrive in the store's Authorization header: every event would be refused.
    throw new ConfigError([
      {
        variable: 'WEBHOOK_TOKENS',
        message: `${unusable} token(s) are not RFC 6750 token68 (letters, digits, -._~+/ and trailing =)`,
      },
    ]);
  }
  const short = webhookTokens.filter((t) => t.length < MIN_WEBHOOK_TOKEN_LENGTH).length;
  if (short > 0) {
    // A placeholder or a truncated file must not replace the real token (issue 29's cold review, I1): refused
    // at start and on SIGHUP alike, where the previous tokens then stay valid.
    throw new ConfigError([
      {
        variable: 'WEBHOOK_TOKENS',
        message: `${short} token(s) are shorter than ${MIN_WEBHOOK_TOKEN_LENGTH} characters: too short to be a secret`,
      },
    ]);
  }
  return webhookTokens;
}

/** A webhook token's fingerprint, keyed with a per-process secret (service-kit keyedFingerprint; issue 39). */
export const webhookTokenFingerprint = keyedFingerprint;

/**
 * The webhook's accepted tokens: a SecretSet (constant-time checks) whose fingerprints are keyed wherever they
 * appear: the SIGHUP reload's log line, the set's JSON form.
 */
export class WebhookTokens extends KeyedSecretSet {}

/** Shortest webhook token accepted (a generated one is 32+ characters; the development one is 17). */
export const MIN_WEBHOOK_TOKEN_LENGTH = 16;

/**
 * The shortest sweep grace period these deadlines allow, in seconds (design §4.4). An intent in parts records
 * its item (a connection and a statement), starts the store's upload (one attempt, S3_REQUEST_TIMEOUT_MS) and
 * records the upload's id (a connection and a statement again): until then its item has no upload id and its
 * store upload no item, which is exactly what the sweep abandons and aborts once they are older than the grace.
 * Every replica is assumed to run with the same deadlines; the floor is never below MIN_SWEEP_GRACE_S, which
 * also covers a clock step between a replica and the store (the store dates its uploads).
 */
export function sweepGraceFloorS(raw: {
  S3_REQUEST_TIMEOUT_MS: number;
  DB_CONNECT_TIMEOUT_MS: number;
  DB_QUERY_TIMEOUT_MS: number;
}): number {
  const startMs = raw.S3_REQUEST_TIMEOUT_MS + 2 * (raw.DB_CONNECT_TIMEOUT_MS + raw.DB_QUERY_TIMEOUT_MS);
  return Math.max(MIN_SWEEP_GRACE_S, Math.ceil(startMs / 1000));
}

/** Reads and checks the environment; throws `ConfigError` naming every bad variable. */
export function loadWorkflowConfig(env: Record<string, string | undefined> = process.env): WorkflowConfig {
  const raw = loadConfig(configSchema, env);
  const webhookTokenSource = { value: raw.WEBHOOK_TOKENS, file: raw.WEBHOOK_TOKENS_FILE };
  const webhookTokens = readWebhookTokens(webhookTokenSource);
  const graceFloorS = sweepGraceFloorS(raw);
  if (raw.MULTIPART_SWEEP_GRACE_S < graceFloorS) {
    throw new ConfigError([
      {
        variable: 'MULTIPART_SWEEP_GRACE_S',
        message:
          `must be at least ${graceFloorS} s, longer than an intent's start can take with these deadlines ` +
          '(S3_REQUEST_TIMEOUT_MS + 2 × (DB_CONNECT_TIMEOUT_MS + DB_QUERY_TIMEOUT_MS)): a shorter grace ' +
          `abandons intents other replicas are still starting (got ${raw.MULTIPART_SWEEP_GRACE_S})`,
      },
    ]);
  }
  if ((raw.S3_ACCESS_KEY_ID === undefined) !== (raw.S3_SECRET_ACCESS_KEY === undefined)) {
    throw new ConfigError([
      {
        variable: 'S3_SECRET_ACCESS_KEY',
        message: 'S3_ACCESS_KEY_ID and S3_SECRET_ACCESS_KEY must be set together',
      },
    ]);
  }
  return deepFreeze({
    http: { port: raw.PORT, host: raw.HOST, trustProxy: raw.TRUST_PROXY },
    logLevel: raw.LOG_LEVEL,
    database: {
      url: raw.DATABASE_URL,
      poolMax: raw.DB_POOL_MAX,
      ...databaseDeadlines(raw),
    },
    oidc: {
      issuerUrl: raw.OIDC_ISSUER_URL,
      jwksUrl: raw.OIDC_JWKS_URL,
      clientId: raw.OIDC_CLIENT_ID,
      requiredRole: 'enterprise_portal_role',
      clockToleranceS: raw.OIDC_CLOCK_TOLERANCE_S,
      maxTokenLifetimeS: raw.OIDC_MAX_TOKEN_LIFETIME_S,
      jwksCooldownMs: raw.OIDC_JWKS_COOLDOWN_MS,
      jwksCacheMaxAgeMs: raw.OIDC_JWKS_MAX_AGE_MS,
      jwksTimeoutMs: raw.OIDC_JWKS_TIMEOUT_MS,
      tokenCacheTtlMs: raw.OIDC_TOKEN_CACHE_TTL_MS,
      tokenCacheMaxEntries: raw.OIDC_TOKEN_CACHE_MAX_ENTRIES,
    },
    s3: {
      endpoint: raw.S3_ENDPOINT,
      publicEndpoint: raw.S3_PUBLIC_ENDPOINT,
      region: raw.S3_REGION,
      bucket: raw.S3_BUCKET,
      accessKeyId: raw.S3_ACCESS_KEY_ID,
      secretAccessKey: raw.S3_SECRET_ACCESS_KEY,
      forcePathStyle: raw.S3_FORCE_PATH_STYLE,
      connectTimeoutMs: raw.S3_CONNECT_TIMEOUT_MS,
      requestTimeoutMs: raw.S3_REQUEST_TIMEOUT_MS,
      longRequestTimeoutMs: raw.S3_LONG_REQUEST_TIMEOUT_MS,
    },
    webhookTokens,
    webhookTokenSource,
    media: {
      maxImageBytes: raw.MEDIA_MAX_IMAGE_BYTES,
      maxVideoBytes: raw.MEDIA_MAX_VIDEO_BYTES,
      uploadUrlTtlS: raw.UPLOAD_URL_TTL_S,
      downloadUrlTtlS: raw.DOWNLOAD_URL_TTL_S,
    },
    multipart: {
      thresholdBytes: raw.MULTIPART_THRESHOLD_BYTES,
      partSizeBytes: raw.MULTIPART_PART_SIZE_BYTES,
      uploadTtlS: raw.MULTIPART_UPLOAD_TTL_S,
      maxOpenPerUser: raw.MULTIPART_MAX_OPEN_PER_USER,
      maxOpenPerSite: raw.MULTIPART_MAX_OPEN_PER_SITE,
      sweepIntervalS: raw.MULTIPART_SWEEP_INTERVAL_S,
      sweepGraceS: raw.MULTIPART_SWEEP_GRACE_S,
    },
    idempotencyTtlS: raw.IDEMPOTENCY_TTL_S,
    shutdownTimeoutMs: raw.SHUTDOWN_TIMEOUT_MS,
  });
}
