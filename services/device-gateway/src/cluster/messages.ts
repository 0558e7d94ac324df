import { isDeviceId } from '@platform/contracts';
import type { Settings } from '../domain/documents.js';

/**
 * The base name of the one LISTEN/NOTIFY channel every replica of the gateway listens on (per database); since
 * migration 0035 the channel is `<base>_<secret>` (channels.ts), as are the two below. Since migration 0017 its
 * notifications are empty wake-ups: the messages are rows (bus_overrides, bus_reload) that only the gateway's
 * login can write, read by change number (design §3.6).
 */
export const BUS_CHANNEL = 'device_gateway_bus';

/**
 * The device view's channel (design §3.8): a replica asks every other one for its live part of one device
 * (relations, DTLS sessions) and they answer here. Apart from BUS_CHANNEL, so a replica of an earlier release
 * never sees these messages (it would count them as malformed).
 */
export const INSPECT_CHANNEL = 'device_gateway_inspect';

/**
 * Rollouts' channel (design §3.9): the driver's step and a rollback NOTIFY here, in their transaction, when
 * assignments changed; every replica then reads them from the database. Apart from BUS_CHANNEL for the same
 * reason as INSPECT_CHANNEL. The payload means only "read"; it is never trusted.
 */
export const ROLLOUT_CHANNEL = 'device_gateway_rollout';

/**
 * PostgreSQL refuses (never truncates) a NOTIFY payload of 8000 bytes or more in a default build
 * (`NOTIFY_PAYLOAD_MAX_LENGTH` = BLCKSZ - NAMEDATALEN - 128; docs: sql-notify.html, "must be shorter than
 * 8000 bytes"). The gateway refuses such a message itself, before anything is published.
 */
export const NOTIFY_PAYLOAD_LIMIT_BYTES = 7999;

/*
 * The bus messages' one-letter field names are a wire format with one reader: the bus's publishing functions
 * (migrations 0002, 0003, 0017: bus_publish_overrides reads m->>'k', 'd', 'v', 'o', 's' to retain an override;
 * bus_publish_reload reads 'k', 'v', 'o'). Since 0017 no message travels in a notification, but the size bound
 * above stays: a message that would not fit one was never meant to be published, and the device view's notices
 * (inspect.ts) still are notifications. The rollout channel's payloads carry only a `k`.
 */

/**
 * An override accepted by one replica. (v, o) orders overrides of one device totally: the larger wins
 * everywhere (last writer wins), so replicas may apply messages in any order, twice, or from the retained table
 * after a gap, and still agree.
 */
export interface OverrideMessage {
  /** Kind: which message this is. */
  k: 'override';
  /** Device id of the device whose settings are overridden (a registry device id). */
  d: string;
  /** Version the accepting replica stamped with its hybrid logical clock (a positive safe integer). */
  v: number;
  /** Origin: the accepting replica's id (1-64 characters of `[A-Za-z0-9._:-]`); breaks ties between versions. */
  o: string;
  /** Settings: the override's Device Settings, which replace the registry's (checked again on arrival). */
  s: Settings;
}

/**
 * An override cleared (migration 0024): the retained row of the device with NULL settings, a tombstone. It takes part
 * in last writer wins on (version, origin) as an override does, so it beats the override it clears everywhere, in
 * any order, and a replica holding that override does not publish it again at a resync. Never sent by a replica
 * as a payload: written by bus_clear_override (DELETE /api/devices/{id}/override) or by a rollout's step that
 * assigns the device (origin `rollout`, design §3.3).
 */
export interface ClearMessage {
  k: 'clear';
  /** Device id whose override ends. */
  d: string;
  /** Version: above the cleared override's; the next layer is served under it where it can be. */
  v: number;
  /** Origin: the clearing replica's id, or `rollout`. */
  o: string;
}

/** "The registry changed, reload it". */
export interface ReloadMessage {
  /** Kind: which message this is. */
  k: 'reload';
  /** Version: the sender's clock when it asked; lifts receivers' clocks above every version the sender issued. */
  v: number;
  /** Origin: the sending replica's id. */
  o: string;
}

export type BusMessage = OverrideMessage | ReloadMessage;

/** What a device's retained row says: its override, or that it was cleared. */
export type RetainedMessage = OverrideMessage | ClearMessage;

const ORIGIN_PATTERN = /^[A-Za-z0-9._:-]{1,64}$/;

export function encodeMessage(message: BusMessage): string {
  return JSON.stringify(message);
}

/** Parses a message from its JSON text (the wire format the publishing functions read); see checkMessage. */
export function decodeMessage(payload: string): BusMessage | ClearMessage | undefined {
  let data: unknown;
  try {
    data = JSON.parse(payload);
  } catch {
    return undefined;
  }
  return checkMessage(data);
}

/**
 * A message as a replica reads it from the bus's rows (migration 0017): written only through the gateway login's
 * publishing functions, and still checked field by field here (settings against the Device Settings schema by
 * the caller), so a row that is somehow wrong is dropped and counted rather than applied. `undefined`: malformed.
 */
export function checkMessage(data: unknown): BusMessage | ClearMessage | undefined {
  if (typeof data !== 'object' || data === null || Array.isArray(data)) return undefined;
  const m = data as Record<string, unknown>;
  if (!Number.isSafeInteger(m.v) || (m.v as number) <= 0) return undefined;
  if (typeof m.o !== 'string' || !ORIGIN_PATTERN.test(m.o)) return undefined;
  if (m.k === 'reload') return { k: 'reload', v: m.v as number, o: m.o };
  if (m.k !== 'override' && m.k !== 'clear') return undefined;
  if (!isDeviceId(m.d)) return undefined;
  if (m.k === 'clear') return { k: 'clear', d: m.d, v: m.v as number, o: m.o };
  if (typeof m.s !== 'object' || m.s === null || Array.isArray(m.s)) return undefined;
  return { k: 'override', d: m.d, v: m.v as number, o: m.o, s: m.s as Settings };
}

/** Whether `a` supersedes `b` (same device): higher version, ties broken by origin id. */
export function supersedes(a: { v: number; o: string }, b: { v: number; o: string }): boolean {
  return a.v > b.v || (a.v === b.v && a.o > b.o);
}
