import dgram from 'node:dgram';
import { lookup as dnsLookup } from 'node:dns';
import type { AddressInfo } from 'node:net';
import { isIP, isIPv6 } from 'node:net';
import type { VisibleDocument } from '../domain/documents.js';
import type { DeviceChange, GatewayState } from '../domain/gateway-state.js';
import {
  ACK,
  BAD_OPTION,
  BAD_REQUEST,
  CON,
  CONTENT,
  ContentFormat,
  EMPTY,
  EMPTY_BUF,
  GET,
  METHOD_NOT_ALLOWED,
  NON,
  NOT_ACCEPTABLE,
  NOT_FOUND,
  Opt,
  PROXYING_NOT_SUPPORTED,
  RST,
  VALID,
  encodeFromObserveForm,
  encodeMessage,
  encodeOptions,
  encodeWithParts,
  parseMessage,
  readUint,
  uintBytes,
  type CoapMessage,
  type MessageType,
  type ParseFailure,
} from './codec.js';
import { linkFormat } from './link-format.js';
import {
  OBSERVE_FORM_SPLIT,
  buildForm,
  contentEtag,
  documentForm,
  formEtagEquals,
  observeForm,
  type DocumentFormat,
  type WireForm,
} from './wire.js';

/**
 * The gateway's CoAP endpoint: it owns its UDP socket and implements RFC 7252 message handling and RFC 7641
 * Observe itself. node-coap 1.5.0 is not used on this path; NODE-COAP.md lists why (duplicate relations,
 * Observe=1 ignored, RST ignored for NON, ACK-typed NON notifications, about 4 KB per held response, a
 * retransmission storm from an unsized socket buffer and a synchronous fan-out, and network-reachable
 * crashes: a Block1 request whose first block is missing throws from the socket's message handler, and an
 * unacknowledged exchange emits 'error' without a listener once EXCHANGE_LIFETIME passes). The resources
 * here are GET-only documents that fit one datagram, so the request/response path is small enough to own
 * as well: one parser, one place that decides every reply, no per-exchange cache (see handleRequest).
 */

export interface CoapLogger {
  info(message: string, meta?: Record<string, unknown>): unknown;
  warn(message: string, meta?: Record<string, unknown>): unknown;
  error(message: string, meta?: Record<string, unknown>): unknown;
  debug(message: string, meta?: Record<string, unknown>): unknown;
}

export interface CoapServerOptions {
  logger: CoapLogger;
  /** Longest token accepted (RFC 8974 allows up to 65804 bytes; each relation keeps its token). */
  maxTokenLength: number;
  /** SO_RCVBUF / SO_SNDBUF request in bytes; ACKs of a large fan-out must not be dropped in the kernel. */
  socketBufferBytes: number;
  /** RFC 7252 ACK_TIMEOUT in ms (default 2000) and ACK_RANDOM_FACTOR (default 1.5). */
  ackTimeoutMs: number;
  ackRandomFactor: number;
  /** RFC 7252 MAX_RETRANSMIT (default 4). */
  maxRetransmit: number;
  /** RFC 7641 4.5: at least one confirmable notification per observer in this period (ms, default 24 h). */
  confirmableRefreshMs: number;
  /** Max-Age of plain GET responses, seconds. Notifications carry the refresh period instead. */
  maxAgeS: number;
  /** Notifications sent per event-loop turn during a fan-out, so incoming ACKs are read in between. */
  fanoutChunk: number;
  /**
   * Server-wide window of confirmable notifications awaiting their first ACK. NSTART (RFC 7252 4.7) bounds
   * exchanges per endpoint; this bounds them across all endpoints, so a fan-out to 100,000 observers is paced
   * by the ACKs coming back: each ACK returns well within ACK_TIMEOUT instead of queueing behind the burst
   * (unbounded, the ACKs of a large fan-out arrived after the timeout and every notification was resent).
   * A notification leaves the window at its ACK or its first timeout (a slow or dead peer must not hold a
   * slot through its whole backoff); it keeps its own retransmission schedule either way.
   */
  maxInflight: number;
  /** Most links /.well-known/core returns; a query matching more is refused with 4.00 and a hint. */
  wellKnownMaxLinks: number;
  /** Most observe relations one endpoint (address and port) may hold; further registrations get a plain reply. */
  maxRelationsPerEndpoint: number;
}

export const defaultCoapOptions: Omit<CoapServerOptions, 'logger'> = {
  maxTokenLength: 64,
  socketBufferBytes: 4 * 1024 * 1024,
  ackTimeoutMs: 2000,
  ackRandomFactor: 1.5,
  maxRetransmit: 4,
  confirmableRefreshMs: 24 * 60 * 60 * 1000,
  maxAgeS: 60,
  fanoutChunk: 256,
  maxInflight: 2048,
  wellKnownMaxLinks: 64,
  maxRelationsPerEndpoint: 256,
};

export interface CoapStats {
  datagramsIn: number;
  malformed: number;
  malformedByReason: Record<string, number>;
  requests: number;
  responses: number;
  notifications: number;
  confirmableNotifications: number;
  retransmissions: number;
  acks: number;
  resets: number;
  observersRemovedByRst: number;
  observersRemovedByTimeout: number;
  observersDeregistered: number;
  registrationsRefused: number;
  finalNotFound: number;
  internalErrors: number;
  sendErrors: number;
  /** Times a fan-out paused because the in-flight window was full. */
  windowFull: number;
}

