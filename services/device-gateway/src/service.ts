import { errorMessage, type Logger, mapDbError, type SecretSet } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { CoapServer } from './coap/server.js';
import { publicConfig, type GatewayConfig } from './config.js';
import { loadCredentials } from './db/credential-repository.js';
import { loadRegistry } from './db/registry-repository.js';
import type { GatewayDatabase } from './db/tables.js';
import { CredentialSnapshot, CredentialStore } from './domain/credentials.js';
import type { Settings } from './domain/documents.js';
import type { GatewayState, ReloadSummary } from './domain/gateway-state.js';
import type { ReloadMetrics } from './metrics.js';

/** The replica bus as the service uses it (design §3.6; implemented by cluster/bus.ts). */
export interface ClusterLink {
  /** Resolves after the message is committed and applied here. */
  publishOverride(deviceId: string, settings: Settings): Promise<void>;
  publishReload(): Promise<void>;
  readinessProblems(): string[];
  describe(): Record<string, unknown>;
}

/** What a reload did: the registry's summary, and the PSK identities it loaded and invalidated. */
export interface GatewayReloadSummary extends ReloadSummary {
  /** Credentials in the new snapshot (valid now or later). */
  pskIdentities: number;
  /** Credentials of the previous snapshot that this reload invalidated (their sessions must end). */
  pskInvalidated: number;
}

/** Called with the ids (`PskCredential.credentialId`) of credentials whose sessions must end now. */
export type CredentialsChangedListener = (invalidatedIds: string[]) => void;

/**
 * Longest wait between two expiry checks, in ms. The check is scheduled for the next `not_after`; the cap
 * bounds how late it runs after a wall-clock step (timers run on the monotonic clock, `not_after` is wall
 * time). Handshakes are not affected: a lookup compares with the clock at the moment it runs.
 */
const MAX_EXPIRY_CHECK_DELAY_MS = 60_000;

/**
 * What the HTTP edge calls: reload from PostgreSQL, overrides, readiness. Keeps the transport (express)
 * out of the rules and the database out of the domain state.
 */
export class GatewayService {
  private reloading: Promise<unknown> = Promise.resolve();
  private cluster: ClusterLink | undefined;
  /** The DTLS pre-shared keys of the loaded registry (design §3.5); the DTLS server looks identities up here. */
  readonly credentials: CredentialStore;
  private readonly credentialListeners: CredentialsChangedListener[] = [];
  private expiryTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly deps: {
      config: GatewayConfig;
      db: Kysely<GatewayDatabase>;
      state: GatewayState;
      coap: CoapServer;
      apiKeys: () => SecretSet;
      reloadMetrics?: ReloadMetrics;
      credentials?: CredentialStore;
      /** Where a failing credentials listener is reported (it never fails the reload). */
      logger?: Pick<Logger, 'error'>;
    },
  ) {
    this.credentials = deps.credentials ?? new CredentialStore();
  }

  /**
   * `listener` learns which credentials stopped being valid: after a reload (revoked, deleted, expired,
   * device disabled) and when a `not_after` passes between reloads. Never called with an empty list.
   */
  onCredentialsChanged(listener: CredentialsChangedListener): void {
    this.credentialListeners.push(listener);
  }

  /**
   * Reads the whole registry and its credentials and swaps both in. Both are read in one REPEATABLE READ
   * transaction, so the keys match the registry they are loaded with (a device disabled in the same commit
   * loses its keys in the same reload). Reloads run one after another, each reading after the previous one
   * finished, so a reload requested after a database change always sees it. When the database cannot be
   * reached the previous registry and credentials keep serving and the caller gets 503 with Retry-After
   * (mapDbError).
   */
  reload(): Promise<GatewayReloadSummary> {
    const run = this.reloading.then(async () => {
      const timer = this.deps.reloadMetrics?.duration.startTimer();
      let records;
      let snapshot;
      try {
        const loaded = await this.deps.db
          .transaction()
          .setIsolationLevel('repeatable read')
          .setAccessMode('read only')
          .execute(async (trx) => ({
            records: await loadRegistry(trx),
            credentials: await loadCredentials(trx),
          }));
        records = loaded.records;
        snapshot = CredentialSnapshot.from(loaded.credentials);
      } catch (err) {
        timer?.({ outcome: 'failed' });
        throw mapDbError(err);
      }
      const summary = this.deps.state.replaceRegistry(records);
      const invalidated = this.credentials.replace(snapshot, Date.now());
      timer?.({ outcome: 'ok' });
      this.credentialsChanged(invalidated);
      this.scheduleExpiryCheck();
      return { ...summary, pskIdentities: snapshot.size, pskInvalidated: invalidated.length };
    });
    this.reloading = run.catch(() => undefined);
    return run;
  }

  /**
   * Reports the credentials whose `not_after` passed since the last report (each once) to the listeners;
   * returns them. Runs by itself at each `not_after` once a reload has loaded credentials.
   */
  checkCredentialExpiry(nowMs: number = Date.now()): string[] {
    const expired = this.credentials.expiredSince(nowMs);
    this.credentialsChanged(expired);
    return expired;
  }

  /** One timer at a time, for the next `not_after`; unref'd, so it never keeps a stopping process alive. */
  private scheduleExpiryCheck(): void {
    if (this.expiryTimer !== undefined) clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
    const now = Date.now();
    const next = this.credentials.nextExpiryMs(now);
    if (next === undefined) return;
    // +1 ms: a credential expires at `not_after` itself (valid while now < not_after).
    const delay = Math.min(next - now + 1, MAX_EXPIRY_CHECK_DELAY_MS);
    this.expiryTimer = setTimeout(() => {
      this.expiryTimer = undefined;
      this.checkCredentialExpiry();
      this.scheduleExpiryCheck();
    }, delay);
    this.expiryTimer.unref();
  }

  private credentialsChanged(invalidatedIds: string[]): void {
    if (invalidatedIds.length === 0) return;
    for (const listener of this.credentialListeners) {
      try {
        listener(invalidatedIds);
      } catch (err) {
        // A listener's bug must not undo or fail a reload that already swapped the registry in.
        this.deps.logger?.error('credentials listener failed', {
          error: errorMessage(err),
        });
      }
    }
  }

  /** From now on overrides and requested reloads go to every replica through the bus. */
  useCluster(cluster: ClusterLink): void {
    this.cluster = cluster;
  }

  /** A reload asked for over HTTP: this replica, then (when clustered) every other one. */
  async reloadEverywhere(): Promise<GatewayReloadSummary> {
    const summary = await this.reload();
    await this.cluster?.publishReload();
    return summary;
  }

  /** Checks first (404, 400), so nothing is published that this replica would refuse. */
  async notifySettings(deviceId: string, settings: Settings): Promise<void> {
    if (this.cluster === undefined) {
      this.deps.state.setOverride(deviceId, settings);
      return;
    }
    this.deps.state.checkOverride(deviceId, settings);
    await this.cluster.publishOverride(deviceId, settings);
  }

  readinessProblems(): string[] {
    const problems: string[] = [];
    if (!this.deps.state.loaded) problems.push('registry not loaded');
    if (!this.deps.coap.bound) problems.push('CoAP socket not bound');
    if (this.cluster !== undefined) problems.push(...this.cluster.readinessProblems());
    return problems;
  }

  publicConfig(): Record<string, unknown> {
    const config = publicConfig(this.deps.config, this.deps.apiKeys());
    return this.cluster === undefined ? config : { ...config, cluster: this.cluster.describe() };
  }
}
