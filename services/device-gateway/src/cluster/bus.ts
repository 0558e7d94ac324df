// The replica bus (design §3.6): several gateway replicas behind one Service share overrides and reloads over
// PostgreSQL. How it holds together:
//
// - Publishing. A replica that accepts notify-settings stamps the override with its version clock and calls
//   `device_gateway.bus_publish_overrides([payload, ...])`: one statement, so one transaction, that keeps the message
//   as the device's retained override (last writer wins on (version, origin)) under a new change number; after
//   the commit the publisher sends an empty NOTIFY in a statement of its own (busSql.wakeReplicas). The HTTP
//   answer `updated` waits for the publishing statement, so the caller hears `updated` only for a committed
//   message; a database that cannot be reached is a 503.
// - Delivery. A notification carries no authority (migration 0017): PostgreSQL has no privilege for NOTIFY or
//   LISTEN, so any session of the database could send anything and hear everything. Every replica holds one
//   dedicated LISTEN connection (listener.ts), on channel names that carry a secret of the installation
//   (channels.ts, migration 0035), so no other login's notifications reach that connection at all (a stranger's
//   flood on a guessable name kept the heartbeat and bus_join waiting behind it, a cold review); a notification
//   on the bus channel only wakes it to read the rows changed since the last change number it read
//   (bus_overrides, bus_reload), which only the gateway's login can write, through the publishing functions. The
//   publisher reads its own change too; it also applies it directly after the commit, and the (version, origin)
//   rule makes whichever comes second a no-op.
// - Versions. See version-clock.ts: the accepting replica stamps the override, every replica observes the
//   stamp (HLC receive rule) and, where it can, serves the override under that very version, so a device that
//   moves between replicas sees the same version for the same override and a higher one for any later change.
//   The retained table keeps the stamps, so a restarted replica's clock starts above all of them even if its
//   wall clock lags. A stamp too far ahead is refused and logged, in the publishing function (60 s past the
//   database's clock) and in every replica (70 s past its own, version-clock.ts): one poisoned
//   version would otherwise hold every later one hostage up to 2^53 - 1.
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
//   reads every retained override and the change number the bus stands at. Anything committed before the LISTEN
//   is in what it reads, anything after wakes it, and change numbers become visible in their order, so reading
//   on from the last one loses nothing; until the resync is done the replica reports not ready.
// - Files. listener.ts holds the connection (reconnect, heartbeat), bus-sql.ts the SQL, replica.ts what a
//   message means (pure, unit-tested without a database); this file runs them together.
import { randomUUID } from 'node:crypto';
import { errorMessage, type Logger } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type pg from 'pg';
import type { GatewayDatabase } from '../db/tables.js';
import { UnknownDeviceError, type Override, type SettingsValidator } from '../domain/gateway-state.js';
import type { VersionClock } from '../domain/version-clock.js';
import * as busSql from './bus-sql.js';
import { ListenConnection, type ListenerStatus } from './listener.js';
import {
  BUS_CHANNEL,
  INSPECT_CHANNEL,
  ROLLOUT_CHANNEL,
  encodeMessage,
  NOTIFY_PAYLOAD_LIMIT_BYTES,
  type BusMessage,
  type OverrideMessage,
} from './messages.js';
import { Replica, type Decision, type OverrideTarget, type ReplicaStats } from './replica.js';

/** Messages per publishing transaction at most (~1.3 KB each at worst: well under a megabyte). */
const MAX_BATCH = 500;
/** Changes read per statement after a wake-up (a page; the read goes on until a page is short). */
const CHANGES_PAGE = 1000;
/**
 * After a read that found nothing new, the next wake-up waits this long (ms). Anyone may NOTIFY the channel; a
 * stranger's flood of wake-ups then costs each replica at most 50 empty indexed reads a second, and a real change
 * arriving during such a flood at most this much delay.
 */
const EMPTY_READ_GAP_MS = 20;
/**
 * Every replica also reads the bus's rows this often (ms), woken or not: a wake-up can be lost (the cluster's
 * NOTIFY queue full, see busSql.wakeReplicas), and then a change reaches the other replicas this much later.
 */
const POLL_MS = 1000;

export type BusStatus = ListenerStatus;

