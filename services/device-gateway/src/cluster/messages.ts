import { isDeviceId } from '@platform/contracts';
import type { Settings } from '../domain/documents.js';

/** The one LISTEN/NOTIFY channel every replica of the gateway listens on (per database). */
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
 * The bus messages' one-letter field names are not forced by NOTIFY_PAYLOAD_LIMIT_BYTES: the largest message,
 * an override, is its settings (whose document must fit one CoAP datagram, ~1 KiB) and a device id (at most
 * 128 characters), far below 8000 bytes with any names. They stay because they are a wire format with two
 * other readers: the bus's SQL functions (migrations 0002, 0003: bus_publish_overrides reads m->>'k', 'd',
 * 'v', 'o', 's' to retain an override; bus_publish_reload checks 'k'), and replicas of the previous release
 * during a rolling update, which drop a message whose fields they do not know. Longer names would need a new
 * migration and a release that reads both. The device view's messages (inspect.ts) are short for the same
 * reason (migration 0005's inspect_answer writes its notice); the rollout channel's payloads carry only a `k`.
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

const ORIGIN_PATTERN = /^[A-Za-z0-9._:-]{1,64}$/;

export function encodeMessage(message: BusMessage): string {
  return JSON.stringify(message);
}

/**
 * Parses a payload from the channel. NOTIFY has no privileges in PostgreSQL (any session of the database can
 * send on any channel), so nothing is trusted: anything malformed is `undefined` (dropped and counted), and
 * override settings are checked against the Device Settings schema by the caller.
 */
export function decodeMessage(payload: string): BusMessage | undefined {
  let data: unknown;
  try {
    data = JSON.parse(payload);
  } catch {
    return undefined;
  }
  if (typeof data !== 'object' || data === null || Array.isArray(data)) return undefined;
  const m = data as Record<string, unknown>;
  if (!Number.isSafeInteger(m.v) || (m.v as number) <= 0) return undefined;
  if (typeof m.o !== 'string' || !ORIGIN_PATTERN.test(m.o)) return undefined;
  if (m.k === 'reload') return { k: 'reload', v: m.v as number, o: m.o };
  if (m.k !== 'override') return undefined;
  if (!isDeviceId(m.d)) return undefined;
  if (typeof m.s !== 'object' || m.s === null || Array.isArray(m.s)) return undefined;
  return { k: 'override', d: m.d, v: m.v as number, o: m.o, s: m.s as Settings };
}

/** Whether `a` supersedes `b` (same device): higher version, ties broken by origin id. */
export function supersedes(a: { v: number; o: string }, b: { v: number; o: string }): boolean {
  return a.v > b.v || (a.v === b.v && a.o > b.o);
}
