import { errorMessage } from '@platform/service-kit';
import {
  ACK,
  CON,
  EMPTY,
  EMPTY_BUF,
  NON,
  RST,
  encodeMessage,
  parseMessage,
  type CoapMessage,
  type CoapOption,
  type MessageType,
  type ParseFailure,
} from './codec.js';
import { now, type CoapServerOptions, type CoapStats } from './options.js';
import type { Peer, Transport, TransportReceiver } from './transport.js';

/**
 * The message layer (RFC 7252 section 4; aiocoap's `messagemanager.py`, Californium's `ReliabilityLayer`): it
 * parses every datagram of every transport, answers pings and format errors, matches ACKs and RSTs to what
 * the server sent, and retransmits confirmable messages with exponential backoff, paced by a server-wide
 * in-flight window and timed by one timer wheel. Requests go up to the resources, events of an exchange (ACK,
 * RST, retransmission due, give up) to its owner, the observe layer: the only confirmable messages this server
 * originates are notifications.
 *
 * No duplicate-detection cache (RFC 7252 4.5): the only method served is GET, which is idempotent, so a
 * duplicate request is processed again; an Observe registration is keyed by peer and token, so a retransmitted
 * registration replaces itself instead of duplicating.
 */

/**
 * What the message layer keeps of one exchange of the server's: the last message id sent on it and the
 * confirmable message awaiting its ACK. The observe layer's Relation extends it, so an observe relation costs
 * one object (design §3.7: node-coap's held `res` costs ~4 KB); no per-message object or map entry exists.
 */
export abstract class Exchange {
  /** Message id of the last message sent (any type), to match an RST. */
  lastMid = -1;
  /** Confirmable message awaiting its ACK: message id (-1 none), bytes, retransmissions, timeout (ms). */
  inflightMid = -1;
  inflight: Buffer | null = null;
  retransmits = 0;
  timeoutMs = 0;
  /** Timer wheel slot of its next timeout; an entry in any other slot is stale. */
  slot = 0;
  /** Holds one of the server-wide window's slots (see CoapServerOptions.maxInflight). */
  inWindow = false;
  /** Ended: out of its endpoint, never sent again. */
  dead = false;
  abstract readonly endpoint: Endpoint<Exchange>;
}

/**
 * One peer with live exchanges. ACK and RST carry only a message id, so they are matched among the exchanges
 * of the peer they came from; replies go back through the transport the peer is reached by.
 */
export class Endpoint<X extends Exchange> {
  readonly exchanges: X[] = [];
  constructor(
    readonly peer: Peer,
    readonly transport: Transport,
  ) {}
}

/** A request as the upper layers see it: the message, who sent it and by which transport. */
export interface InboundRequest {
  readonly msg: CoapMessage;
  readonly peer: Peer;
  readonly transport: Transport;
}

export interface RequestHandler {
  handleRequest(req: InboundRequest): void;
}

/** What the owner of the exchanges (the observe layer) is told; every call is synchronous. */
export interface ExchangeHandler<X extends Exchange> {
  /** The peer acknowledged the confirmable message in flight; it is already out of the window and cleared. */
  onAcknowledged(x: X): void;
  /** The peer answered the exchange's last message with RST. */
  onReset(x: X): void;
  /**
   * The message in flight is due again (its counter and timeout already advanced). True when the owner sent a
   * replacement itself (RFC 7641 4.5.2); false to retransmit the same bytes.
   */
  onRetransmit(x: X): boolean;
  /** MAX_RETRANSMIT retransmissions went unacknowledged. */
  onGiveUp(x: X): void;
  /** The transport ended the peer: every exchange of it goes, nothing is sent. */
  onPeerClosed(endpoint: Endpoint<X>): void;
  /** The in-flight window has room again after `windowFull()` said it had none. */
  onWindowOpen(): void;
}

export class MessageLayer<X extends Exchange> implements TransportReceiver {
  /** Set when the server begins to close: datagrams are no longer read. */
  closing = false;
  private mid = Math.floor(Math.random() * 0x10000);
  /** Peers with live exchanges, by peer key. */
  private readonly byPeer = new Map<string, Endpoint<X>>();
  private requests!: RequestHandler;
  private owner!: ExchangeHandler<X>;
  /** Confirmable messages holding a window slot, and whether a sender waits for one to free. */
  private windowUsed = 0;
  private windowBlocked = false;
  private readonly wheel = new Map<number, X[]>();
  private wheelTimer: NodeJS.Timeout | undefined;
  private readonly tickMs: number;

  constructor(
    private readonly options: CoapServerOptions,
    private readonly stats: CoapStats,
  ) {
    this.tickMs = Math.max(5, Math.min(100, Math.floor(options.ackTimeoutMs / 4)));
  }

  /** Connects the layers above; called once, before any transport listens. */
  bind(requests: RequestHandler, owner: ExchangeHandler<X>): void {
    this.requests = requests;
    this.owner = owner;
  }