type ResourceKind = 'settings' | 'record';

/** One client endpoint (address and port): ACK and RST carry only a message id, so they are matched here. */
class Endpoint {
  readonly relations: Relation[] = [];
  constructor(
    readonly key: string,
    readonly address: string,
    readonly port: number,
  ) {}
}

/**
 * All observers of one resource, its RFC 7641 sequence number (24-bit, per resource), and the observe form of
 * its current document: built once per version and format, shared by every observer. Relations are an
 * intrusive doubly linked list: most resources have one observer, and a Set would cost ~100 bytes each.
 */
class ObservedResource {
  head: Relation | null = null;
  count = 0;
  seq = 0;
  formDoc: VisibleDocument | null = null;
  jsonForm: Buffer | null = null;
  cborForm: Buffer | null = null;
  constructor(
    readonly deviceId: string,
    readonly kind: ResourceKind,
  ) {}

  nextSeq(): number {
    this.seq = (this.seq + 1) & 0xffffff;
    return this.seq;
  }

  add(rel: Relation): void {
    rel.next = this.head;
    if (this.head !== null) this.head.prev = rel;
    this.head = rel;
    this.count++;
  }

  /** Returns false when `rel` was not attached. */
  remove(rel: Relation): boolean {
    if (!rel.attached) return false;
    rel.attached = false;
    if (rel.prev !== null) rel.prev.next = rel.next;
    else this.head = rel.next;
    if (rel.next !== null) rel.next.prev = rel.prev;
    rel.prev = rel.next = null;
    this.count--;
    return true;
  }
}

/**
 * One observe relation, kept as small as Observe needs (NODE-COAP.md: node-coap's held `res` costs ~4 KB).
 * The token is a latin1 string: a Buffer would cost an object plus a backing store, and a slice of the request
 * would pin the whole datagram. Times are whole milliseconds (small integers, stored unboxed by V8).
 */
class Relation {
  prev: Relation | null = null;
  next: Relation | null = null;
  attached = true;
  /** Version of the document last sent (0: none), so unchanged states are not re-sent. */
  lastVersion = 0;
  /** Message id of the last notification (any type), to match an RST. */
  lastMid = -1;
  /** Monotonic ms of the last proof of life: the registration itself or an ACK to a CON notification. */
  lastConfirmedAt: number;
  /** Confirmable notification awaiting its ACK: message id (-1 none), bytes, retransmissions, timeout. */
  inflightMid = -1;
  inflight: Buffer | null = null;
  retransmits = 0;
  timeoutMs = 0;
  slot = 0;
  /** Holds one of the server-wide window's slots (see CoapServerOptions.maxInflight). */
  inWindow = false;
  /** A newer state arrived while a CON was in flight (RFC 7641 4.5.2): sent on ACK or at the next timeout. */
  pending = false;
  queued = false;
  /** Queued for a confirmable liveness refresh (RFC 7641 4.5) rather than for a change. */
  refreshDue = false;
  /** A final 4.04 is in flight; the relation is out of its resource and ends on ACK, RST or timeout. */
  closing = false;
  dead = false;

  constructor(
    readonly endpoint: Endpoint,
    readonly token: string,
    readonly resource: ObservedResource,
    readonly format: DocumentFormat,
    readonly confirmable: boolean,
    now: number,
  ) {
    this.lastConfirmedAt = now;
  }
}

/** Monotonic whole milliseconds. */
const now = (): number => Math.floor(performance.now());

const DIAG_BAD_OPTION = Buffer.from('unsupported critical option');
const DIAG_TOO_MANY = Buffer.from('too many resources match; filter with href=/devices/<id prefix>*');
const DIAG_BAD_BLOCK = Buffer.from('invalid Block2');

interface ParsedRequest {
  path: string[];
  query: string[];
  accept: number;
  observe: number;
  etags: Buffer[];
  block2: number;
}

export class CoapServer {
  private socket: dgram.Socket | undefined;
  private isBound = false;
  private closing = false;
  private mid = Math.floor(Math.random() * 0x10000);
  /** Observed resources by device id, one map per kind (no concatenated key string per resource). */
  private readonly settingsResources = new Map<string, ObservedResource>();
  private readonly recordResources = new Map<string, ObservedResource>();
  /** Client endpoints by "port|address". */
  private readonly byEndpoint = new Map<string, Endpoint>();
  private relationCount = 0;
  private readonly observeMaxAgeS: number;
  private queue: Relation[] = [];
  private queueHead = 0;
  private pumpScheduled = false;
  private readonly pumpLater = (): void => {
    this.pumpScheduled = false;
    this.pump();
  };
  /** Confirmable notifications holding a window slot, and whether a fan-out waits for one to free. */
  private windowUsed = 0;
  private windowBlocked = false;
  private readonly wheel = new Map<number, Relation[]>();
  private wheelTimer: NodeJS.Timeout | undefined;
  private readonly tickMs: number;
  private refreshTimer: NodeJS.Timeout | undefined;
  readonly stats: CoapStats = {
    datagramsIn: 0,
    malformed: 0,
    malformedByReason: {},
    requests: 0,
    responses: 0,
    notifications: 0,
    confirmableNotifications: 0,
    retransmissions: 0,
    acks: 0,
    resets: 0,
    observersRemovedByRst: 0,
    observersRemovedByTimeout: 0,
    observersDeregistered: 0,
    registrationsRefused: 0,
    finalNotFound: 0,
    internalErrors: 0,
    sendErrors: 0,
    windowFull: 0,
  };

