import { mapDbError, type SecretSet } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { ReplicaPart } from './cluster/inspect.js';
import type { GatewayDatabase } from './db/tables.js';
import { deviceList, deviceView, type DeviceListQuery } from './delivery/device-view.js';
import type { CredentialSummary } from './domain/credentials.js';
import type { CoapServer } from './coap/server.js';
import { publicConfig, type GatewayConfig } from './config.js';
import type { Settings } from './domain/documents.js';
import { UnknownDeviceError, type GatewayState, type Override } from './domain/gateway-state.js';
import type { GatewayReloadSummary, RegistryLoader } from './registry-loader.js';
import type { CursorSeal } from './http/cursor-seal.js';
import { withholdUnseenRollouts } from './rollout/names.js';
import type { RolloutService } from './rollout/service.js';
import type { SiteScope } from './rollout/sql.js';
import type { Principal } from './auth/principal.js';
import type { SiteCatalogue } from './sites/catalogue.js';
import { confirmCompanies, type Confirmation } from './sites/confirm.js';
import type { AuditQueue } from './audit/queue.js';
import type { Turns } from './deadline.js';

/** The replica bus as the service uses it (design §3.6; implemented by cluster/bus.ts). */
export interface ClusterLink {
  /** Resolves after the message is committed and applied here. */
  publishOverride(override: Override): Promise<void>;
  publishReload(): Promise<void>;
  readinessProblems(): string[];
  describe(): Record<string, unknown>;
}

/**
 * What the HTTP edge calls: reload from PostgreSQL, overrides, readiness. Keeps the transport (express)
 * out of the rules and the database out of the domain state. Built once with everything it uses: the
 * registry loader and, when replicas share state (design §3.6), the bus.
 */
export class GatewayService {
  constructor(
    private readonly deps: {
      config: GatewayConfig;
      state: GatewayState;
      coap: CoapServer;
      apiKeys: () => SecretSet;
      registry: RegistryLoader;
      cluster?: ClusterLink;
      /** The comparison of this replica's clock with the database's (delivery/db-clock.ts), with the record. */
      clock?: { readinessProblems(): string[] };
      db: Kysely<GatewayDatabase>;
      /** The batched audit rows of notifies (audit/queue.ts). */
      audit: AuditQueue;
      credentials: (deviceId: string) => CredentialSummary;
      /** Staged rollouts (design §3.9). */
      rollouts: RolloutService;
      /** Every replica's live part of a device (the bus's Inspector, or this replica's alone). */
      replicas: (deviceId: string) => Promise<ReplicaPart[]>;
      /** The device view's reads of the delivery record, one at a time (delivery/device-view.ts). */
      recordReads: Turns;
      /** Whether a relation over `transport` speaks for the device (design §3.8). */
      speaks: (deviceId: string, transport: string) => boolean;
      /** Opaque ids and cursors of the lists (http/cursor-seal.ts). */
      cursors: CursorSeal;
    },
  ) {}

  /** Opaque ids and cursors of the lists (http/cursor-seal.ts). */
  get cursors(): CursorSeal {
    return this.deps.cursors;
  }

  /** This replica's registry and keys from PostgreSQL (RegistryLoader.reload). */
  reload(): Promise<GatewayReloadSummary> {
    return this.deps.registry.reload();
  }

  /** A reload asked for over HTTP: this replica, then (when clustered) every other one. */
  async reloadEverywhere(): Promise<GatewayReloadSummary> {
    const summary = await this.reload();
    await this.deps.cluster?.publishReload();
    return summary;
  }

  /**
   * `settings` are valid Device Settings (checked at the edge). Checks what only this replica knows first
   * (unknown device, then size: 404 before 400), so nothing is published that it would refuse; the override
   * is prepared here once and that same object is published and applied.
   */
  async notifySettings(
    deviceId: string,
    settings: Settings,
  ): Promise<{ version: number; relations: number }> {
    const state = this.deps.state;
    if (!state.hasDevice(deviceId)) throw new UnknownDeviceError(deviceId);
    const override = state.prepareOverride(deviceId, settings);
    if (this.deps.cluster === undefined) state.applyOverride(override);
    else await this.deps.cluster.publishOverride(override);
    // What this replica serves now (a concurrent, newer override may have won) and how many of its
    // relations to the device's settings the change was queued for.
    return {
      version: state.settingsDocument(deviceId)?.version ?? 0,
      relations: this.deps.coap.settingsRelationsOf(deviceId),
    };
  }

  /**
   * GET /api/devices/{device_id} (design §3.8), for a caller with `scope` (undefined: every site): a rollout that
   * reaches outside it is not named (rollout/names.ts). Throws UnknownDeviceError.
   */
  async deviceView(deviceId: string, scope?: SiteScope): Promise<Record<string, unknown>> {
    return withholdUnseenRollouts(this.deps.db, await deviceView(this.deps, deviceId), scope);
  }

  /** GET /api/devices (design §3.8). */
  deviceList(
    query: DeviceListQuery,
  ): Promise<{ items: Record<string, unknown>[]; next_cursor: string | null }> {
    return deviceList(this.deps.db, query, (deviceId) => this.deps.state.settingsDocument(deviceId));
  }

  /** The platform's sites as of the last reload (design §3.2): what the routes' site scopes read. */
  get sites(): SiteCatalogue {
    return this.deps.registry.sites;
  }

  /**
   * Whether `siteIds`, which the catalogue let `principal` see, are still its sites now (a change by a caller scoped
   * by companies, sites/confirm.ts); a catalogue found out of date is read again at once.
   */
  confirmSites(principal: Principal, siteIds: readonly string[]): Promise<Confirmation> {
    return confirmCompanies(this.deps.db, principal, siteIds, () => void this.deps.registry.refreshSites());
  }

  /** The platform's sites read now (and held); a database error is the API's problem (503). */
  sitesNow(): Promise<SiteCatalogue> {
    return this.deps.registry.sitesNow().catch((err: unknown) => {
      throw mapDbError(err);
    });
  }

  /** The site of a device of this replica's registry (undefined: not in it). */
  siteOf(deviceId: string): string | undefined {
    return this.deps.state.deviceRecord(deviceId)?.siteId;
  }

  /** Where the notifies' audit rows are queued. */
  get audit(): AuditQueue {
    return this.deps.audit;
  }

  /** Staged rollouts (design §3.9): create, read, list, pause, resume, cancel, roll back. */
  get rollouts(): RolloutService {
    return this.deps.rollouts;
  }

  readinessProblems(): string[] {
    const problems: string[] = [];
    if (!this.deps.state.loaded) problems.push('registry not loaded');
    if (!this.deps.coap.bound) problems.push('CoAP socket not bound');
    if (this.deps.cluster !== undefined) problems.push(...this.deps.cluster.readinessProblems());
    if (this.deps.clock !== undefined) problems.push(...this.deps.clock.readinessProblems());
    return problems;
  }

  publicConfig(): Record<string, unknown> {
    const config = publicConfig(this.deps.config, this.deps.apiKeys());
    const cluster = this.deps.cluster;
    return cluster === undefined ? config : { ...config, cluster: cluster.describe() };
  }
}