/** A message the bus will not send: larger than PostgreSQL NOTIFY carries. Nothing was published. */
export class BusMessageTooLargeError extends Error {
  constructor(
    readonly bytes: number,
    readonly limitBytes: number,
  ) {
    super(`the message would take ${bytes} bytes; PostgreSQL NOTIFY carries at most ${limitBytes}`);
    this.name = 'BusMessageTooLargeError';
  }
}

/** Publishing failed in the database (unreachable, timed out, refused); `cause` is the database's error. */
export class BusPublishError extends Error {
  constructor(cause: unknown) {
    super(`publishing on the replica bus failed: ${errorMessage(cause)}`, { cause });
    this.name = 'BusPublishError';
  }
}

export interface ClusterBusOptions {
  /** The gateway's own login; the listener is one more connection of it. */
  databaseUrl: string;
  /** The pool, for publishing and resync reads. */
  db: Kysely<GatewayDatabase>;
  /** Where overrides are applied (GatewayState). */
  state: OverrideTarget;
  /** Reloads this replica's registry (RegistryLoader.reload, which coalesces). */
  registry: { reload(): Promise<unknown> };
  clock: VersionClock;
  validateSettings: SettingsValidator;
  logger: Logger;
  /** Reconnect backoff: first delay and cap, in ms (doubling, with ±20 % jitter). */
  reconnectMinMs: number;
  reconnectMaxMs: number;
  /** A `SELECT 1` on the listener this often (ms) finds a silently dead connection. */
  heartbeatMs: number;
  /** This replica's id (default: a new one, newReplicaId); the delivery record names replicas by it. */
  origin?: string;
  /** After every resync (the bus session was up again): the delivery record re-reports relations (§3.8). */
  onSynchronised?: () => void;
  /** The device view's requests and answers between replicas (design §3.8), on their own channel. */
  inspector?: { receive(payload: string, senderPid: number): void };
  /**
   * Rollout assignments (design §3.9): read again at every resync (before the registry, so a device enters it
   * with its assignment) and whenever the rollout channel says they changed.
   */
  rollouts?: { receive(): void; sync(): Promise<void> };
}

export interface BusStats extends ReplicaStats {
  published: number;
  /** Notifications on the bus channel (anyone's: each only makes this replica read the bus's rows). */
  wakeups: number;
  reconnects: number;
  resyncs: number;
}

export class ClusterBus {
  /** This replica's id in messages: random per process, so a restarted replica is a new origin. */
  readonly origin: string;
  private readonly replica: Replica;
  private readonly listener: ListenConnection;
  private published = 0;
  private resyncs = 0;
  private synced = false;
  /** Settles at the first resync (or at stop): what start() waits for. */
  private firstSyncDone: () => void = () => undefined;
  private readonly firstSync = new Promise<void>((resolve) => (this.firstSyncDone = resolve));
  /** bus_join() ran (once per process, see join()). */
  private joined = false;
  private readonly outbox: {
    payload: string;
    resolve: (written: busSql.Written) => void;
    reject: (err: unknown) => void;
  }[] = [];
  private flushing = false;
  /** The last change number read from the bus's rows (readRetained at a resync, then readChanges). */
  private lastSeq = 0;
  /** The one read of the bus's rows in flight (a resync's or a wake-up's); another waits behind it. */
  private reading: Promise<void> | undefined;
  private readAgain = false;
  private quietUntil = 0;
  private quietTimer: NodeJS.Timeout | undefined;
  private pollTimer: NodeJS.Timeout | undefined;
  /** The first resync has read the retained rows: from here on, reads go on from lastSeq. */
  private retainedRead = false;
  private wakeups = 0;
  private readonly log: Logger;