  constructor(
    private readonly state: GatewayState,
    private readonly options: CoapServerOptions,
  ) {
    // Notifications carry a Max-Age that outlives the refresh period, so a device does not treat a quiet
    // relation as stale before the periodic confirmable notification refreshes it (RFC 7641 4.3.1).
    this.observeMaxAgeS = Math.min(0xffffffff, Math.ceil((options.confirmableRefreshMs * 1.1) / 1000));
    this.tickMs = Math.max(5, Math.min(100, Math.floor(options.ackTimeoutMs / 4)));
    state.onChange((changes) => this.onStateChange(changes));
  }

  get bound(): boolean {
    return this.isBound;
  }

  get observerCount(): number {
    return this.relationCount;
  }

  address(): AddressInfo {
    if (this.socket === undefined) throw new Error('CoAP server is not listening');
    return this.socket.address();
  }

  /** Binds the socket. Resolves once bound; rejects if the port cannot be bound. */
  listen(port: number, host = '0.0.0.0'): Promise<void> {
    const socket = dgram.createSocket({
      type: isIPv6(host) ? 'udp6' : 'udp4',
      recvBufferSize: this.options.socketBufferBytes,
      sendBufferSize: this.options.socketBufferBytes,
      // dgram resolves the destination of every send() on an unconnected socket through `lookup`; the default
      // (dns.lookup) answers even an IP literal on a later tick, so no datagram of a synchronous fan-out chunk
      // left before the chunk ended and each send paid a closure and a tick. Peers here are always IP
      // literals (rinfo.address): answer them synchronously; names (a bind host) still go to dns.lookup.
      lookup: (hostname, options, callback) => {
        const family = isIP(hostname);
        if (family !== 0) callback(null, hostname, family);
        else dnsLookup(hostname, options, callback);
      },
    });
    this.socket = socket;
    socket.on('message', (buf, rinfo) => this.onDatagram(buf, rinfo.address, rinfo.port));
    return new Promise((resolve, reject) => {
      const onError = (err: Error): void => {
        this.socket = undefined;
        reject(err);
      };
      socket.once('error', onError);
      socket.bind(port, host, () => {
        socket.off('error', onError);
        // A send error (e.g. EMSGSIZE, a vanished interface) must never take the process down.
        socket.on('error', (err) => {
          this.stats.sendErrors++;
          this.options.logger.warn('coap socket error', { error: err.message });
        });
        this.isBound = true;
        this.refreshTimer = setInterval(
          () => this.refreshSweep(),
          Math.max(1000, Math.min(this.options.confirmableRefreshMs / 8, 3_600_000)),
        );
        this.refreshTimer.unref();
        this.options.logger.info('coap listening', {
          address: socket.address().address,
          port: socket.address().port,
          recv_buffer_bytes: socket.getRecvBufferSize(),
          send_buffer_bytes: socket.getSendBufferSize(),
        });
        resolve();
      });
    });
  }

  /**
   * Stops reading requests, lets the notification queue drain (bounded by `graceMs`), then closes the
   * socket. Datagrams already handed to the socket are sent before it closes.
   */
  async close(graceMs = 2000): Promise<void> {
    const socket = this.socket;
    if (socket === undefined || this.closing) return;
    this.closing = true;
    const deadline = now() + graceMs;
    while (this.queueHead < this.queue.length && now() < deadline) await new Promise((r) => setImmediate(r));
    if (this.wheelTimer !== undefined) clearInterval(this.wheelTimer);
    if (this.refreshTimer !== undefined) clearInterval(this.refreshTimer);
    this.isBound = false;
    // One more turn so sends queued on process.nextTick by dgram reach the kernel before the close.
    await new Promise((r) => setImmediate(r));
    await new Promise<void>((resolve) => socket.close(() => resolve()));
    this.socket = undefined;
  }

  // ---- incoming ----------------------------------------------------------------------------------------

  private onDatagram(buf: Buffer, address: string, port: number): void {
    if (this.closing) return;
    this.stats.datagramsIn++;
    try {
      this.handleDatagram(buf, address, port);
    } catch (err) {
      // Defence in depth: nothing above should throw, but a datagram must never end the process. No reply:
      // internal error text never goes on the wire.
      this.stats.internalErrors++;
      this.options.logger.error('coap datagram handling failed', {
        error: err instanceof Error ? err.message : String(err),
      });
    }
  }

