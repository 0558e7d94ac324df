import type { GatewayState } from '../domain/gateway-state.js';
import {
  BAD_OPTION,
  CONTENT,
  ContentFormat,
  GET,
  METHOD_NOT_ALLOWED,
  NOT_ACCEPTABLE,
  NOT_FOUND,
  Opt,
  POST,
  PROXYING_NOT_SUPPORTED,
  PUT,
  SERVICE_UNAVAILABLE,
  VALID,
  encodeWithParts,
  readUint,
  uintBytes,
  type CoapMessage,
} from './codec.js';
import { contentPart } from './blockwise.js';
import { linkFormat } from './link-format.js';
import type { InboundRequest, MessageLayer, RequestHandler } from './messages.js';
import type { DocumentLookup, ObserveLayer, Relation, ResourceKind } from './observe.js';
import type { CoapServerOptions } from './options.js';
import type { ReportResource } from './report-resource.js';
import {
  buildForm,
  contentEtag,
  documentForm,
  type DocumentFormat,
  type WireForm,
} from './representations.js';

/**
 * The resources (aiocoap's `resource.py` site, Californium's `ServerMessageDeliverer` and resource tree):
 * routing of GET requests to `/devices/{id}`, `/devices/{id}/settings` and `/.well-known/core`, content
 * negotiation, ETag validation, and the hand-over of Observe registrations to the observe layer. The resources
 * here are GET-only documents that fit one datagram: one place decides every reply.
 */

const DIAG_BAD_OPTION = Buffer.from('unsupported critical option');
const DIAG_BAD_BLOCK = Buffer.from('invalid Block2');

interface ParsedRequest {
  path: string[];
  query: string[];
  accept: number;
  observe: number;
  etags: Buffer[];
  block2: number;
}

export class Resources implements RequestHandler {
  /** `/devices/{id}/reported` (report-resource.ts); undefined: answered 4.05 like any other POST or PUT. */
  reports: ReportResource | undefined;

  constructor(
    private readonly state: GatewayState,
    private readonly messages: MessageLayer<Relation>,
    private readonly observe: ObserveLayer,
    private readonly options: CoapServerOptions,
    private readonly lookup: DocumentLookup,
  ) {}

  handleRequest(req: InboundRequest): void {
    const msg = req.msg;
    if (msg.code !== GET) {
      const deviceId = msg.code === POST || msg.code === PUT ? reportPath(msg) : undefined;
      if (deviceId !== undefined && this.reports !== undefined) {
        if (deviceId === null) this.messages.respond(req, BAD_OPTION, [], DIAG_BAD_OPTION);
        else this.reports.handle(req, deviceId);
        return;
      }
      this.messages.respond(req, METHOD_NOT_ALLOWED);
      return;
    }
    const opts = readOptions(msg);
    if (opts === 'proxy') {
      this.messages.respond(req, PROXYING_NOT_SUPPORTED);
      return;
    }
    if (opts === 'bad_option') {
      this.messages.respond(req, BAD_OPTION, [], DIAG_BAD_OPTION);
      return;
    }
    const token = msg.token;
    const tokenKey = token.length === 0 ? '' : token.toString('latin1');
    // Observe=1 (RFC 7641 3.6) ends the relation with this token; the request is then answered as a plain GET.
    if (opts.observe === 1) this.observe.deregister(req.peer.key, tokenKey);

    const path = opts.path;
    if (path.length === 2 && path[0] === '.well-known' && path[1] === 'core') {
      this.serveWellKnown(req, opts);
      return;
    }
    let kind: ResourceKind | undefined;
    if (path.length === 2 && path[0] === 'devices') kind = 'record';
    else if (path.length === 3 && path[0] === 'devices' && path[2] === 'settings') kind = 'settings';
    if (kind === undefined && path.length === 3 && path[0] === 'devices' && path[2] === 'reported') {
      // Written by POST or PUT, never read back over CoAP (the device view shows it).
      this.messages.respond(req, METHOD_NOT_ALLOWED);
      return;
    }
    if (kind === undefined) {
      this.messages.respond(req, NOT_FOUND);
      return;
    }
    const deviceId = path[1]!;
    let format: DocumentFormat;
    if (opts.accept === -1 || opts.accept === ContentFormat.json) format = ContentFormat.json;
    else if (opts.accept === ContentFormat.cbor) format = ContentFormat.cbor;
    else {
      this.messages.respond(req, NOT_ACCEPTABLE);
      return;
    }
    // A peer authenticated as a device (a DTLS PSK session) reads and observes that device only; any other id
    // is answered exactly as an unknown one (design §3.5), so a device cannot learn which other ids exist.
    const peerDevice = req.peer.deviceId;
    const doc = peerDevice === null || peerDevice === deviceId ? this.lookup(deviceId, kind) : undefined;
    if (doc === undefined) {
      // A registration for an unknown device is not kept; an earlier one with this token is replaced by it.
      if (opts.observe === 0) this.observe.deregister(req.peer.key, tokenKey);
      this.messages.respond(req, NOT_FOUND);
      return;
    }
    const observeMaxAgeS = this.observe.observeMaxAgeS;
    if (opts.observe === 0) {
      switch (this.observe.register(req, tokenKey, kind, format, doc, opts.etags)) {
        case 'registered':
          return;
        case 'endpoint_cap':
          // Answered like a plain GET, without Observe (RFC 7641 4.1).
          this.sendContent(req, documentForm(doc, format, this.options.maxAgeS, observeMaxAgeS), -1);
          return;
        case 'address_cap':
        case 'total_cap':
          // RFC 7252 5.9.3.4: 5.03 with Max-Age, the seconds after which to retry. No document: a refusal
          // must stay small (a NON registration can come from a spoofed address).
          this.messages.respond(req, SERVICE_UNAVAILABLE, [
            { number: Opt.MaxAge, value: uintBytes(this.options.relationRetryAfterS) },
          ]);
          return;
      }
    }
    const form = documentForm(doc, format, this.options.maxAgeS, observeMaxAgeS);
    if (opts.etags.some((e) => e.equals(form.etag))) {
      this.messages.respond(req, VALID, [
        { number: Opt.ETag, value: form.etag },
        { number: Opt.MaxAge, value: uintBytes(this.options.maxAgeS) },
      ]);
      return;
    }
    this.sendContent(req, form, opts.block2);
  }

