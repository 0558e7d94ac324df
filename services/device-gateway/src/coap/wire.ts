import { createHash } from 'node:crypto';
import type { VisibleDocument } from '../domain/documents.js';
import { ContentFormat, EMPTY_BUF, Opt, encodeOptions, encodeTail, uintBytes } from './codec.js';

/** RFC 7252 section 4.6: without Path MTU knowledge a message should fit 1152 bytes (payload ≤ 1024). */
export const MAX_MESSAGE_BYTES = 1152;
export const MAX_PAYLOAD_BYTES = 1024;

const ETAG_BYTES = 8;

/**
 * Largest document the gateway accepts, in bytes: one notification to an observer with the longest accepted
 * token must fit one datagram (DESIGN 3.3: no block-wise transfer for notifications).
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

/**
 * Caches wire forms per document object. A WeakMap keeps the domain free of transport details and lets a
 * replaced document's bytes be collected with it.
 */
export class WireCache {
  private readonly forms = new WeakMap<VisibleDocument, [WireForm | undefined, WireForm | undefined]>();

  constructor(
    private readonly maxAgeS: number,
    private readonly observeMaxAgeS: number,
  ) {}

  get(doc: VisibleDocument, format: DocumentFormat): WireForm {
    let pair = this.forms.get(doc);
    if (pair === undefined) {
      pair = [undefined, undefined];
      this.forms.set(doc, pair);
    }
    const index = format === ContentFormat.json ? 0 : 1;
    const cached = pair[index];
    if (cached !== undefined) return cached;
    const payload = format === ContentFormat.json ? doc.json : doc.cbor;
    const form = buildForm(
      versionEtag(doc.version, format),
      format,
      payload,
      this.maxAgeS,
      this.observeMaxAgeS,
    );
    pair[index] = form;
    return form;
  }
}

/**
 * ETag of a versioned document: the version (7 bytes, versions stay below 2^53) and the content format.
 * Deterministic, so a replica or a restarted process serving the same version yields the same ETag.
 */
export function versionEtag(version: number, format: number): Buffer {
  const etag = Buffer.alloc(ETAG_BYTES);
  etag.writeUIntBE(Math.floor(version / 0x100), 0, 6);
  etag[6] = version % 0x100;
  etag[7] = format;
  return etag;
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