  // ---- incoming ----------------------------------------------------------------------------------------

  onDatagram(bytes: Buffer, peer: Peer, transport: Transport): void {
    if (this.closing) return;
    this.stats.datagramsIn++;
    try {
      this.handleDatagram(bytes, peer, transport);
    } catch (err) {
      // Defence in depth: nothing above should throw, but a datagram must never end the process. No reply:
      // internal error text never goes on the wire.
      this.stats.internalErrors++;
      this.options.logger.error('coap datagram handling failed', {
        error: errorMessage(err),
      });
    }
  }

  onPeerClosed(peer: Peer): void {
    const endpoint = this.byPeer.get(peer.key);
    if (endpoint !== undefined) this.owner.onPeerClosed(endpoint);
  }

  private handleDatagram(buf: Buffer, peer: Peer, transport: Transport): void {
    const parsed = parseMessage(buf, this.options.maxTokenLength);
    if (!parsed.ok) {
      this.onMalformed(parsed.failure, peer, transport);
      return;
    }
    const msg = parsed.message;
    const cls = msg.code >> 5;
    if (msg.code === EMPTY) {
      switch (msg.type) {
        case CON: // CoAP ping (RFC 7252 4.3): answered with RST.
          this.reset(msg.messageId, peer, transport);
          return;
        case ACK:
          this.onAck(peer, msg.messageId);
          return;
        case RST:
          this.onRst(peer, msg.messageId);
          return;
        case NON: // An empty NON has no meaning; ignored.
          return;
      }
    }
    if (cls === 0) {
      if (msg.type === CON || msg.type === NON) {
        this.stats.requests++;
        this.requests.handleRequest({ msg, peer, transport });
      } else {
        // ACK/RST must not carry a request code.
        this.countMalformed('request_in_ack_or_rst');
      }
      return;
    }
    if (msg.type === CON) {
      // A confirmable response or a reserved code class: a server has no exchange to match it to (4.2).
      this.reset(msg.messageId, peer, transport);
    } else if (msg.type === ACK || msg.type === NON) {
      if (cls === 2 || cls === 4 || cls === 5) {
        // A piggybacked response to a notification? Notifications are never requests; nothing to do.
        return;
      }
      this.countMalformed('reserved_code_class');
    }
  }

  private onMalformed(failure: ParseFailure, peer: Peer, transport: Transport): void {
    this.countMalformed(failure.reason);
    // RFC 7252 4.2/4.3: a CON with a format error is rejected with RST; a NON is silently ignored; an unknown
    // version is silently ignored whatever its type (section 3).
    if (failure.type === CON && failure.messageId !== undefined && failure.reason !== 'version') {
      this.reset(failure.messageId, peer, transport);
    }
  }

  private countMalformed(reason: string): void {
    this.stats.malformed++;
    this.stats.malformedByReason[reason] = (this.stats.malformedByReason[reason] ?? 0) + 1;
  }

  private reset(messageId: number, peer: Peer, transport: Transport): void {
    transport.send(encodeMessage(RST, EMPTY, messageId, EMPTY_BUF, []), peer);
  }

  private onAck(peer: Peer, mid: number): void {
    this.stats.acks++;
    const endpoint = this.byPeer.get(peer.key);
    if (endpoint === undefined) return;
    for (const x of endpoint.exchanges) {
      if (x.inflightMid !== mid) continue;
      x.inflightMid = -1;
      x.inflight = null;
      this.leaveWindow(x);
      this.owner.onAcknowledged(x);
      return;
    }
  }

  /** An RST in reply to the exchange's last message, of any type (RFC 7641 3.6 for notifications). */
  private onRst(peer: Peer, mid: number): void {
    this.stats.resets++;
    const endpoint = this.byPeer.get(peer.key);
    if (endpoint === undefined) return;
    for (const x of endpoint.exchanges) {
      if (x.lastMid === mid || x.inflightMid === mid) {
        this.owner.onReset(x);
        return;
      }
    }
  }

  // ---- responses ---------------------------------------------------------------------------------------

  /** RFC 7252 5.2: the response to a CON request is piggybacked in its ACK; a NON request gets a NON. */
  replyType(msg: CoapMessage): MessageType {
    return msg.type === CON ? ACK : NON;
  }

  /** The piggybacked ACK echoes the request's message id; a NON response takes a new one. */
  replyMid(msg: CoapMessage): number {
    return msg.type === CON ? msg.messageId : this.nextMid();
  }

  /** Sends an encoded response (built with `replyType` and `replyMid`) to the request's peer. */
  sendReply(req: InboundRequest, bytes: Buffer): void {
    this.stats.responses++;
    req.transport.send(bytes, req.peer);
  }

  respond(
    req: InboundRequest,
    responseCode: number,
    options: readonly CoapOption[] = [],
    payload = EMPTY_BUF,
  ): void {
    const msg = req.msg;
    this.sendReply(
      req,
      encodeMessage(this.replyType(msg), responseCode, this.replyMid(msg), msg.token, options, payload),
    );
  }

