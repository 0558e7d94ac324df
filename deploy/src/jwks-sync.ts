// Keeps PostgREST's JWT key set equal to the identity provider's (design §4.2): PostgREST cannot fetch
// a JWKS URL itself (PostgREST issue #4137), so this fetches Keycloak's JWKS and installs it with
// `installPostgrestAuth` (enterprise.postgrest_settings + NOTIFY pgrst, 'reload config'). Keycloak keeps
// a rotated-out key published while tokens it signed are alive, so syncing every few minutes is enough.
import { writeFile } from 'node:fs/promises';
import { installPostgrestAuth, jwksUrlOf, JwksError, publicSigningKeys } from '@platform/enterprise-db';
import type { JsonWebKeyLike } from '@platform/enterprise-db';
import { errorMessage, loadConfig } from '@platform/service-kit';
import type { Logger } from '@platform/service-kit';
import type { Kysely } from 'kysely';

export const jwksSyncConfigSchema = {
  type: 'object',
  additionalProperties: false,
  required: ['DATABASE_URL', 'OIDC_ISSUER_URL'],
  properties: {
    /** The migration (owner) login: enterprise.postgrest_settings is written only by the owner. */
    DATABASE_URL: { type: 'string', minLength: 1, writeOnly: true },
    /** Expected `iss` of the tokens, e.g. https://id.example.com/realms/platform. */
    OIDC_ISSUER_URL: { type: 'string', format: 'uri' },
    /** Where to fetch the keys when the issuer's public address is not reachable from here. */
    OIDC_JWKS_URL: { type: 'string', format: 'uri' },
    OIDC_CLIENT_ID: { type: 'string', minLength: 1, default: 'platform-enterprise-web' },
    /** Seconds between syncs; 0 syncs once and exits (a Job or an init step). */
    JWKS_SYNC_INTERVAL_S: { type: 'integer', minimum: 0, maximum: 86400, default: 300 },
    /** How long the first sync keeps retrying before the process gives up, in seconds. */
    JWKS_SYNC_STARTUP_TIMEOUT_S: { type: 'integer', minimum: 1, maximum: 3600, default: 120 },
    /** Written after the first successful sync (a container healthcheck tests for it). */
    JWKS_SYNC_READY_FILE: { type: 'string', minLength: 1 },
    /** Bound on one JWKS request, in milliseconds. */
    JWKS_FETCH_TIMEOUT_MS: { type: 'integer', minimum: 100, maximum: 60000, default: 5000 },
    LOG_LEVEL: { type: 'string', enum: ['error', 'warn', 'info', 'debug'], default: 'info' },
  },
} as const;

/** The validated configuration; written out because FromSchema of this schema exceeds TS2589's depth. */
export interface JwksSyncConfig {
  readonly DATABASE_URL: string;
  readonly OIDC_ISSUER_URL: string;
  readonly OIDC_JWKS_URL?: string;
  readonly OIDC_CLIENT_ID: string;
  readonly JWKS_SYNC_INTERVAL_S: number;
  readonly JWKS_SYNC_STARTUP_TIMEOUT_S: number;
  readonly JWKS_SYNC_READY_FILE?: string;
  readonly JWKS_FETCH_TIMEOUT_MS: number;
  readonly LOG_LEVEL: 'error' | 'warn' | 'info' | 'debug';
}

type UntypedLoadConfig = (schema: object, env: Record<string, string | undefined>) => unknown;

export function loadJwksSyncConfig(env: Record<string, string | undefined> = process.env): JwksSyncConfig {
  return (loadConfig as unknown as UntypedLoadConfig)(jwksSyncConfigSchema, env) as JwksSyncConfig;
}

export interface JwksSyncTarget {
  issuer: string;
  clientId: string;
  jwksUrl: string;
  fetchTimeoutMs: number;
}

export interface SyncResult {
  changed: boolean;
  kids: string[];
}

/** Fetches the key set at `jwksUrl` and keeps its public signing keys (throws JwksError otherwise). */
export async function fetchSigningKeys(
  jwksUrl: string,
  timeoutMs: number,
): Promise<{ keys: JsonWebKeyLike[] }> {
  const res = await fetch(jwksUrl, {
    signal: AbortSignal.timeout(timeoutMs),
    headers: { accept: 'application/json' },
  });
  if (!res.ok) throw new JwksError(`GET ${jwksUrl} answered ${res.status}`);
  return publicSigningKeys(await res.json());
}

/** One sync: fetch, install, notify PostgREST when something changed. */
export async function syncOnce<DB>(db: Kysely<DB>, target: JwksSyncTarget): Promise<SyncResult> {
  const jwks = await fetchSigningKeys(target.jwksUrl, target.fetchTimeoutMs);
  const changed = await installPostgrestAuth(db, { issuer: target.issuer, clientId: target.clientId, jwks });
  return { changed, kids: jwks.keys.map((k) => k.kid ?? '(no kid)') };
}

export interface SyncLoopOptions<DB> {
  db: Kysely<DB>;
  target: JwksSyncTarget;
  logger: Logger;
  /** Seconds between syncs; 0 = once. */
  intervalS: number;
  /** The first sync retries (0.5 s doubling to 10 s) for at most this long, in milliseconds. */
  startupTimeoutMs: number;
  readyFile?: string;
  /** Aborting stops the loop between syncs. */
  signal: AbortSignal;
}

/**
 * Runs the first sync until it succeeds (or the startup timeout passes: rejects), then, unless
 * `intervalS` is 0, syncs every `intervalS` seconds; a failed later sync is logged and the installed
 * keys stay as they were (PostgREST keeps verifying with them).
 */
export async function runSyncLoop<DB>(options: SyncLoopOptions<DB>): Promise<void> {
  const { db, target, logger, signal } = options;
  const deadline = Date.now() + options.startupTimeoutMs;
  for (let delayMs = 500; ; delayMs = Math.min(delayMs * 2, 10_000)) {
    try {
      const result = await syncOnce(db, target);
      logger.info('JWKS installed for PostgREST', {
        changed: result.changed,
        kids: result.kids,
        jwks_url: target.jwksUrl,
      });
      break;
    } catch (err) {
      if (Date.now() + delayMs > deadline || signal.aborted) throw err;
      logger.warn('JWKS sync failed; retrying', { error: describe(err), retry_in_ms: delayMs });
      await sleep(delayMs, signal);
    }
  }
  if (options.readyFile !== undefined) await writeFile(options.readyFile, `${new Date().toISOString()}\n`);
  if (options.intervalS === 0) return;
  while (!signal.aborted) {
    await sleep(options.intervalS * 1000, signal);
    if (signal.aborted) break;
    try {
      const result = await syncOnce(db, target);
      if (result.changed) logger.info('JWKS changed; PostgREST told to reload', { kids: result.kids });
      else logger.debug('JWKS unchanged', { kids: result.kids });
    } catch (err) {
      logger.error('JWKS sync failed; the installed keys stay in use', { error: describe(err) });
    }
  }
}

export function targetFromConfig(config: JwksSyncConfig): JwksSyncTarget {
  return {
    issuer: config.OIDC_ISSUER_URL,
    clientId: config.OIDC_CLIENT_ID,
    jwksUrl: config.OIDC_JWKS_URL ?? jwksUrlOf(config.OIDC_ISSUER_URL),
    fetchTimeoutMs: config.JWKS_FETCH_TIMEOUT_MS,
  };
}

function describe(err: unknown): string {
  return errorMessage(err);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}
