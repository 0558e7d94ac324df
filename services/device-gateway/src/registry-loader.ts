import { errorMessage, type Logger, mapDbError } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import { loadCredentials } from './db/credential-repository.js';
import { loadRegistry } from './db/registry-repository.js';
import type { GatewayDatabase } from './db/tables.js';
import { CredentialSnapshot, CredentialStore } from './domain/credentials.js';
import type { GatewayState, ReloadSummary } from './domain/gateway-state.js';
import type { ReloadMetrics } from './metrics.js';
import { SiteCatalogue } from './sites/catalogue.js';
import { loadSites } from './sites/repository.js';

/** What a reload did: the registry's summary, and the PSK identities it loaded and invalidated. */
export interface GatewayReloadSummary extends ReloadSummary {
  /** Credentials in the new snapshot (valid now or later). */
  pskIdentities: number;
  /** Credentials of the previous snapshot that this reload invalidated (their sessions must end). */
  pskInvalidated: number;
}

/** Called with the ids (`PskCredential.credentialId`) of credentials whose sessions must end now. */
export type CredentialsChangedListener = (invalidatedIds: string[]) => void;

/** Device ids named in one log line about refused rows (the count says how many there were). */
const MAX_LOGGED_IDS = 20;

/**
 * Longest wait between two expiry checks, in ms. The check is scheduled for the next `not_after`; the cap
 * bounds how late it runs after a wall-clock step (timers run on the monotonic clock, `not_after` is wall
 * time). Handshakes are not affected: a lookup compares with the clock at the moment it runs.
 */
const MAX_EXPIRY_CHECK_DELAY_MS = 60_000;

/**
 * Loads the registry and its device keys from PostgreSQL into this process: the one place reloads run and
 * are coalesced, whoever asks (HTTP, another replica over the bus, the bus's resync).
 */
export class RegistryLoader {
  /** The reload running now, and the one that runs after it for the requests that arrived meanwhile. */
  private running: Promise<GatewayReloadSummary> | undefined;
  private queued: Promise<GatewayReloadSummary> | undefined;
  /** The DTLS pre-shared keys of the loaded registry (design §3.5); the DTLS server looks identities up here. */
  readonly credentials: CredentialStore;
  private readonly credentialListeners: CredentialsChangedListener[] = [];
  private expiryTimer: NodeJS.Timeout | undefined;
  /**
   * The platform's sites as of the last reload or refresh (design §3.2): scopes and the unknown-site check read
   * them. Set only through `takeSites`, by the newest read.
   */
  sites: SiteCatalogue = SiteCatalogue.empty;
  /** Reads of the sites started (reloads and refreshes), and the number of the read whose sites are held. */
  private sitesReads = 0;
  private sitesHeld = 0;
  private sitesTimer: NodeJS.Timeout | undefined;
  private sitesRefreshFailing = false;

