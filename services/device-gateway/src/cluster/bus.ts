// The replica bus (design §3.6): several gateway replicas behind one Service share overrides and reloads over
// PostgreSQL LISTEN/NOTIFY. How it holds together:
//
// - Publishing. A replica that accepts notify-settings stamps the override with its version clock and calls
//   `device_gateway.bus_publish_overrides([payload, ...])`: one statement, so one transaction, that keeps the message
//   as the device's retained override (last writer wins on (version, origin)) and `pg_notify`s it. NOTIFY is
//   delivered only when that transaction commits, and the HTTP answer `updated` waits for the statement, so
//   the caller hears `updated` only for a committed message; a database that cannot be reached is a 503.
// - Delivery. Every replica holds one dedicated `pg.Client` that LISTENs (a pooled connection cannot: the
//   pool hands it to other queries and may close it). The publisher receives its own message too; it also
//   applies it directly after the commit, and the (version, origin) rule makes whichever comes second a no-op.
// - Versions. See version-clock.ts: the accepting replica stamps the override, every replica observes the
//   stamp (HLC receive rule) and, where it can, serves the override under that very version, so a device that
//   moves between replicas sees the same version for the same override and a higher one for any later change.
//   The retained table keeps the stamps, so a restarted replica's clock starts above all of them even if its
//   wall clock lags.
// - Retained overrides. The in-memory override is still never written to the registry; what the database
//   keeps is the last *message* per device (like an MQTT retained message), because a replica that starts
//   later, or whose LISTEN connection broke, was not listening when the message went by and must still serve
//   the current override to a device that re-observes it there. Reload-registry drops retained messages of
//   devices that left the registry, the rule a single process applied to its in-memory overrides.
// - Lifetime. The override stays memory only (design §3.6): the retained table mirrors what live replicas hold
//   and never outlives them. A process joining while no other replica is up clears it
//   (`device_gateway.bus_join()`, migration 0003), so a gateway that stops altogether forgets its overrides
//   exactly as one process does, while a rolling restart keeps them. "Up" is a LISTEN session of this
//   login not named `... joining` (see sessionName). At every resync a replica puts back what it
//   holds and the table lacks.
// - Gaps. After every (re)connect the replica LISTENs first and then resynchronises: reloads the registry and
//   reads every retained override. Anything committed before the LISTEN is in what it reads, anything after
//   arrives as a notification, so a broken connection loses nothing; until the resync is done the replica
//   reports not ready.
import { randomUUID } from 'node:crypto';
import { DomainError, errorMessage, isConnectionError, type Logger, mapDbError } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import type { GatewayDatabase } from '../db/tables.js';
import type { Settings } from '../domain/documents.js';
import {
  DocumentTooLargeError,
  UnknownDeviceError,
  type GatewayState,
  type ReloadSummary,
  type SettingsValidator,
} from '../domain/gateway-state.js';
import type { VersionClock } from '../domain/version-clock.js';
import {
  BUS_CHANNEL,
  decodeMessage,
  encodeMessage,
  NOTIFY_PAYLOAD_LIMIT_BYTES,
  supersedes,
  type BusMessage,
  type OverrideMessage,
} from './messages.js';

/** What bus_publish_overrides did with one message (migration 0003). */
type Written = 'written' | 'lost' | 'not_in_registry';

/** Messages per publishing transaction at most (~1.3 KB each at worst: well under a megabyte). */
const MAX_BATCH = 500;

export type BusStatus = 'stopped' | 'connecting' | 'resyncing' | 'listening';

export interface ClusterBusOptions {
  /** The gateway's own login; the listener is one more connection of it. */
  databaseUrl: string;
  /** The pool, for publishing and resync reads. */
  db: Kysely<GatewayDatabase>;
  state: GatewayState;
  clock: VersionClock;
  /** Reloads this replica's registry only (GatewayService.reload). */
  reload: () => Promise<ReloadSummary>;
  validateSettings: SettingsValidator;
  logger: Logger;
  /** Reconnect backoff: first delay and cap, in ms (doubling, with ±20 % jitter). */
  reconnectMinMs: number;
  reconnectMaxMs: number;
  /** A `SELECT 1` on the listener this often (ms) finds a silently dead connection. */
  heartbeatMs: number;
}

