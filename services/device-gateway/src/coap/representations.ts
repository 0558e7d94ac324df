// The representations the CoAP resources serve, pre-encoded: a document version's ETag, its payload and the
// options around it, built once and copied into every datagram; and the size limits a document must fit.
import { createHash } from 'node:crypto';
import type { VisibleDocument } from '../domain/documents.js';
import { ContentFormat, EMPTY_BUF, Opt, encodeOptions, encodeTail, uintBytes } from './codec.js';

/** RFC 7252 section 4.6: without Path MTU knowledge a message should fit 1152 bytes (payload ≤ 1024). */
export const MAX_MESSAGE_BYTES = 1152;
export const MAX_PAYLOAD_BYTES = 1024;

const ETAG_BYTES = 8;

/**
 * Largest document the gateway accepts, in bytes: one notification to an observer with the longest accepted
 * token must fit one datagram (design §3.3: no block-wise transfer for notifications).
 * Around the payload: header 4, token (+1 or 2 length bytes past 12), ETag 1+8, Observe 1+3,
 * Content-Format 1+1, Max-Age 1+4, payload marker 1.
 */
export function maxDocumentBytes(maxTokenLength: number): number {
  const tokenBytes = maxTokenLength + (maxTokenLength < 13 ? 0 : maxTokenLength < 269 ? 1 : 2);
  const overhead = 4 + tokenBytes + (1 + ETAG_BYTES) + 4 + 2 + 5 + 1;
  return Math.min(MAX_PAYLOAD_BYTES, MAX_MESSAGE_BYTES - overhead);
}

export type DocumentFormat = typeof ContentFormat.json | typeof ContentFormat.cbor;

/** The pre-encoded pieces of one representation: built once, copied into every datagram that carries it. */
export interface WireForm {
  etag: Buffer;
  /** ETag option encoded from option 0. */
  etagOpt: Buffer;
  /** Content-Format, Max-Age (observe), marker and payload, encoded from option 6 (after Observe). */
  observeTail: Buffer;
  /** Content-Format, Max-Age (plain GET), encoded from option 4 (after ETag); payload separate for Block2. */
  plainTail: Buffer;
  payload: Buffer;
}

/** The wire form of a versioned document for a plain (non-Observe) response; built per request, not cached. */
export function documentForm(
  doc: VisibleDocument,
  format: DocumentFormat,
  maxAgeS: number,
  observeMaxAgeS: number,
): WireForm {
  const payload = format === ContentFormat.json ? doc.json : doc.cbor;
  return buildForm(versionEtag(doc.version, format), format, payload, maxAgeS, observeMaxAgeS);
}

/** Bytes of the ETag option at the start of an observe form: option header 1, ETag 8. */
export const OBSERVE_FORM_SPLIT = 1 + ETAG_BYTES;

/**
 * The bytes every notification of one document version carries after its token, as ONE Buffer: the ETag option
 * (encoded from option 0, `OBSERVE_FORM_SPLIT` bytes), then, after the Observe option spliced in per message,
 * Content-Format, Max-Age (encoded from option 6), the payload marker and the payload. An observed resource keeps
 * only this (a WireForm holds five Buffers, about 80 heap bytes each): it is most of the per-relation memory
 * when every device observes its own document. The ETag is the form's bytes 1..9 (see `formEtagEquals`).
 */
export function observeForm(doc: VisibleDocument, format: DocumentFormat, observeMaxAgeS: number): Buffer {
  // JSON is serialised here rather than through doc.json, which would keep a second copy of the payload (and a
  // Buffer object) in the document for as long as it lives; it is written straight into the form.
  const json = format === ContentFormat.json ? doc.jsonText() : undefined;
  const cbor = json === undefined ? doc.cbor : undefined;
  const opts = observeFormOptions(format, observeMaxAgeS);
  const payloadAt = OBSERVE_FORM_SPLIT + opts.length + 1;
  const out = Buffer.allocUnsafe(payloadAt + (cbor === undefined ? Buffer.byteLength(json!) : cbor.length));
  out[0] = (Opt.ETag << 4) | ETAG_BYTES;
  writeVersionEtag(out, 1, doc.version, format);
  opts.copy(out, OBSERVE_FORM_SPLIT);
  out[payloadAt - 1] = 0xff;
  if (cbor === undefined) out.write(json!, payloadAt);
  else cbor.copy(out, payloadAt);
  return out;
}

/** Content-Format and Max-Age encoded after Observe: the same bytes for every form of a format and Max-Age. */
const observeFormOptionCache = new Map<number, Buffer>();

function observeFormOptions(format: DocumentFormat, observeMaxAgeS: number): Buffer {
  const key = format * 0x100000000 + observeMaxAgeS;
  let opts = observeFormOptionCache.get(key);
  if (opts === undefined) {
    opts = encodeOptions(
      [
        { number: Opt.ContentFormat, value: uintBytes(format) },
        { number: Opt.MaxAge, value: uintBytes(observeMaxAgeS) },
      ],
      Opt.Observe,
    );
    observeFormOptionCache.set(key, opts);
  }
  return opts;
}

/** Whether a client's ETag option value names the version an observe form carries. */
export function formEtagEquals(form: Buffer, etag: Buffer): boolean {
  return etag.length === ETAG_BYTES && form.compare(etag, 0, ETAG_BYTES, 1, OBSERVE_FORM_SPLIT) === 0;
}

/**
 * ETag of a versioned document: the version (7 bytes, versions stay below 2^53) and the content format.
 * Deterministic, so a replica or a restarted process serving the same version yields the same ETag.
 */
export function versionEtag(version: number, format: number): Buffer {
  const etag = Buffer.alloc(ETAG_BYTES);
  writeVersionEtag(etag, 0, version, format);
  return etag;
}

function writeVersionEtag(out: Buffer, at: number, version: number, format: number): void {
  out.writeUIntBE(Math.floor(version / 0x100), at, 6);
  out[at + 6] = version % 0x100;
  out[at + 7] = format;
}

/** ETag of a computed representation (link format): a hash prefix of the payload. */
export function contentEtag(payload: Buffer): Buffer {
  return createHash('sha256').update(payload).digest().subarray(0, ETAG_BYTES);
}

export function buildForm(
  etag: Buffer,
  format: number,
  payload: Buffer,
  maxAgeS: number,
  observeMaxAgeS: number,
): WireForm {
  const cf = { number: Opt.ContentFormat, value: uintBytes(format) };
  return {
    etag,
    etagOpt: encodeOptions([{ number: Opt.ETag, value: etag }]),
    observeTail: encodeTail(
      [cf, { number: Opt.MaxAge, value: uintBytes(observeMaxAgeS) }],
      Opt.Observe,
      payload,
    ),
    plainTail: encodeTail([cf, { number: Opt.MaxAge, value: uintBytes(maxAgeS) }], Opt.ETag, EMPTY_BUF),
    payload,
  };
}
