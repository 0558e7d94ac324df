// What a replica does with the bus's messages (design §3.6), without I/O: no connection, no SQL, no timers. It
// keeps the winning override message per device, applies overrides to this replica's state and answers with
// what the bus must do next (reload the registry, republish). bus.ts runs it against PostgreSQL; the unit
// tests run it against a fake state.
import type { Settings } from '../domain/documents.js';
import {
  DocumentTooLargeError,
  UnknownDeviceError,
  type Override,
  type SettingsValidator,
} from '../domain/gateway-state.js';
import type { VersionClock } from '../domain/version-clock.js';
import {
  checkMessage,
  supersedes,
  type ClearMessage,
  type OverrideMessage,
  type RetainedMessage,
} from './messages.js';

/** The part of GatewayState a replica applies overrides to. */
export interface OverrideTarget {
  hasDevice(deviceId: string): boolean;
  /** Throws DocumentTooLargeError. */
  prepareOverride(deviceId: string, settings: Settings): Override;
  /** Throws UnknownDeviceError. */
  applyOverride(override: Override, stampedVersion?: number): unknown;
  /** Ends the device's override, if it has one here (GatewayState.clearOverride). */
  clearOverride(deviceId: string, stampedVersion?: number): boolean;
}

/** What the bus must do after an event: nothing, or reload this replica's registry (coalesced by the loader). */
export type Decision = 'none' | 'reload';

export interface ReplicaStats {
  received: number;
  /** Messages whose version the clock refused (not a safe integer, or far ahead of this replica's clock). */
  refused: number;
  applied: number;
  /** Overrides ended here by a clear (DELETE /api/devices/{id}/override, or a rollout's assignment). */
  cleared: number;
  stale: number;
  malformed: number;
  remoteReloads: number;
}

interface Held {
  /** The device's override, or its clear (a tombstone: kept so an older override is never applied again). */
  message: RetainedMessage;
  /** Undefined for a clear, and when the override does not fit a datagram on this replica (never applied here). */
  override: Override | undefined;
}

export interface ReplicaOptions {
  /** This replica's id in messages (ClusterBus.origin). */
  origin: string;
  target: OverrideTarget;
  clock: VersionClock;
  /** The contracts' Device Settings validator: messages from the channel are checked with it on arrival. */
  validateSettings: SettingsValidator;
  log: ReplicaLog;
}

/** Where dropped messages are reported (the bus's logger). */
export interface ReplicaLog {
  warn(message: string, fields: Record<string, unknown>): void;
  error(message: string, fields: Record<string, unknown>): void;
}

export class Replica {
  readonly stats: ReplicaStats = {
    received: 0,
    refused: 0,
    applied: 0,
    cleared: 0,
    stale: 0,
    malformed: 0,
    remoteReloads: 0,
  };
  /** The winning override or clear per device, as far as this replica knows. */
  private readonly retained = new Map<string, Held>();
  /** Devices whose retained override waits for a reload that brings the device into this registry. */
  private readonly pending = new Set<string>();

  constructor(private readonly options: ReplicaOptions) {}

  /** Overrides held (clears not counted). */
  get retainedCount(): number {
    let n = 0;
    for (const held of this.retained.values()) if (held.message.k === 'override') n++;
    return n;
  }

  /**
   * A message from the bus's rows (migration 0017; bus-sql.ts readChanges). Only the gateway's login writes them,
   * and they are still checked here, once: the fields, an override's settings, and the version against this
   * replica's clock (a version it refuses is dropped and logged, never applied or observed).
   */
  receive(data: unknown): Decision {
    this.stats.received++;
    const message = checkMessage(data);
    if (message === undefined) {
      this.stats.malformed++;
      this.options.log.warn('malformed bus message dropped', {});
      return 'none';
    }
    if (!this.options.clock.observe(message.v)) {
      this.stats.refused++;
      this.options.log.error('bus message refused: its version is not plausible against this clock', {
        kind: message.k,
        version: message.v,
        origin: message.o,
        ...(message.k === 'override' ? { device_id: message.d } : {}),
      });
      return 'none';
    }
    if (message.k === 'override') return this.offer(message);
    if (message.k === 'clear')
      return this.outdated(message) ? 'none' : this.hold({ message, override: undefined });
    // The sender reloaded itself before publishing.
    if (message.o === this.options.origin) return 'none';
    this.stats.remoteReloads++;
    return 'reload';
  }