  nextMid(): number {
    this.mid = (this.mid + 1) & 0xffff;
    return this.mid;
  }

  // ---- peers and exchanges -----------------------------------------------------------------------------

  endpointOf(peerKey: string): Endpoint<X> | undefined {
    return this.byPeer.get(peerKey);
  }

  /** The peer's endpoint, created with this transport when it has none. */
  endpointFor(peer: Peer, transport: Transport): Endpoint<X> {
    let endpoint = this.byPeer.get(peer.key);
    if (endpoint === undefined) {
      endpoint = new Endpoint<X>(peer, transport);
      this.byPeer.set(peer.key, endpoint);
    }
    return endpoint;
  }

  get endpoints(): ReadonlyMap<string, Endpoint<X>> {
    return this.byPeer;
  }

  /** Ends an exchange: its retransmission stops, it leaves its endpoint, which goes with its last exchange. */
  end(x: X): void {
    x.dead = true;
    x.inflight = null;
    x.inflightMid = -1;
    this.leaveWindow(x);
    const endpoint = x.endpoint;
    const list = endpoint.exchanges;
    const index = list.indexOf(x);
    if (index !== -1) list.splice(index, 1);
    if (list.length === 0 && this.byPeer.get(endpoint.peer.key) === endpoint)
      this.byPeer.delete(endpoint.peer.key);
  }

  /** Sends a message of an exchange to its peer, through the transport the peer is reached by. */
  send(endpoint: Endpoint<Exchange>, bytes: Buffer): void {
    endpoint.transport.send(bytes, endpoint.peer);
  }

  // ---- reliability -------------------------------------------------------------------------------------

  /**
   * Starts (`fresh`: enters the window, first timeout ACK_TIMEOUT × a random factor up to ACK_RANDOM_FACTOR,
   * RFC 7252 4.2) or continues (a replacement: RFC 7641 4.5.2 keeps the counter and timeout) the retransmission
   * state of a confirmable message. The caller sends the bytes.
   */
  track(x: X, mid: number, bytes: Buffer, fresh: boolean): void {
    x.inflightMid = mid;
    x.inflight = bytes;
    if (fresh) {
      x.retransmits = 0;
      x.timeoutMs = Math.round(
        this.options.ackTimeoutMs * (1 + Math.random() * (this.options.ackRandomFactor - 1)),
      );
      this.enterWindow(x);
      this.schedule(x, now() + x.timeoutMs);
    }
  }

  /**
   * Whether the in-flight window is full. When it is, the caller stops sending; `onWindowOpen` tells it when
   * a slot frees. Counted once per pause.
   */
  windowFull(): boolean {
    if (this.windowUsed < this.options.maxInflight) return false;
    if (!this.windowBlocked) this.stats.windowFull++;
    this.windowBlocked = true;
    return true;
  }

  get inflightWindow(): number {
    return this.windowUsed;
  }

  private enterWindow(x: X): void {
    if (x.inWindow) return;
    x.inWindow = true;
    this.windowUsed++;
  }

  private leaveWindow(x: X): void {
    if (!x.inWindow) return;
    x.inWindow = false;
    this.windowUsed--;
    if (this.windowBlocked) {
      this.windowBlocked = false;
      this.owner.onWindowOpen();
    }
  }

  private schedule(x: X, deadline: number): void {
    const slot = Math.ceil(deadline / this.tickMs);
    x.slot = slot;
    const bucket = this.wheel.get(slot);
    if (bucket === undefined) this.wheel.set(slot, [x]);
    else bucket.push(x);
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
      for (const x of bucket) {
        if (x.dead || x.slot !== slot || x.inflightMid === -1) continue;
        try {
          this.onAckTimeout(x, t);
        } catch (err) {
          this.stats.internalErrors++;
          this.options.logger.error('coap retransmission failed', {
            error: errorMessage(err),
          });
        }
      }
    }
    if (this.wheel.size === 0 && this.wheelTimer !== undefined) {
      clearInterval(this.wheelTimer);
      this.wheelTimer = undefined;
    }
  }

  private onAckTimeout(x: X, t: number): void {
    // Out of the window at its first timeout: its retransmissions follow their own backoff, bounded by
    // MAX_RETRANSMIT, and must not stall messages to peers that answer.
    this.leaveWindow(x);
    if (x.retransmits >= this.options.maxRetransmit) {
      this.owner.onGiveUp(x);
      return;
    }
    x.retransmits++;
    x.timeoutMs *= 2;
    if (!this.owner.onRetransmit(x) && x.inflight !== null) {
      this.stats.retransmissions++;
      this.send(x.endpoint, x.inflight);
    }
    this.schedule(x, t + x.timeoutMs);
  }

  /** Stops the retransmission timer for good (the server is closing; nothing is sent any more). */
  stop(): void {
    if (this.wheelTimer !== undefined) clearInterval(this.wheelTimer);
  }
}
