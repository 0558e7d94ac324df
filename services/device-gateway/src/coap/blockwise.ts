import { Opt, encodeOptions, uintBytes } from './codec.js';
import { MAX_PAYLOAD_BYTES, type WireForm } from './representations.js';

/**
 * The block-wise layer (RFC 7959 Block2; Californium's `BlockwiseLayer`), for plain responses only: every
 * Observe notification fits one datagram (design §3.3), so only a GET of a large representation (a
 * /.well-known/core listing) is ever split. Stateless: each block is cut from the representation, which the
 * resource rebuilds per request, so no transfer state is kept between blocks.
 */

/** The payload and option tail of one response: the whole representation, or the block asked for. */
export interface ContentPart {
  /** Options after ETag (Content-Format, Max-Age, Block2 when blocked), encoded from option 4. */
  tail: Buffer;
  body: Buffer;
}

/**
 * The part of `form` a response carries: block-wise when the client asked for a block (`block2`, the option's
 * value, -1 when absent) or the payload exceeds one datagram's payload (RFC 7252 4.6). Null when the block
 * asked for starts past the end (the caller answers 4.02 Bad Option, RFC 7959 2.2).
 */
export function contentPart(form: WireForm, block2: number): ContentPart | null {
  const payload = form.payload;
  if (block2 === -1 && payload.length <= MAX_PAYLOAD_BYTES) return { tail: form.plainTail, body: payload };
  // SZX 6 (1024 bytes) at most: the server's own largest block (SZX 7 is reserved, refused when read).
  const szx = block2 === -1 ? 6 : Math.min(block2 & 7, 6);
  const size = 1 << (szx + 4);
  // A client's block number is in units of its own block size; re-express it in ours when smaller.
  const num = block2 === -1 ? 0 : (block2 >>> 4) * ((1 << ((block2 & 7) + 4)) / size);
  const start = num * size;
  if (start >= payload.length && !(start === 0 && payload.length === 0)) return null;
  const more = start + size < payload.length ? 1 : 0;
  const blockOpt = encodeOptions(
    [{ number: Opt.Block2, value: uintBytes((num << 4) | (more << 3) | szx) }],
    Opt.MaxAge,
  );
  return { tail: Buffer.concat([form.plainTail, blockOpt]), body: payload.subarray(start, start + size) };
}