  constructor(private readonly options: ClusterBusOptions) {
    this.origin = options.origin ?? newReplicaId();
    this.log = options.logger.child({ component: 'cluster-bus', origin: this.origin });
    this.replica = new Replica({
      origin: this.origin,
      target: options.state,
      clock: options.clock,
      validateSettings: options.validateSettings,
      log: this.log,
    });
    this.listener = new ListenConnection({
      databaseUrl: options.databaseUrl,
      channels: [
        BUS_CHANNEL,
        ...(options.inspector === undefined ? [] : [INSPECT_CHANNEL]),
        ...(options.rollouts === undefined ? [] : [ROLLOUT_CHANNEL]),
      ],
      logger: this.log,
      applicationName: () => this.sessionName(!this.synced),
      reconnectMinMs: options.reconnectMinMs,
      reconnectMaxMs: options.reconnectMaxMs,
      heartbeatMs: options.heartbeatMs,
      onNotification: (payload, channel, senderPid) => {
        if (channel === BUS_CHANNEL) this.wake();
        else if (channel === ROLLOUT_CHANNEL) options.rollouts?.receive();
        else options.inspector?.receive(payload, senderPid);
      },
      onListening: (client) => this.resync(client),
    });
  }

  get status(): BusStatus {
    return this.listener.status;
  }

  /** The listener's backend process id (pg_stat_activity.pid), while connected. */
  get listenerPid(): number | undefined {
    return this.listener.pid;
  }

  get retainedCount(): number {
    return this.replica.retainedCount;
  }

  get stats(): BusStats {
    return {
      ...this.replica.stats,
      published: this.published,
      wakeups: this.wakeups,
      reconnects: this.listener.reconnects,
      resyncs: this.resyncs,
    };
  }

  /**
   * Starts listening in the background, reconnecting forever with backoff; the first resync loads the
   * registry. Resolves once the first resync is done (callers need not wait: readiness says 503 until then).
   */
  start(): Promise<void> {
    this.listener.start();
    this.pollTimer ??= setInterval(() => this.read(), POLL_MS);
    this.pollTimer.unref();
    return this.firstSync;
  }

  async stop(): Promise<void> {
    this.firstSyncDone();
    if (this.quietTimer !== undefined) clearTimeout(this.quietTimer);
    this.quietTimer = undefined;
    if (this.pollTimer !== undefined) clearInterval(this.pollTimer);
    this.pollTimer = undefined;
    await this.listener.stop();
  }

  /**
   * Publishes an override (validated and prepared by the caller) and applies it here; resolves only after
   * the publishing transaction committed. Throws UnknownDeviceError when the registry in the database no
   * longer has the device, BusPublishError when the database fails.
   */
  async publishOverride(override: Override): Promise<void> {
    let message: OverrideMessage = {
      k: 'override',
      d: override.deviceId,
      v: this.options.clock.next(),
      o: this.origin,
      s: override.settings.value,
    };
    let written = await this.publishOnce(message);
    if (written === 'lost') {
      // The retained row (an override or a clear) has a version this clock had not seen yet: stamped by a clock
      // ahead of ours (another replica's, or the database's for a rollout's clear) and not read here yet. The
      // caller, answered `updated`, expects its override to be the last one written: observe that version and
      // publish once more above it. A row that wins again is newer still, a concurrent override: last writer wins.
      const top = await busSql.retainedVersion(this.options.db, override.deviceId).catch((err: unknown) => {
        throw new BusPublishError(err);
      });
      if (top !== undefined && top >= message.v && this.options.clock.observe(top)) {
        message = { ...message, v: this.options.clock.next() };
        written = await this.publishOnce(message);
      }
    }
    // This replica's copy of the registry is a reload behind: nothing was retained or sent, so the caller
    // hears what a current replica would say.
    if (written === 'not_in_registry') throw new UnknownDeviceError(override.deviceId);
    this.published++;
    // Lost: a concurrent override with a higher (version, origin) is already retained and on its way;
    // applying ours now would only flash an older value to the observers.
    if (written === 'written') this.follow(this.replica.accepted(message, override));
  }

  private publishOnce(message: OverrideMessage): Promise<busSql.Written> {
    return this.enqueue(checkedPayload(message)).catch((err: unknown) => {
      throw new BusPublishError(err);
    });
  }

  /**
   * Clears the device's override on every replica (DELETE /api/devices/{id}/override, design §3.3, §3.6): a
   * tombstone row under a new change number (migration 0024), applied here after the commit; the other replicas
   * read it like any change, and one that starts later reads it at its resync. The device gets the next layer
   * under the tombstone's version, which is above the override's and above every version this replica issued.
   * `cleared`: an override was retained. Throws BusPublishError when the database fails.
   */
  async clearOverride(deviceId: string): Promise<{ cleared: boolean; version: number }> {
    let result: { cleared: boolean; version: number };
    try {
      result = await busSql.clearOverride(this.options.db, deviceId, this.options.clock.next(), this.origin);
    } catch (err) {
      throw new BusPublishError(err);
    }
    this.published++;
    this.follow(this.replica.clearedHere({ k: 'clear', d: deviceId, v: result.version, o: this.origin }));
    this.wakeOthers();
    return result;
  }