  private handleDatagram(buf: Buffer, address: string, port: number): void {
    const parsed = parseMessage(buf, this.options.maxTokenLength);
    if (!parsed.ok) {
      this.onMalformed(parsed.failure, address, port);
      return;
    }
    const msg = parsed.message;
    const cls = msg.code >> 5;
    if (msg.code === EMPTY) {
      switch (msg.type) {
        case CON: // CoAP ping (RFC 7252 4.3): answered with RST.
          this.sendRaw(encodeMessage(RST, EMPTY, msg.messageId, EMPTY_BUF, []), address, port);
          return;
        case ACK:
          this.onAck(endpointKey(address, port), msg.messageId);
          return;
        case RST:
          this.onRst(endpointKey(address, port), msg.messageId);
          return;
        case NON: // An empty NON has no meaning; ignored.
          return;
      }
    }
    if (cls === 0) {
      if (msg.type === CON || msg.type === NON) {
        this.stats.requests++;
        this.handleRequest(msg, address, port);
      } else {
        // ACK/RST must not carry a request code.
        this.countMalformed('request_in_ack_or_rst');
      }
      return;
    }
    if (msg.type === CON) {
      // A confirmable response or a reserved code class: a server has no exchange to match it to (4.2).
      this.sendRaw(encodeMessage(RST, EMPTY, msg.messageId, EMPTY_BUF, []), address, port);
    } else if (msg.type === ACK || msg.type === NON) {
      if (cls === 2 || cls === 4 || cls === 5) {
        // A piggybacked response to a notification? Notifications are never requests; nothing to do.
        return;
      }
      this.countMalformed('reserved_code_class');
    }
  }

  private onMalformed(failure: ParseFailure, address: string, port: number): void {
    this.countMalformed(failure.reason);
    // RFC 7252 4.2/4.3: a CON with a format error is rejected with RST; a NON is silently ignored; an unknown
    // version is silently ignored whatever its type (section 3).
    if (failure.type === CON && failure.messageId !== undefined && failure.reason !== 'version') {
      this.sendRaw(encodeMessage(RST, EMPTY, failure.messageId, EMPTY_BUF, []), address, port);
    }
  }

  private countMalformed(reason: string): void {
    this.stats.malformed++;
    this.stats.malformedByReason[reason] = (this.stats.malformedByReason[reason] ?? 0) + 1;
  }

  /**
   * One request. No per-exchange deduplication cache: the only method served is GET, which is idempotent
   * (RFC 7252 4.5 allows re-processing duplicates of idempotent requests), and an Observe registration is
   * keyed by endpoint and token, so a retransmitted registration replaces itself instead of duplicating.
   */
  private handleRequest(msg: CoapMessage, address: string, port: number): void {
    const token = msg.token;
    const reply = (
      code: number,
      options: { number: number; value: Buffer }[] = [],
      payload = EMPTY_BUF,
    ): void => {
      this.respond(msg, address, port, code, options, payload);
    };
    if (msg.code !== GET) {
      reply(METHOD_NOT_ALLOWED);
      return;
    }
    const req = this.readOptions(msg);
    if (req === 'proxy') {
      reply(PROXYING_NOT_SUPPORTED);
      return;
    }
    if (req === 'bad_option') {
      reply(BAD_OPTION, [], DIAG_BAD_OPTION);
      return;
    }
    const endpoint = endpointKey(address, port);
    const tokenKey = token.length === 0 ? '' : token.toString('latin1');
    // Observe=1 (RFC 7641 3.6) ends the relation with this token; the request is then answered as a plain GET.
    if (req.observe === 1) this.deregister(endpoint, tokenKey);

    const path = req.path;
    if (path.length === 2 && path[0] === '.well-known' && path[1] === 'core') {
      this.serveWellKnown(msg, address, port, req);
      return;
    }
    let kind: ResourceKind | undefined;
    if (path.length === 2 && path[0] === 'devices') kind = 'record';
    else if (path.length === 3 && path[0] === 'devices' && path[2] === 'settings') kind = 'settings';
    if (kind === undefined) {
      reply(NOT_FOUND);
      return;
    }
    const deviceId = path[1]!;
    let format: DocumentFormat;
    if (req.accept === -1 || req.accept === ContentFormat.json) format = ContentFormat.json;
    else if (req.accept === ContentFormat.cbor) format = ContentFormat.cbor;
    else {
      reply(NOT_ACCEPTABLE);
      return;
    }
    const doc = this.documentFor(deviceId, kind);
    if (doc === undefined) {
      // A registration for an unknown device is not kept; an earlier one with this token is replaced by it.
      if (req.observe === 0) this.deregister(endpoint, tokenKey);
      reply(NOT_FOUND);
      return;
    }
    if (req.observe === 0) {
      this.register(msg, address, port, endpoint, tokenKey, kind, format, doc, req);
      return;
    }
    const form = documentForm(doc, format, this.options.maxAgeS, this.observeMaxAgeS);
    if (req.etags.some((e) => e.equals(form.etag))) {
      reply(VALID, [
        { number: Opt.ETag, value: form.etag },
        { number: Opt.MaxAge, value: uintBytes(this.options.maxAgeS) },
      ]);
      return;
    }
    this.sendPlain(msg, address, port, form, req.block2);
  }