export interface BusStats {
  received: number;
  published: number;
  applied: number;
  stale: number;
  malformed: number;
  reconnects: number;
  resyncs: number;
  remoteReloads: number;
}

export class ClusterBus {
  /** This replica's id in messages: random per process, so a restarted replica is a new origin. */
  readonly origin = randomUUID().replaceAll('-', '').slice(0, 16);
  readonly stats: BusStats = {
    received: 0,
    published: 0,
    applied: 0,
    stale: 0,
    malformed: 0,
    reconnects: 0,
    resyncs: 0,
    remoteReloads: 0,
  };
  private statusValue: BusStatus = 'stopped';
  private synced = false;
  /** Settles at the first resync (or at stop): what start() waits for. */
  private firstSyncDone: () => void = () => undefined;
  private readonly firstSync = new Promise<void>((resolve) => (this.firstSyncDone = resolve));
  /** The last connect attempt failed because PostgreSQL could not be reached (see readinessProblems). */
  private unreachable = false;
  private stopping = false;
  /** bus_join() ran (once per process, see join()). */
  private joined = false;
  private client: pg.Client | undefined;
  private backendPid: number | undefined;
  private running: Promise<void> | undefined;
  private wake: (() => void) | undefined;
  /** The winning override message per device, as far as this replica knows. */
  private readonly retained = new Map<string, OverrideMessage>();
  /** Retained overrides not applied yet because the device is not in this replica's registry (yet). */
  private readonly pending = new Set<string>();
  private readonly outbox: {
    payload: string;
    resolve: (written: Written) => void;
    reject: (err: unknown) => void;
  }[] = [];
  private flushing = false;
  private reloadLoop: Promise<void> | undefined;
  private reloadWanted = false;
  private readonly log: Logger;

  constructor(private readonly options: ClusterBusOptions) {
    this.log = options.logger.child({ component: 'cluster-bus', origin: this.origin });
  }

  get status(): BusStatus {
    return this.statusValue;
  }

  /** The listener's backend process id (pg_stat_activity.pid), while connected. */
  get listenerPid(): number | undefined {
    return this.backendPid;
  }

  get retainedCount(): number {
    return this.retained.size;
  }

  /**
   * Starts listening in the background, reconnecting forever with backoff; the first resync loads the
   * registry. Resolves once the first resync is done (callers need not wait: readiness says 503 until then).
   */
  start(): Promise<void> {
    this.stopping = false;
    this.running ??= this.run();
    return this.firstSync;
  }

  async stop(): Promise<void> {
    this.stopping = true;
    this.firstSyncDone();
    this.wake?.();
    const client = this.client;
    if (client !== undefined) await client.end().catch(() => undefined);
    await this.running;
    this.running = undefined;
    this.statusValue = 'stopped';
  }

  /**
   * Publishes an override and applies it here; resolves only after the publishing transaction committed.
   * The caller has already checked the device and the size (GatewayState.checkOverride).
   */
  async publishOverride(deviceId: string, settings: Settings): Promise<void> {
    const message: OverrideMessage = {
      k: 'override',
      d: deviceId,
      v: this.options.clock.next(),
      o: this.origin,
      s: settings,
    };
    const payload = this.checkedPayload(message);
    let written: Written;
    try {
      written = await this.enqueue(payload);
    } catch (err) {
      throw mapDbError(err);
    }
    // The registry in the database no longer has the device enabled (this replica's copy is a reload
    // behind): nothing was retained or sent, so the caller hears what a current replica would say.
    if (written === 'not_in_registry') throw new UnknownDeviceError(deviceId);
    this.stats.published++;
    // Lost: a concurrent override with a higher (version, origin) is already retained and on its way;
    // applying ours now would only flash an older value to the observers.
    if (written === 'written') this.receiveOverride(message);
  }