  /**
   * An override this replica accepted (validated and prepared at the HTTP edge) and committed as the
   * retained message: applied without another check.
   */
  accepted(message: OverrideMessage, override: Override): Decision {
    // Its own echo from the channel may have come first; a newer message may too.
    if (this.outdated(message)) return 'none';
    return this.hold({ message, override });
  }

  /** A clear this replica committed (ClusterBus.clearOverride): applied here at once. */
  clearedHere(message: ClearMessage): Decision {
    if (this.outdated(message)) return 'none';
    return this.hold({ message, override: undefined });
  }

  /**
   * A resync (after every LISTEN): the retained table's rows, checked as receive() checks them. Returns what this
   * replica holds and the table lacks (or holds older), to be published again: after a LISTEN gap during which
   * a replica starting alone cleared the table (bus_join), the live replicas' overrides are retained again.
   */
  resync(rows: readonly RetainedMessage[]): { decision: Decision; republish: OverrideMessage[] } {
    let decision: Decision = 'none';
    const inTable = new Map<string, RetainedMessage>();
    for (const row of rows) {
      inTable.set(row.d, row);
      if (this.receive(row) === 'reload') decision = 'reload';
    }
    const republish: OverrideMessage[] = [];
    for (const { message } of this.retained.values()) {
      // A clear is not published again: where the table lacks it, no override is retained to beat.
      if (message.k !== 'override') continue;
      const retained = inTable.get(message.d);
      if (retained === undefined || supersedes(message, retained)) republish.push(message);
    }
    return { decision, republish };
  }

  /** After a reload: forget overrides of devices that left the registry, apply those whose device arrived. */
  reconcile(): void {
    for (const [deviceId, held] of this.retained) {
      if (!this.options.target.hasDevice(deviceId)) {
        this.retained.delete(deviceId);
        this.pending.delete(deviceId);
      } else if (this.pending.has(deviceId)) {
        this.apply(held);
      }
    }
  }

  /** An override from outside this process: ordered first (cheap), then checked once. */
  private offer(message: OverrideMessage): Decision {
    if (this.outdated(message)) return 'none';
    const valid = Object.keys(message.s).length > 0 && this.options.validateSettings(message.s).ok;
    if (!valid) {
      this.stats.malformed++;
      this.options.log.warn('bus override with invalid settings dropped', { device_id: message.d });
      return 'none';
    }
    let override: Override | undefined;
    try {
      override = this.options.target.prepareOverride(message.d, message.s);
    } catch (err) {
      if (!(err instanceof DocumentTooLargeError)) throw err;
      // Only when replicas run with different COAP_MAX_TOKEN_LENGTH; the device keeps its current document.
      this.options.log.error('bus override does not fit a datagram on this replica', {
        device_id: message.d,
      });
    }
    return this.hold({ message, override });
  }

  /** Whether the retained message is this one or a newer one (last writer wins on (version, origin)). */
  private outdated(message: RetainedMessage): boolean {
    const current = this.retained.get(message.d)?.message;
    if (current === undefined || supersedes(message, current)) return false;
    if (current.v !== message.v || current.o !== message.o) this.stats.stale++;
    return true;
  }

  private hold(held: Held): Decision {
    this.retained.set(held.message.d, held);
    return this.apply(held);
  }

  private apply(held: Held): Decision {
    const deviceId = held.message.d;
    if (held.message.k === 'clear') {
      this.pending.delete(deviceId);
      // Served the next layer under the clear's version (above the override's) where it can be.
      if (this.options.target.clearOverride(deviceId, held.message.v)) this.stats.cleared++;
      return 'none';
    }
    if (held.override === undefined) {
      this.pending.delete(deviceId);
      return 'none';
    }
    try {
      this.options.target.applyOverride(held.override, held.message.v);
    } catch (err) {
      if (!(err instanceof UnknownDeviceError)) throw err;
      // The accepting replica knows this device and this one does not: its registry is older. One reload
      // per waiting device; reconcile() applies the override if the device is there after it.
      if (this.pending.has(deviceId)) return 'none';
      this.pending.add(deviceId);
      return 'reload';
    }
    this.pending.delete(deviceId);
    this.stats.applied++;
    return 'none';
  }
}