  private readOptions(msg: CoapMessage): ParsedRequest | 'bad_option' | 'proxy' {
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

  private documentFor(deviceId: string, kind: ResourceKind): VisibleDocument | undefined {
    return kind === 'settings' ? this.state.settingsDocument(deviceId) : this.state.recordDocument(deviceId);
  }

  private resourceMap(kind: ResourceKind): Map<string, ObservedResource> {
    return kind === 'settings' ? this.settingsResources : this.recordResources;
  }

  /** The resource's observe form for `doc`, rebuilt when the document changed since the last one. */
  private formFor(resource: ObservedResource, doc: VisibleDocument, format: DocumentFormat): Buffer {
    if (resource.formDoc !== doc) {
      resource.formDoc = doc;
      resource.jsonForm = null;
      resource.cborForm = null;
    }
    if (format === ContentFormat.json)
      return (resource.jsonForm ??= observeForm(doc, format, this.observeMaxAgeS));
    return (resource.cborForm ??= observeForm(doc, format, this.observeMaxAgeS));
  }

  private register(
    msg: CoapMessage,
    address: string,
    port: number,
    endpointKeyValue: string,
    tokenKey: string,
    kind: ResourceKind,
    format: DocumentFormat,
    doc: VisibleDocument,
    req: ParsedRequest,
  ): void {
    // The registry's own id string (the document's), not the request's copy: one string per device.
    const deviceId = (doc.body as { device_id: string }).device_id;
    const resources = this.resourceMap(kind);
    // The same endpoint observing again with the same token, or the same resource with a new token, replaces
    // its relation (never duplicates it).
    let endpoint = this.byEndpoint.get(endpointKeyValue);
    if (endpoint !== undefined) {
      const existing = endpoint.relations;
      // One ObservedResource per (device, kind) while it has observers, so "the same resource" is an identity
      // test: comparing device-id strings here was the largest cost of a registration (profile of
      // bench:gateway, ~100 relations per endpoint). A relation already closing with its final 4.04 has left
      // its resource and is not replaced; it ends on its own ACK, RST or timeout.
      const current = resources.get(deviceId);
      // Backwards, without copying: removeRelation splices this array. At most maxRelationsPerEndpoint long.
      for (let i = existing.length - 1; i >= 0; i--) {
        const rel = existing[i]!;
        if (rel.token === tokenKey || rel.resource === current) this.removeRelation(rel);
      }
      if (existing.length >= this.options.maxRelationsPerEndpoint) {
        // RFC 7641 4.1: a server unwilling to add an observer answers like a plain GET (no Observe option).
        // The cap keeps per-endpoint lookups (ACK, RST, re-registration) short and stops one endpoint from
        // claiming an unbounded share of memory.
        this.stats.registrationsRefused++;
        this.sendPlain(
          msg,
          address,
          port,
          documentForm(doc, format, this.options.maxAgeS, this.observeMaxAgeS),
          -1,
        );
        return;
      }
      // removeRelation drops an endpoint whose last relation went; look it up again.
      endpoint = this.byEndpoint.get(endpointKeyValue);
    }
    if (endpoint === undefined) {
      endpoint = new Endpoint(endpointKeyValue, address, port);
      this.byEndpoint.set(endpointKeyValue, endpoint);
    }
    let resource = resources.get(deviceId);
    if (resource === undefined) {
      resource = new ObservedResource(deviceId, kind);
      resources.set(deviceId, resource);
    }
    const form = this.formFor(resource, doc, format);
    const rel = new Relation(endpoint, tokenKey, resource, format, msg.type === CON, now());
    resource.add(rel);
    endpoint.relations.push(rel);
    this.relationCount++;
    rel.lastVersion = doc.version;
    const seq = resource.nextSeq();
    // Piggybacked in the ACK of a CON registration; a NON registration gets a NON response (RFC 7252 5.2).
    const type: MessageType = msg.type === CON ? ACK : NON;
    const mid = msg.type === CON ? msg.messageId : this.nextMid();
    if (msg.type === NON) rel.lastMid = mid;
    this.stats.responses++;
    if (req.etags.some((e) => formEtagEquals(form, e))) {
      const validTail = encodeOptions(
        [{ number: Opt.MaxAge, value: uintBytes(this.observeMaxAgeS) }],
        Opt.Observe,
      );
      const validForm = Buffer.concat([form.subarray(0, OBSERVE_FORM_SPLIT), validTail]);
      this.sendRaw(
        encodeFromObserveForm(type, VALID, mid, tokenKey, validForm, OBSERVE_FORM_SPLIT, seq),
        address,
        port,
      );
      return;
    }
    this.sendRaw(
      encodeFromObserveForm(type, CONTENT, mid, tokenKey, form, OBSERVE_FORM_SPLIT, seq),
      address,
      port,
    );
  }

  private deregister(endpointKeyValue: string, tokenKey: string): void {
    const endpoint = this.byEndpoint.get(endpointKeyValue);
    if (endpoint === undefined) return;
    const list = endpoint.relations;
    for (let i = list.length - 1; i >= 0; i--) {
      const rel = list[i]!;
      if (rel.token === tokenKey) {
        this.removeRelation(rel);
        this.stats.observersDeregistered++;
      }
    }
  }

  private serveWellKnown(msg: CoapMessage, address: string, port: number, req: ParsedRequest): void {
    if (req.accept !== -1 && req.accept !== ContentFormat.linkFormat) {
      this.respond(msg, address, port, NOT_ACCEPTABLE);
      return;
    }
    const result = linkFormat(this.state, req.query, this.options.wellKnownMaxLinks);
    if (!result.ok) {
      this.respond(msg, address, port, BAD_REQUEST, [], DIAG_TOO_MANY);
      return;
    }
    const payload = Buffer.from(result.links);
    const form = buildForm(contentEtag(payload), ContentFormat.linkFormat, payload, this.options.maxAgeS, 0);
    this.sendPlain(msg, address, port, form, req.block2);
  }

  /**
   * A plain (non-Observe) 2.05, block-wise (RFC 7959 Block2) when the client asked for blocks or the payload
   * exceeds one datagram. Observe registrations ignore Block2: every document fits one datagram.
   */
  private sendPlain(msg: CoapMessage, address: string, port: number, form: WireForm, block2: number): void {
    const payload = form.payload;
    let tail = form.plainTail;
    let body = payload;
    if (block2 !== -1 || payload.length > 1024) {
      const szx = block2 === -1 ? 6 : Math.min(block2 & 7, 6);
      const size = 1 << (szx + 4);
      // A client's block number is in units of its own block size; re-express it in ours when smaller.
      const num = block2 === -1 ? 0 : (block2 >>> 4) * ((1 << ((block2 & 7) + 4)) / size);
      const start = num * size;
      if (start >= payload.length && !(start === 0 && payload.length === 0)) {
        this.respond(msg, address, port, BAD_OPTION, [], DIAG_BAD_BLOCK);
        return;
      }
      body = payload.subarray(start, start + size);
      const more = start + size < payload.length ? 1 : 0;
      const blockOpt = encodeOptions(
        [{ number: Opt.Block2, value: uintBytes((num << 4) | (more << 3) | szx) }],
        Opt.MaxAge,
      );
      tail = Buffer.concat([form.plainTail, blockOpt]);
    }
    const type: MessageType = msg.type === CON ? ACK : NON;
    const mid = msg.type === CON ? msg.messageId : this.nextMid();
    this.stats.responses++;
    this.sendRaw(encodeWithParts(type, CONTENT, mid, msg.token, form.etagOpt, tail, body), address, port);
  }

  private respond(
    msg: CoapMessage,
    address: string,
    port: number,
    responseCode: number,
    options: { number: number; value: Buffer }[] = [],
    payload = EMPTY_BUF,
  ): void {
    const type: MessageType = msg.type === CON ? ACK : NON;
    const mid = msg.type === CON ? msg.messageId : this.nextMid();
    this.stats.responses++;
    this.sendRaw(encodeMessage(type, responseCode, mid, msg.token, options, payload), address, port);
  }

  private onAck(endpointKeyValue: string, mid: number): void {
    this.stats.acks++;
    const endpoint = this.byEndpoint.get(endpointKeyValue);
    if (endpoint === undefined) return;
    for (const rel of endpoint.relations) {
      if (rel.inflightMid !== mid) continue;
      rel.inflightMid = -1;
      rel.inflight = null;
      rel.lastConfirmedAt = now();
      this.leaveWindow(rel);
      if (rel.closing) this.removeRelation(rel);
      else if (rel.pending) {
        rel.pending = false;
        this.sendCurrent(rel, false);
      }
      return;
    }
  }

  /** RFC 7641 3.6: an RST in reply to a notification (of any type) cancels the relation. */
  private onRst(endpointKeyValue: string, mid: number): void {
    this.stats.resets++;
    const endpoint = this.byEndpoint.get(endpointKeyValue);
    if (endpoint === undefined) return;
    for (const rel of endpoint.relations) {
      if (rel.lastMid === mid || rel.inflightMid === mid) {
        this.removeRelation(rel);
        this.stats.observersRemovedByRst++;
        return;
      }
    }
  }

  // ---- notifications -----------------------------------------------------------------------------------

  private onStateChange(changes: DeviceChange[]): void {
    for (const change of changes) {
      if (change.settings) this.enqueueResource(this.settingsResources.get(change.deviceId));
      if (change.record) this.enqueueResource(this.recordResources.get(change.deviceId));
    }
    if (!this.pumpScheduled) this.pump();
  }

  private enqueueResource(resource: ObservedResource | undefined): void {
    if (resource === undefined) return;
    for (let rel = resource.head; rel !== null; rel = rel.next) {
      // A relation with a CON in flight is not queued: the newer state replaces that notification at its ACK
      // or its next retransmission (RFC 7641 4.5.2), whether or not the window has room.
      if (rel.inflightMid !== -1) rel.pending = true;
      else this.enqueue(rel);
    }
  }

  private enqueue(rel: Relation): void {
    if (rel.queued) return;
    rel.queued = true;
    this.queue.push(rel);
  }

  /**
   * Sends queued notifications, `fanoutChunk` per event-loop turn, while the in-flight window has room. Between
   * chunks the socket's ACKs and RSTs are read, so a 100,000-observer fan-out neither stalls ACK processing
   * (which would trigger retransmissions) nor holds 100,000 datagrams in memory at once; a full window pauses
   * the fan-out until ACKs (or first timeouts) free slots. Each notification is built from the current document
   * when it is sent, so a state that changed again meanwhile is sent once, newest first.
   */
  private pump(): void {
    let sent = 0;
    const chunk = this.options.fanoutChunk;
    while (this.queueHead < this.queue.length && sent < chunk) {
      if (this.windowUsed >= this.options.maxInflight) {
        // Resumed by leaveWindow. Checked before every send: whether the next one is confirmable is only known
        // when it is built, and a paused NON costs no more than the wait for one ACK.
        if (!this.windowBlocked) this.stats.windowFull++;
        this.windowBlocked = true;
        return;
      }
      const rel = this.queue[this.queueHead++]!;
      rel.queued = false;
      const refresh = rel.refreshDue;
      rel.refreshDue = false;
      if (!rel.dead && !rel.closing && (!refresh || rel.inflightMid === -1)) {
        this.sendCurrent(rel, refresh);
        sent++;
      }
    }
    if (this.queueHead < this.queue.length) this.schedulePump();
    else {
      this.queue = [];
      this.queueHead = 0;
    }
  }

  private schedulePump(): void {
    if (this.pumpScheduled) return;
    this.pumpScheduled = true;
    setImmediate(this.pumpLater);
  }

  private enterWindow(rel: Relation): void {
    if (rel.inWindow) return;
    rel.inWindow = true;
    this.windowUsed++;
  }

  private leaveWindow(rel: Relation): void {
    if (!rel.inWindow) return;
    rel.inWindow = false;
    this.windowUsed--;
    if (this.windowBlocked) {
      this.windowBlocked = false;
      // Later, not now: the ACKs read in this turn of the event loop free their slots first, then one pump
      // refills them in a batch.
      this.schedulePump();
    }
  }

  /** Sends the relation's current state if it differs from what it last got (or `force`: a liveness refresh). */
  private sendCurrent(rel: Relation, force: boolean): void {
    const resource = rel.resource;
    const doc = this.documentFor(resource.deviceId, resource.kind);
    if (doc === undefined) {
      this.sendFinalNotFound(rel);
      return;
    }
    if (doc.version === rel.lastVersion && !force) return;
    if (rel.inflightMid !== -1) {
      // RFC 7641 4.5.2: one CON notification at a time; the newer state replaces the one in flight when
      // it is acknowledged or at its next retransmission, keeping the retransmission counter and timeout.
      rel.pending = true;
      return;
    }
    const t = now();
    const confirmable =
      rel.confirmable || force || t - rel.lastConfirmedAt >= this.options.confirmableRefreshMs;
    const form = this.formFor(resource, doc, rel.format);
    const mid = this.nextMid();
    const bytes = encodeFromObserveForm(
      confirmable ? CON : NON,
      CONTENT,
      mid,
      rel.token,
      form,
      OBSERVE_FORM_SPLIT,
      resource.nextSeq(),
    );
    rel.lastVersion = doc.version;
    rel.lastMid = mid;
    this.stats.notifications++;
    if (confirmable) {
      this.stats.confirmableNotifications++;
      this.track(rel, mid, bytes, t, true);
    }
    this.sendRaw(bytes, rel.endpoint.address, rel.endpoint.port);
  }

  /** RFC 7641 4.2: observers of a resource that is gone get a final 4.04 (no Observe option) and are removed. */
  private sendFinalNotFound(rel: Relation): void {
    const mid = this.nextMid();
    const confirmable = rel.confirmable;
    const bytes = encodeMessage(
      confirmable ? CON : NON,
      NOT_FOUND,
      mid,
      Buffer.from(rel.token, 'latin1'),
      [],
    );
    this.stats.finalNotFound++;
    this.detachFromResource(rel);
    rel.closing = true;
    rel.lastMid = mid;
    if (confirmable) {
      rel.pending = false;
      this.track(rel, mid, bytes, now(), rel.inflightMid === -1);
    } else {
      this.removeRelation(rel);
    }
    this.sendRaw(bytes, rel.endpoint.address, rel.endpoint.port);
  }

  /** Starts (fresh: enters the window) or continues (replacement, 4.5.2) the retransmission state of a CON. */
  private track(rel: Relation, mid: number, bytes: Buffer, t: number, fresh: boolean): void {
    rel.inflightMid = mid;
    rel.inflight = bytes;
    if (fresh) {
      rel.retransmits = 0;
      rel.timeoutMs = Math.round(
        this.options.ackTimeoutMs * (1 + Math.random() * (this.options.ackRandomFactor - 1)),
      );
      this.enterWindow(rel);
      this.schedule(rel, t + rel.timeoutMs);
    }
  }

  private schedule(rel: Relation, deadline: number): void {
    const slot = Math.ceil(deadline / this.tickMs);
    rel.slot = slot;
    const bucket = this.wheel.get(slot);
    if (bucket === undefined) this.wheel.set(slot, [rel]);
    else bucket.push(rel);
    if (this.wheelTimer === undefined) {
      this.wheelTimer = setInterval(() => this.onTick(), this.tickMs);
      this.wheelTimer.unref();
    }
  }

  private onTick(): void {
    const t = now();
    const due = Math.floor(t / this.tickMs);
    for (const [slot, bucket] of this.wheel) {
      if (slot > due) continue;
      this.wheel.delete(slot);
      for (const rel of bucket) {
        if (rel.dead || rel.slot !== slot || rel.inflightMid === -1) continue;
        try {
          this.onAckTimeout(rel, t);
        } catch (err) {
          this.stats.internalErrors++;
          this.options.logger.error('coap retransmission failed', {
            error: err instanceof Error ? err.message : String(err),
          });
        }
      }
    }
    if (this.wheel.size === 0 && this.wheelTimer !== undefined) {
      clearInterval(this.wheelTimer);
      this.wheelTimer = undefined;
    }
  }

  private onAckTimeout(rel: Relation, t: number): void {
    // Out of the window at its first timeout: its retransmissions follow their own backoff, bounded by
    // MAX_RETRANSMIT, and must not stall notifications to peers that answer.
    this.leaveWindow(rel);
    if (rel.retransmits >= this.options.maxRetransmit) {
      // RFC 7641 4.5: an unacknowledged confirmable notification means the client is no longer interested.
      this.removeRelation(rel);
      this.stats.observersRemovedByTimeout++;
      return;
    }
    rel.retransmits++;
    rel.timeoutMs *= 2;
    if (rel.pending && !rel.closing) {
      // Replace the notification in flight by the newest state (RFC 7641 4.5.2), same counter and timeout.
      rel.pending = false;
      const resource = rel.resource;
      const doc = this.documentFor(resource.deviceId, resource.kind);
      if (doc === undefined) {
        this.sendFinalNotFound(rel);
      } else {
        const mid = this.nextMid();
        const bytes = encodeFromObserveForm(
          CON,
          CONTENT,
          mid,
          rel.token,
          this.formFor(resource, doc, rel.format),
          OBSERVE_FORM_SPLIT,
          resource.nextSeq(),
        );
        rel.lastVersion = doc.version;
        rel.lastMid = mid;
        rel.inflightMid = mid;
        rel.inflight = bytes;
        this.stats.notifications++;
        this.stats.confirmableNotifications++;
        this.sendRaw(bytes, rel.endpoint.address, rel.endpoint.port);
      }
    } else if (rel.inflight !== null) {
      this.stats.retransmissions++;
      this.sendRaw(rel.inflight, rel.endpoint.address, rel.endpoint.port);
    }
    this.schedule(rel, t + rel.timeoutMs);
  }

  /**
   * Queues a confirmable refresh for observers not confirmed within the refresh period (RFC 7641 4.5). The
   * refreshes go through the same queue and window as a fan-out.
   */
  private refreshSweep(): void {
    const t = now();
    const limit = this.options.confirmableRefreshMs;
    for (const endpoint of this.byEndpoint.values()) {
      for (const rel of endpoint.relations) {
        if (!rel.closing && rel.inflightMid === -1 && t - rel.lastConfirmedAt >= limit) {
          rel.refreshDue = true;
          this.enqueue(rel);
        }
      }
    }
    if (!this.pumpScheduled && !this.closing) this.pump();
  }

  private detachFromResource(rel: Relation): void {
    const resource = rel.resource;
    if (resource.remove(rel) && resource.count === 0) {
      const resources = this.resourceMap(resource.kind);
      if (resources.get(resource.deviceId) === resource) resources.delete(resource.deviceId);
    }
  }

  private removeRelation(rel: Relation): void {
    if (rel.dead) return;
    rel.dead = true;
    rel.inflight = null;
    rel.inflightMid = -1;
    this.leaveWindow(rel);
    this.detachFromResource(rel);
    const endpoint = rel.endpoint;
    const list = endpoint.relations;
    const index = list.indexOf(rel);
    if (index !== -1) list.splice(index, 1);
    if (list.length === 0 && this.byEndpoint.get(endpoint.key) === endpoint)
      this.byEndpoint.delete(endpoint.key);
    this.relationCount--;
  }

  // ---- sending -----------------------------------------------------------------------------------------

  private nextMid(): number {
    this.mid = (this.mid + 1) & 0xffff;
    return this.mid;
  }

  private sendRaw(bytes: Buffer, address: string, port: number): void {
    const socket = this.socket;
    // Not bound: before listen() or once close() has begun. A notification can still be produced then (a bus
    // message or a reload finishing during shutdown), and dgram throws synchronously on a closing socket.
    if (socket === undefined || !this.isBound) return;
    // No callback: a failed send surfaces as the socket's 'error' event, which is handled (counted, logged).
    socket.send(bytes, port, address);
  }

  /** For readiness and metrics. */
  snapshot(): {
    observers: number;
    resources: number;
    endpoints: number;
    queued: number;
    inflightWindow: number;
  } {
    return {
      observers: this.relationCount,
      resources: this.settingsResources.size + this.recordResources.size,
      endpoints: this.byEndpoint.size,
      queued: this.queue.length - this.queueHead,
      inflightWindow: this.windowUsed,
    };
  }
}

function endpointKey(address: string, port: number): string {
  return `${port}|${address}`;
}