  /**
   * Group commit: one publishing transaction in flight at a time; overrides accepted meanwhile wait and go
   * together in the next one. At low rates each goes alone (no added delay); under load one commit (and
   * one fsync, one round trip) serves a whole batch, which is what lets one replica accept 1,000/s.
   */
  private enqueue(payload: string): Promise<Written> {
    return new Promise((resolve, reject) => {
      this.outbox.push({ payload, resolve, reject });
      if (!this.flushing) void this.flush();
    });
  }

  private async flush(): Promise<void> {
    this.flushing = true;
    while (this.outbox.length > 0) {
      const batch = this.outbox.splice(0, MAX_BATCH);
      try {
        const result = await sql<{ written: (boolean | null)[] }>`
          SELECT device_gateway.bus_publish_overrides(${batch.map((b) => b.payload)}::text[]) AS written`.execute(
          this.options.db,
        );
        // Per message: true retained and sent, false lost to a newer one, NULL device not in the registry.
        const written: (boolean | null)[] = result.rows[0]?.written ?? [];
        batch.forEach((b, i) =>
          b.resolve(written[i] === true ? 'written' : written[i] === false ? 'lost' : 'not_in_registry'),
        );
      } catch (err) {
        for (const b of batch) b.reject(err);
      }
    }
    this.flushing = false;
  }

  /** After this replica reloaded on request: tell every other replica to reload too. */
  async publishReload(): Promise<void> {
    this.reconcile();
    const payload = this.checkedPayload({ k: 'reload', v: this.options.clock.next(), o: this.origin });
    try {
      await sql`SELECT device_gateway.bus_publish_reload(${payload})`.execute(this.options.db);
    } catch (err) {
      throw mapDbError(err);
    }
    this.stats.published++;
  }

  /**
   * Not ready until the first resync is done, and while the listener is down or catching up, except when
   * the last connect attempt found PostgreSQL unreachable: then no replica can publish anything (every
   * notify-settings answers 503), so nothing is being missed, and the replica keeps serving devices from
   * memory as a single gateway does in a database outage; making every replica unready would instead take
   * the whole device plane off the Service.
   */
  readinessProblems(): string[] {
    if (!this.synced) return [`cluster bus not synchronised yet (${this.statusValue})`];
    if (this.statusValue === 'listening' || this.unreachable) return [];
    return [`cluster bus ${this.statusValue}`];
  }

  describe(): Record<string, unknown> {
    return {
      channel: BUS_CHANNEL,
      origin: this.origin,
      status: this.statusValue,
      synced: this.synced,
      retained_overrides: this.retained.size,
      ...this.stats,
    };
  }

  private checkedPayload(message: BusMessage): string {
    const payload = encodeMessage(message);
    const bytes = Buffer.byteLength(payload);
    // Unreachable with Device Settings (a notification fits one CoAP datagram, ~1.1 KB; see the bus test),
    // kept so a future larger message is refused rather than sent and refused by PostgreSQL.
    if (bytes > NOTIFY_PAYLOAD_LIMIT_BYTES) {
      throw new DomainError(
        'payload_too_large',
        `The message would take ${bytes} bytes; PostgreSQL NOTIFY carries at most ${NOTIFY_PAYLOAD_LIMIT_BYTES}.`,
      );
    }
    return payload;
  }