  /** After this replica reloaded on request: tell every other replica to reload too. */
  async publishReload(): Promise<void> {
    this.replica.reconcile();
    const payload = checkedPayload({ k: 'reload', v: this.options.clock.next(), o: this.origin });
    try {
      await busSql.publishReload(this.options.db, payload);
    } catch (err) {
      throw new BusPublishError(err);
    }
    this.wakeOthers();
    this.published++;
  }

  /**
   * Not ready until the first resync is done, and while the listener is down or catching up, except when
   * the last connect attempt found PostgreSQL unreachable: then no replica can publish anything (every
   * notify-settings answers 503), so nothing is being missed, and the replica keeps serving devices from
   * memory as a single gateway does in a database outage; making every replica unready would instead take
   * the whole device plane off the Service.
   */
  readinessProblems(): string[] {
    const status = this.listener.status;
    if (!this.synced) return [`cluster bus not synchronised yet (${status})`];
    if (status === 'listening' || this.listener.unreachable) return [];
    return [`cluster bus ${status}`];
  }

  describe(): Record<string, unknown> {
    return {
      channel: BUS_CHANNEL,
      origin: this.origin,
      status: this.listener.status,
      synced: this.synced,
      retained_overrides: this.replica.retainedCount,
      ...this.stats,
    };
  }