  constructor(
    private readonly deps: {
      db: Kysely<GatewayDatabase>;
      state: GatewayState;
      reloadMetrics?: ReloadMetrics;
      credentials?: CredentialStore;
      /** Where a failing credentials listener is reported (it never fails the reload). */
      logger?: Pick<Logger, 'error' | 'warn'>;
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
   * loses its keys in the same reload). One reload runs at a time, and every request is served by a reload
   * that starts after it: requests that arrive while one runs share the next one, so a reload requested
   * after a database change always sees it and a burst of requests costs two reads, not one each. When the
   * database cannot be reached the previous registry and credentials keep serving and the caller gets 503
   * with Retry-After (mapDbError).
   */
  reload(): Promise<GatewayReloadSummary> {
    if (this.running === undefined) return this.start();
    this.queued ??= this.running
      .catch(() => undefined)
      .then(() => {
        this.queued = undefined;
        // A request that came in between started a reload after every queued request: join it.
        return this.running ?? this.start();
      });
    return this.queued;
  }

  private start(): Promise<GatewayReloadSummary> {
    const run = this.readAndSwap();
    this.running = run;
    const done = (): void => {
      if (this.running === run) this.running = undefined;
    };
    run.then(done, done);
    return run;
  }

  /**
   * Re-reads the platform's sites every `intervalMs` between reloads (GATEWAY_SITES_REFRESH_MS): a site handed to
   * another company, added or removed in the portal reaches the scopes within that time instead of at the next
   * reload (second cold review of issue 42). Only the catalogue is swapped; devices are checked against the sites
   * at reloads. A failed read keeps the catalogue and is logged once until a read succeeds. The timer is unref'd.
   */
  refreshSitesEvery(intervalMs: number): void {
    this.stopSitesRefresh();
    const tick = async (): Promise<void> => {
      await this.refreshSites();
      if (this.sitesTimer !== undefined) this.schedule(tick, intervalMs);
    };
    this.schedule(tick, intervalMs);
  }

  /**
   * The platform's sites read now, and held (the newest read wins); rejects with the database's error. A change that
   * must not rest on a catalogue up to GATEWAY_SITES_REFRESH_MS old reads them so (sites/confirm.ts).
   */
  async sitesNow(): Promise<SiteCatalogue> {
    const read = ++this.sitesReads;
    const { catalogue } = await loadSites(this.deps.db);
    this.takeSites(read, catalogue);
    return catalogue;
  }

  /**
   * Re-reads the platform's sites now (the timer's read; also when a change found the catalogue out of date,
   * sites/confirm.ts). Never rejects: a failed read keeps the catalogue and is logged once until a read succeeds.
   */
  async refreshSites(): Promise<void> {
    try {
      await this.sitesNow();
      if (this.sitesRefreshFailing) this.deps.logger?.warn('platform sites read again', {});
      this.sitesRefreshFailing = false;
    } catch (err) {
      if (!this.sitesRefreshFailing)
        this.deps.logger?.warn('platform sites could not be read; scopes keep the last sites read', {
          error: errorMessage(err),
        });
      this.sitesRefreshFailing = true;
    }
  }

  stopSitesRefresh(): void {
    if (this.sitesTimer !== undefined) clearTimeout(this.sitesTimer);
    this.sitesTimer = undefined;
  }

  private schedule(tick: () => Promise<void>, delayMs: number): void {
    this.sitesTimer = setTimeout(() => void tick(), delayMs);
    this.sitesTimer.unref();
  }

  /** Holds the sites of read number `read` unless a read started after it already delivered its own. */
  private takeSites(read: number, catalogue: SiteCatalogue): void {
    if (read < this.sitesHeld) return;
    this.sitesHeld = read;
    this.sites = catalogue;
  }

  private async readAndSwap(): Promise<GatewayReloadSummary> {
    const sitesRead = ++this.sitesReads;
    const timer = this.deps.reloadMetrics?.duration.startTimer();
    let records;
    let credentials;
    let sites;
    try {
      const loaded = await this.deps.db
        .transaction()
        .setIsolationLevel('repeatable read')
        .setAccessMode('read only')
        .execute(async (trx) => ({
          records: await loadRegistry(trx),
          credentials: await loadCredentials(trx),
          sites: await loadSites(trx),
        }));
      records = loaded.records;
      sites = loaded.sites;
      credentials = loaded.credentials;
    } catch (err) {
      timer?.({ outcome: 'failed' });
      throw mapDbError(err);
    }
    // A device must be at one of the platform's sites (issue 42 §1): checked here, at load, rather than by a
    // foreign key, because the gateway's migrations also run without the enterprise schema (design §3.2).
    // Its keys are refused with it: a device the registry does not serve must not hold a DTLS session either.
    const { catalogue } = sites;
    const unplaced = records.filter((r) => !catalogue.knows(r.siteId));
    if (unplaced.length > 0) {
      const refused = new Set(unplaced.map((r) => r.deviceId));
      records = records.filter((r) => !refused.has(r.deviceId));
      credentials = credentials.filter((c) => !refused.has(c.deviceId));
    }
    let snapshot;
    try {
      snapshot = CredentialSnapshot.from(credentials);
    } catch (err) {
      timer?.({ outcome: 'failed' });
      throw mapDbError(err);
    }
    if (unplaced.length > 0)
      this.deps.logger?.warn('registry rows refused: site unknown to the platform', {
        devices: unplaced.length,
        device_ids: unplaced.slice(0, MAX_LOGGED_IDS).map((r) => r.deviceId),
      });
    // The portal's column is free text (enterprise 0001): a zone no IANA name is read as none (design §3.2).
    if (sites.badZones > 0)
      this.deps.logger?.warn('platform sites without an IANA time zone', { sites: sites.badZones });
    this.takeSites(sitesRead, catalogue);
    const loadedSummary = this.deps.state.replaceRegistry(records);
    const summary = {
      ...loadedSummary,
      rejected: [
        ...loadedSummary.rejected,
        ...unplaced.map((r) => ({ deviceId: r.deviceId, reason: 'site unknown to the platform' })),
      ],
    };
    const invalidated = this.credentials.replace(snapshot, Date.now());
    timer?.({ outcome: 'ok' });
    this.credentialsChanged(invalidated);
    this.scheduleExpiryCheck();
    return { ...summary, pskIdentities: snapshot.size, pskInvalidated: invalidated.length };
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
}