  private serveWellKnown(req: InboundRequest, opts: ParsedRequest): void {
    if (opts.accept !== -1 && opts.accept !== ContentFormat.linkFormat) {
      this.messages.respond(req, NOT_ACCEPTABLE);
      return;
    }
    const payload = Buffer.from(linkFormat(this.state, opts.query, req.peer.deviceId));
    const form = buildForm(contentEtag(payload), ContentFormat.linkFormat, payload, this.options.maxAgeS, 0);
    this.sendContent(req, form, opts.block2);
  }

  /** A plain (non-Observe) 2.05, block-wise when asked for or too large for one datagram (blockwise.ts). */
  private sendContent(req: InboundRequest, form: WireForm, block2: number): void {
    const part = contentPart(form, block2);
    if (part === null) {
      this.messages.respond(req, BAD_OPTION, [], DIAG_BAD_BLOCK);
      return;
    }
    const msg = req.msg;
    this.messages.sendReply(
      req,
      encodeWithParts(
        this.messages.replyType(msg),
        CONTENT,
        this.messages.replyMid(msg),
        msg.token,
        form.etagOpt,
        part.tail,
        part.body,
      ),
    );
  }
}

/**
 * The device id of a `/devices/{id}/reported` request; undefined for any other path; null when it carries a
 * critical option the report resource does not understand (4.02, RFC 7252 §5.4.1). Accept is understood (the
 * answer has no payload to negotiate); Block1 is left to the resource, which answers it 4.13 (one datagram only,
 * RFC 7959 §2.9.3).
 */
function reportPath(msg: CoapMessage): string | null | undefined {
  const path: string[] = [];
  let bad = false;
  for (const o of msg.options) {
    if (o.number === Opt.UriPath) path.push(o.value.toString('utf8'));
    else if (
      (o.number & 1) === 1 &&
      o.number !== Opt.UriHost &&
      o.number !== Opt.UriPort &&
      o.number !== Opt.UriQuery &&
      o.number !== Opt.Accept &&
      o.number !== Opt.Block1
    )
      bad = true;
  }
  if (path.length !== 3 || path[0] !== 'devices' || path[2] !== 'reported') return undefined;
  return bad ? null : path[1]!;
}

function readOptions(msg: CoapMessage): ParsedRequest | 'bad_option' | 'proxy' {
  const req: ParsedRequest = { path: [], query: [], accept: -1, observe: -1, etags: [], block2: -1 };
  for (const o of msg.options) {
    switch (o.number) {
      case Opt.UriPath:
        req.path.push(o.value.toString('utf8'));
        break;
      case Opt.UriQuery:
        req.query.push(o.value.toString('utf8'));
        break;
      case Opt.Accept:
        req.accept = readUint(o.value, 2);
        if (req.accept === -1) return 'bad_option';
        break;
      case Opt.Observe:
        // RFC 7641 2: 0-3 bytes. A longer value is not an Observe request (the option is elective).
        req.observe = readUint(o.value, 3);
        break;
      case Opt.ETag:
        req.etags.push(o.value);
        break;
      case Opt.Block2:
        req.block2 = readUint(o.value, 3);
        if (req.block2 === -1 || (req.block2 & 7) === 7) return 'bad_option';
        break;
      case Opt.ProxyUri:
      case Opt.ProxyScheme:
        return 'proxy';
      case Opt.UriHost:
      case Opt.UriPort:
        // This server answers for every host name and port it is reached under.
        break;
      default:
        // RFC 7252 5.4.1: an unrecognised critical (odd-numbered) option makes the request fail with 4.02.
        if ((o.number & 1) === 1) return 'bad_option';
    }
  }
  return req;
}