  /**
   * Group commit: one publishing transaction in flight at a time; overrides accepted meanwhile wait and go
   * together in the next one. At low rates each goes alone (no added delay); under load one commit (and
   * one fsync, one round trip) serves a whole batch, which is what lets one replica accept 1,000/s.
   */
  private enqueue(payload: string): Promise<busSql.Written> {
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
        const written = await busSql.publishOverrides(
          this.options.db,
          batch.map((b) => b.payload),
        );
        batch.forEach((b, i) => b.resolve(written[i]!));
        if (written.includes('written')) this.wakeOthers();
      } catch (err) {
        for (const b of batch) b.reject(err);
      }
    }
    this.flushing = false;
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

  /**
   * After every LISTEN: join (once per process), then the registry (overrides need their devices), then
   * every retained override; what this replica holds and the table lacks goes back in.
   */
  private async resync(client: pg.Client): Promise<void> {
    if (!this.joined) await this.join();
    this.resyncs++;
    await this.options.rollouts?.sync();
    // Where the bus stands before the registry is read: the reload below covers every reload asked for up to
    // here, not one asked for while it runs (a cold review: a reload published between the registry's read and
    // the retained rows' was skipped for good). Reading on from here finds that one, and overrides read twice
    // change nothing.
    const before = await busSql.topSeq(this.options.db);
    await this.reload();
    // In the row reader's turn, so a wake-up's read never interleaves with it.
    const republish = await this.inTurn(async () => {
      const result = this.replica.resync(await busSql.readRetained(this.options.db));
      this.follow(result.decision);
      if (before > this.lastSeq) this.lastSeq = before;
      this.retainedRead = true;
      return result.republish;
    });
    this.read();
    // Last writer wins in the publishing function, so a newer message published meanwhile is never overwritten.
    await Promise.all(republish.map((m) => this.enqueue(encodeMessage(m))));
    this.log.info('cluster bus synchronised', { republished: republish.length });
    this.options.onSynchronised?.();
    if (!this.synced) {
      // Holding overrides from now on: a replica that starts finds this one up and keeps the retained
      // table (bus_join). Reconnects connect under this name from the start (see sessionName).
      await busSql.nameSession(client, this.sessionName(false));
      this.synced = true;
      this.firstSyncDone();
    }
  }

  /**
   * A notification on the bus channel: read the rows changed since the last read (design §3.6). It carries
   * nothing and proves nothing (anyone may NOTIFY), so all it can cause is one read, coalesced with a read under
   * way, and after an empty read not before EMPTY_READ_GAP_MS. Before the first resync there is nothing to read
   * on from: the resync reads everything committed after the LISTEN.
   */
  private wake(): void {
    this.wakeups++;
    this.read();
  }

  /** A read of the bus's rows after a wake-up or on the timer (see wake()). */
  private read(): void {
    if (!this.retainedRead) return;
    if (this.reading !== undefined) {
      this.readAgain = true;
      return;
    }
    const waitMs = this.quietUntil - Date.now();
    if (waitMs > 0) {
      this.quietTimer ??= setTimeout(() => {
        this.quietTimer = undefined;
        this.read();
      }, waitMs);
      this.quietTimer.unref();
      return;
    }
    void this.inTurn(() => this.readChanges()).catch((err: unknown) => {
      // The next wake-up or resync (a broken connection makes one) reads on from the same change number.
      this.log.warn('cluster bus: reading changes failed', { error: errorMessage(err) });
    });
  }

  /** After a commit: wake the other replicas; a lost wake-up only delays them to their next timed read. */
  private wakeOthers(): void {
    busSql.wakeReplicas(this.options.db).catch((err: unknown) => {
      this.log.warn('cluster bus: wake-up not sent; other replicas read it on their timer', {
        error: errorMessage(err),
      });
    });
  }

  /** Reads every change after lastSeq, page by page, and hands each message to the replica logic. */
  private async readChanges(): Promise<void> {
    let found = 0;
    for (;;) {
      const changes = await busSql.readChanges(this.options.db, this.lastSeq, CHANGES_PAGE);
      found += changes.length;
      for (const change of changes) {
        this.follow(this.replica.receive(change.message));
        this.lastSeq = change.seq;
      }
      if (changes.length < CHANGES_PAGE) break;
    }
    this.quietUntil = found === 0 ? Date.now() + EMPTY_READ_GAP_MS : 0;
  }

  /** Runs `read` when no other read of the bus's rows is under way; a wake-up meanwhile reads again after it. */
  private async inTurn<T>(read: () => Promise<T>): Promise<T> {
    while (this.reading !== undefined) await this.reading.catch(() => undefined);
    let done: () => void = () => undefined;
    this.reading = new Promise<void>((resolve) => (done = resolve));
    try {
      return await read();
    } finally {
      this.reading = undefined;
      done();
      if (this.readAgain) {
        this.readAgain = false;
        this.read();
      }
    }
  }

  /**
   * Once per process, before the first resync: when no other replica is up and synchronised, the retained
   * overrides belong to a gateway that has stopped altogether and are cleared (migration 0003), so an override
   * lives exactly as long as the replicas that hold it in memory; the clock still starts above their versions.
   */
  private async join(): Promise<void> {
    const { cleared, topVersion } = await busSql.join(this.options.db);
    if (topVersion !== undefined && !this.options.clock.observe(topVersion)) {
      this.log.error("the retained overrides' top version is not plausible against this clock: not taken", {
        version: topVersion,
      });
    }
    this.joined = true;
    if (cleared > 0) {
      this.log.info('no other replica is up: cleared the overrides retained by the previous gateway', {
        cleared,
      });
    }
  }

  /** This replica's registry (the loader coalesces concurrent requests), then what the reload changed. */
  private async reload(): Promise<void> {
    await this.options.registry.reload();
    this.replica.reconcile();
  }

  private follow(decision: Decision): void {
    if (decision === 'none') return;
    this.reload().catch((err: unknown) => {
      this.log.error('reload requested over the replica bus failed', { error: errorMessage(err) });
    });
  }
}

/** A replica id: random per process (16 hex digits), so a restarted replica is a new one. */
export function newReplicaId(): string {
  return randomUUID().replaceAll('-', '').slice(0, 16);
}

function checkedPayload(message: BusMessage): string {
  const payload = encodeMessage(message);
  const bytes = Buffer.byteLength(payload);
  // Unreachable with Device Settings (a notification fits one CoAP datagram, ~1.1 KB; see the bus test),
  // kept so a future larger message is refused rather than sent and refused by PostgreSQL.
  if (bytes > NOTIFY_PAYLOAD_LIMIT_BYTES)
    throw new BusMessageTooLargeError(bytes, NOTIFY_PAYLOAD_LIMIT_BYTES);
  return payload;
}
