// `/devices/{id}/reported` (design §3.4, §3.8): a device says what it did with a version of its settings, in
// one datagram, JSON (Content-Format 50) or CBOR (60):
//
//   {"version": 1764358000123456, "outcome": "applied", "settings": {"reporting_interval_s": 240}}
//   {"version": 1764358000123456, "outcome": "rejected", "reason": "threshold_out_of_range"}
//
// Authorised as the device's settings resource is read: a DTLS session speaks for its key's device only (any
// other id is answered 4.04, exactly as an unknown one, so no existence leaks); plain CoAP speaks for a device
// only where it has no key on a gateway that serves coaps (the same rule the delivery record applies to
// relations), else 4.01. Nothing is recorded on any refusal; the answer to a well-formed report waits for the
// record's write (delivery/reports.ts).
import { validateDesiredSettings } from '@platform/contracts';
import type { DeliveryTransport } from '../delivery/recorder.js';
import { decodeCbor, CborError, type CborValue } from './cbor.js';
import {
  BAD_REQUEST,
  CHANGED,
  CONFLICT,
  ContentFormat,
  NOT_FOUND,
  NOT_IMPLEMENTED,
  Opt,
  REQUEST_ENTITY_TOO_LARGE,
  SERVICE_UNAVAILABLE,
  UNAUTHORIZED,
  UNSUPPORTED_CONTENT_FORMAT,
  readUint,
  uintBytes,
  type CoapMessage,
} from './codec.js';
import type { InboundRequest, MessageLayer } from './messages.js';
import type { Relation } from './observe.js';
import { MAX_PAYLOAD_BYTES } from './representations.js';

/** What a device reported about one version of its settings. */
export interface DeviceReport {
  version: number;
  outcome: 'applied' | 'rejected';
  /** Why it rejected the version: `^[a-z][a-z0-9_]{0,63}$`; null with `applied`. */
  reason: string | null;
  /** The settings it says it runs now (the twin's reported document), or null. */
  settings: Record<string, unknown> | null;
}

/**
 * What became of a report (delivery/reports.ts): `recorded`; `older` (accepted, but the record holds a newer
 * report: nothing moves back); `not_issued` (no replica gave the device that version); `unknown` (newer than
 * anything the record knows yet, within the record's lag: ask again); `unknown_device`; `unavailable` (the
 * record could not be written in time).
 */
export type ReportResult = 'recorded' | 'older' | 'not_issued' | 'unknown' | 'unknown_device' | 'unavailable';

export interface ReportSink {
  report(deviceId: string, report: DeviceReport, transport: DeliveryTransport): Promise<ReportResult>;
}

/** What the report resource needs of the gateway. */
export interface ReportDeps {
  /** Where reports are written; undefined when the delivery record is off (GATEWAY_DELIVERY_RECORD=false). */
  sink: ReportSink | undefined;
  /** Whether `transport` may speak for the device (plain CoAP not for a keyed device on a coaps gateway). */
  trusts: (deviceId: string, transport: DeliveryTransport) => boolean;
  /** Whether the device is in the registry and enabled. */
  known: (deviceId: string) => boolean;
  /** Counts each answer by what it was (metrics.ts). */
  count?: (result: ReportResult | ReportRefusal) => void;
}

/** Why a report was refused before it reached the record. */
export type ReportRefusal =
  'malformed' | 'too_large' | 'content_format' | 'forbidden' | 'not_found' | 'disabled';

/** Max-Age (s) of a 5.03 for a report to try again (RFC 7252 §5.9.3.4). */
const RETRY_AFTER_S = 1;

const DIAG = {
  tooLarge: Buffer.from(`report larger than ${MAX_PAYLOAD_BYTES} bytes (one datagram, no block-wise)`),
  format: Buffer.from('Content-Format must be 50 (JSON) or 60 (CBOR)'),
  plain: Buffer.from('this device reports over its DTLS session'),
  disabled: Buffer.from('reports are not recorded by this gateway'),
  notIssued: Buffer.from('version never issued to this device'),
  unknown: Buffer.from('version not known yet; retry'),
  unavailable: Buffer.from('record unavailable; retry'),
} as const;

const REASON = /^[a-z][a-z0-9_]{0,63}$/;
const FIELDS = new Set(['version', 'outcome', 'reason', 'settings']);