  private async run(): Promise<void> {
    let delayMs = this.options.reconnectMinMs;
    while (!this.stopping) {
      this.statusValue = 'connecting';
      let connected = false;
      try {
        const { client, closed } = await this.connect();
        connected = true;
        this.unreachable = false;
        if (!this.joined) await this.join(client);
        await this.resync();
        if (this.stopping) break;
        if (!this.synced) {
          // Holding overrides from now on: a replica that starts finds this one up and keeps the retained
          // table (bus_join). Reconnects connect under this name from the start (see sessionName).
          await client.query(`SELECT set_config('application_name', $1, false)`, [this.sessionName(false)]);
        }
        this.statusValue = 'listening';
        this.synced = true;
        this.firstSyncDone();
        delayMs = this.options.reconnectMinMs;
        const reason = await closed;
        if (this.stopping) break;
        this.log.warn('listener connection lost; reconnecting', { error: reason });
      } catch (err) {
        if (this.stopping) break;
        if (!connected) this.unreachable = isConnectionError(err);
        this.log.warn('cluster bus connect or resync failed; retrying', {
          error: errorMessage(err),
          retry_in_ms: delayMs,
        });
      }
      await this.dropClient();
      if (this.stopping) break;
      this.statusValue = 'connecting';
      this.stats.reconnects++;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, delayMs * (0.8 + 0.4 * Math.random()));
        this.wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.wake = undefined;
      delayMs = Math.min(delayMs * 2, this.options.reconnectMaxMs);
    }
    await this.dropClient();
  }

  /**
   * The LISTEN session's name in pg_stat_activity, which is how bus_join() (migration 0003) tells a replica
   * that is up from one that is starting: ` joining` until this process's first resync, then plain, also on
   * every reconnect, so a replica that holds overrides always counts as up, even while it catches up (and so
   * does a replica of the previous release, which never says ` joining`).
   */
  private sessionName(joining: boolean): string {
    return `device-gateway-bus ${this.origin}${joining ? ' joining' : ''}`;
  }

  /** Connects and LISTENs; `closed` settles when the connection is gone (wrapped: an async function would adopt it). */
  private async connect(): Promise<{ client: pg.Client; closed: Promise<string> }> {
    const client = new pg.Client({
      connectionString: this.options.databaseUrl,
      application_name: this.sessionName(!this.synced),
      // Server-side TCP keepalives (about 1 min): the session of a replica that vanished without closing
      // its connection (a lost node) leaves pg_stat_activity soon, instead of after the kernel's 2 h
      // default, so it neither keeps counting as up in bus_join() nor holds a backend.
      options: '-c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3',
      connectionTimeoutMillis: 5000,
      keepAlive: true,
      query_timeout: Math.max(1000, this.options.heartbeatMs),
    });
    this.client = client;
    let signal: (reason: string) => void = () => undefined;
    const closed = new Promise<string>((resolve) => (signal = resolve));
    client.on('error', (err) => signal(err.message));
    client.on('end', () => signal('connection ended'));
    client.on('notification', (n) => {
      if (n.channel === BUS_CHANNEL) this.receive(n.payload ?? '');
    });
    await client.connect();
    this.backendPid = (client as unknown as { processID?: number }).processID;
    await client.query(`LISTEN ${BUS_CHANNEL}`);
    const heartbeat = setInterval(() => {
      client.query('SELECT 1').catch((err: unknown) => {
        signal(`heartbeat failed: ${errorMessage(err)}`);
        // A connection that does not answer is ended so the loop can replace it.
        void client.end().catch(() => undefined);
      });
    }, this.options.heartbeatMs);
    heartbeat.unref();
    void closed.then(() => clearInterval(heartbeat));
    return { client, closed };
  }

  /**
   * Once per process, before the first resync: when no other replica is up and synchronised, the retained
   * overrides belong to a gateway that has stopped altogether and are cleared (migration 0003), so an override
   * lives exactly as long as the replicas that hold it in memory; the clock still starts above their versions.
   */
  private async join(client: pg.Client): Promise<void> {
    const { rows } = await client.query<{ cleared: number; top_version: string | null }>(
      'SELECT cleared, top_version::text AS top_version FROM device_gateway.bus_join()',
    );
    const result = rows[0];
    if (result?.top_version != null) this.options.clock.observe(Number(result.top_version));
    this.joined = true;
    if (result !== undefined && result.cleared > 0) {
      this.log.info('no other replica is up: cleared the overrides retained by the previous gateway', {
        cleared: result.cleared,
      });
    }
  }

  private async dropClient(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.backendPid = undefined;
    if (client !== undefined) await client.end().catch(() => undefined);
  }

  /** Registry first (overrides need their devices), then every retained override. */
  private async resync(): Promise<void> {
    this.statusValue = 'resyncing';
    this.stats.resyncs++;
    await this.requestReload();
    const rows = await sql<{ device_id: string; version: string; origin: string; settings: Settings }>`
      SELECT device_id, version::text AS version, origin, settings FROM device_gateway.bus_overrides`.execute(
      this.options.db,
    );
    const inTable = new Map<string, { v: number; o: string }>();
    for (const row of rows.rows) {
      const message: OverrideMessage = {
        k: 'override',
        d: row.device_id,
        v: Number(row.version),
        o: row.origin,
        s: row.settings,
      };
      inTable.set(message.d, message);
      this.receiveOverride(message);
    }
    // What this replica holds and the table lacks goes back in: after a LISTEN gap during which a replica
    // starting alone cleared the table (bus_join), the live replicas' overrides are retained again. Last
    // writer wins in the publishing function, so a newer message published meanwhile is never overwritten.
    const missing = [...this.retained.values()].filter((m) => {
      const retained = inTable.get(m.d);
      return retained === undefined || supersedes(m, retained);
    });
    await Promise.all(missing.map((m) => this.enqueue(encodeMessage(m))));
    this.log.info('cluster bus synchronised', {
      retained_overrides: rows.rows.length,
      republished: missing.length,
    });
  }

  private receive(payload: string): void {
    this.stats.received++;
    const message = decodeMessage(payload);
    if (message === undefined) {
      this.stats.malformed++;
      this.log.warn('malformed bus message dropped', { bytes: payload.length });
      return;
    }
    this.options.clock.observe(message.v);
    switch (message.k) {
      case 'override':
        this.receiveOverride(message);
        return;
      case 'reload':
        // The sender reloaded itself before publishing.
        if (message.o === this.origin) return;
        this.stats.remoteReloads++;
        this.requestReload().catch((err: unknown) => {
          this.log.error('reload requested by another replica failed', {
            error: errorMessage(err),
          });
        });
        return;
    }
  }

  private receiveOverride(message: OverrideMessage): void {
    const current = this.retained.get(message.d);
    if (current !== undefined && !supersedes(message, current)) {
      if (current.v !== message.v || current.o !== message.o) this.stats.stale++;
      return;
    }
    const valid = Object.keys(message.s).length > 0 && this.options.validateSettings(message.s).ok;
    if (!valid) {
      this.stats.malformed++;
      this.log.warn('bus override with invalid settings dropped', { device_id: message.d });
      return;
    }
    this.options.clock.observe(message.v);
    this.retained.set(message.d, message);
    this.apply(message);
  }

  private apply(message: OverrideMessage): void {
    try {
      this.options.state.setOverride(message.d, message.s, message.v);
      this.pending.delete(message.d);
      this.stats.applied++;
    } catch (err) {
      if (err instanceof UnknownDeviceError) {
        // The accepting replica knows this device and this one does not: its registry is older. Reload
        // (coalesced); reconcile() applies the override if the device is there now.
        if (!this.pending.has(message.d)) {
          this.pending.add(message.d);
          this.requestReload().catch(() => undefined);
        }
        return;
      }
      if (err instanceof DocumentTooLargeError) {
        // Only when replicas run with different COAP_MAX_TOKEN_LENGTH; the device keeps its current document.
        this.pending.delete(message.d);
        this.log.error('bus override does not fit a datagram on this replica', { device_id: message.d });
        return;
      }
      throw err;
    }
  }

  /** After a reload: forget overrides of devices that left the registry, apply those whose device arrived. */
  private reconcile(): void {
    for (const [deviceId, message] of this.retained) {
      if (this.options.state.settingsDocument(deviceId) === undefined) {
        this.retained.delete(deviceId);
        this.pending.delete(deviceId);
      } else if (this.pending.has(deviceId)) {
        this.apply(message);
      }
    }
  }

  /** Reloads this replica; requests that arrive while one runs are served by one more reload after it. */
  private requestReload(): Promise<void> {
    this.reloadWanted = true;
    this.reloadLoop ??= (async () => {
      try {
        while (this.reloadWanted) {
          this.reloadWanted = false;
          await this.options.reload();
          this.reconcile();
        }
      } finally {
        this.reloadLoop = undefined;
      }
    })();
    return this.reloadLoop;
  }
}
