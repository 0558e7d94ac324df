import { mapDbError, type SecretSet } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { CoapServer } from './coap/server.js';
import { publicConfig, type GatewayConfig } from './config.js';
import { loadRegistry } from './db/registry-repository.js';
import type { GatewayDatabase } from './db/tables.js';
import type { Settings } from './domain/documents.js';
import type { GatewayState, ReloadSummary } from './domain/gateway-state.js';
import type { ReloadMetrics } from './metrics.js';

/** The replica bus as the service uses it (issue 8; implemented by cluster/bus.ts). */
export interface ClusterLink {
  /** Resolves after the message is committed and applied here. */
  publishOverride(deviceId: string, settings: Settings): Promise<void>;
  publishReload(): Promise<void>;
  readinessProblems(): string[];
  describe(): Record<string, unknown>;
}

/**
 * What the HTTP edge calls: reload from PostgreSQL, overrides, readiness. Keeps the transport (express)
 * out of the rules and the database out of the domain state.
 */
export class GatewayService {
  private reloading: Promise<unknown> = Promise.resolve();
  private cluster: ClusterLink | undefined;

  constructor(
    private readonly deps: {
      config: GatewayConfig;
      db: Kysely<GatewayDatabase>;
      state: GatewayState;
      coap: CoapServer;
      apiKeys: () => SecretSet;
      reloadMetrics?: ReloadMetrics;
    },
  ) {}

  /**
   * Reads the whole registry and swaps it in. Reloads run one after another, each reading after the previous
   * one finished, so a reload requested after a database change always sees it. When the database cannot
   * be reached the previous registry keeps serving and the caller gets 503 with Retry-After (mapDbError).
   */
  reload(): Promise<ReloadSummary> {
    const run = this.reloading.then(async () => {
      const timer = this.deps.reloadMetrics?.duration.startTimer();
      let records;
      try {
        records = await loadRegistry(this.deps.db);
      } catch (err) {
        timer?.({ outcome: 'failed' });
        throw mapDbError(err);
      }
      const summary = this.deps.state.replaceRegistry(records);
      timer?.({ outcome: 'ok' });
      return summary;
    });
    this.reloading = run.catch(() => undefined);
    return run;
  }

  /** From now on overrides and requested reloads go to every replica through the bus. */
  useCluster(cluster: ClusterLink): void {
    this.cluster = cluster;
  }

  /** A reload asked for over HTTP: this replica, then (when clustered) every other one. */
  async reloadEverywhere(): Promise<ReloadSummary> {
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