/** A report's body, checked whole; a string says what is wrong (the 4.00's diagnostic payload). */
export function parseReport(payload: Buffer, format: number): DeviceReport | string {
  let body: unknown;
  if (format === ContentFormat.json) {
    try {
      body = JSON.parse(payload.toString('utf8'));
    } catch {
      return 'body is not JSON';
    }
  } else {
    try {
      body = decodeCbor(payload);
    } catch (err) {
      return err instanceof CborError
        ? `body is not CBOR this gateway reads: ${err.message}`
        : 'body is not CBOR';
    }
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return 'body must be an object';
  const fields = body as Record<string, CborValue | undefined>;
  for (const key of Object.keys(fields)) if (!FIELDS.has(key)) return `unknown field ${key.slice(0, 32)}`;
  const { version, outcome, reason, settings } = fields;
  if (typeof version !== 'number' || !Number.isSafeInteger(version) || version < 1)
    return 'version must be a positive integer';
  if (outcome !== 'applied' && outcome !== 'rejected') return 'outcome must be applied or rejected';
  if (outcome === 'rejected' && (typeof reason !== 'string' || !REASON.test(reason)))
    return 'a rejection needs reason: ^[a-z][a-z0-9_]{0,63}$';
  if (outcome === 'applied' && reason !== undefined) return 'reason is for rejected only';
  let reported: Record<string, unknown> | null = null;
  if (settings !== undefined) {
    // A CBOR map is built without a prototype; the validator and JSONB want a plain object.
    const plain: unknown = JSON.parse(JSON.stringify(settings));
    const checked = validateDesiredSettings(plain);
    if (!checked.ok) {
      const first = checked.errors[0]!;
      return `settings${first.path} ${first.message}`.slice(0, 120);
    }
    reported = checked.value;
  }
  return { version, outcome, reason: outcome === 'rejected' ? (reason as string) : null, settings: reported };
}

/** The resource; `handle` is given every request whose path is `/devices/{id}/reported`. */
export class ReportResource {
  constructor(
    private readonly messages: MessageLayer<Relation>,
    private readonly deps: ReportDeps,
  ) {}

  handle(req: InboundRequest, deviceId: string): void {
    const refusal = this.check(req, deviceId);
    if (refusal !== undefined) {
      this.deps.count?.(refusal);
      return;
    }
    const msg = req.msg;
    const parsed = parseReport(msg.payload, contentFormatOf(msg));
    if (typeof parsed === 'string') {
      this.deps.count?.('malformed');
      this.messages.respond(req, BAD_REQUEST, [], Buffer.from(parsed));
      return;
    }
    const transport: DeliveryTransport = req.transport.kind === 'dtls' ? 'dtls' : 'plain';
    this.deps.sink!.report(deviceId, parsed, transport).then(
      (result) => this.answer(req, result),
      () => this.answer(req, 'unavailable'),
    );
  }

  /** Refuses what must not reach the record, answering it; undefined when the report may be written. */
  private check(req: InboundRequest, deviceId: string): ReportRefusal | undefined {
    const msg = req.msg;
    // Over DTLS a session speaks for its key's device only; another id is answered as an unknown one (4.04),
    // as the settings resource does (design §3.5).
    const peerDevice = req.peer.deviceId;
    if ((peerDevice !== null && peerDevice !== deviceId) || !this.deps.known(deviceId)) {
      this.messages.respond(req, NOT_FOUND);
      return 'not_found';
    }
    if (peerDevice === null && !this.deps.trusts(deviceId, 'plain')) {
      this.messages.respond(req, UNAUTHORIZED, [], DIAG.plain);
      return 'forbidden';
    }
    if (this.deps.sink === undefined) {
      this.messages.respond(req, NOT_IMPLEMENTED, [], DIAG.disabled);
      return 'disabled';
    }
    // One datagram: a Block1 transfer (RFC 7959 §2.9.3) or a payload past one datagram's is 4.13 with Size1,
    // the largest body taken.
    if (msg.payload.length > MAX_PAYLOAD_BYTES || msg.options.some((o) => o.number === Opt.Block1)) {
      this.messages.respond(
        req,
        REQUEST_ENTITY_TOO_LARGE,
        [{ number: Opt.Size1, value: uintBytes(MAX_PAYLOAD_BYTES) }],
        DIAG.tooLarge,
      );
      return 'too_large';
    }
    const format = contentFormatOf(msg);
    if (format !== ContentFormat.json && format !== ContentFormat.cbor) {
      this.messages.respond(req, UNSUPPORTED_CONTENT_FORMAT, [], DIAG.format);
      return 'content_format';
    }
    return undefined;
  }

  private answer(req: InboundRequest, result: ReportResult): void {
    this.deps.count?.(result);
    switch (result) {
      case 'recorded':
      case 'older':
        this.messages.respond(req, CHANGED);
        return;
      case 'not_issued':
        this.messages.respond(req, CONFLICT, [], DIAG.notIssued);
        return;
      case 'unknown_device':
        this.messages.respond(req, NOT_FOUND);
        return;
      case 'unknown':
        this.messages.respond(
          req,
          SERVICE_UNAVAILABLE,
          [{ number: Opt.MaxAge, value: uintBytes(RETRY_AFTER_S) }],
          DIAG.unknown,
        );
        return;
      case 'unavailable':
        this.messages.respond(
          req,
          SERVICE_UNAVAILABLE,
          [{ number: Opt.MaxAge, value: uintBytes(RETRY_AFTER_S) }],
          DIAG.unavailable,
        );
        return;
    }
  }
}

/** The request's Content-Format (-1: none or unreadable). */
function contentFormatOf(msg: CoapMessage): number {
  for (const o of msg.options) if (o.number === Opt.ContentFormat) return readUint(o.value, 2);
  return -1;
}
