import type { DeliveryEvents, DeliveryTransport } from '../delivery/recorder.js';
import type { VisibleDocument } from '../domain/documents.js';
import type { DeviceChange } from '../domain/gateway-state.js';
import {
  CON,
  CONTENT,
  ContentFormat,
  NON,
  NOT_FOUND,
  Opt,
  VALID,
  encodeFromObserveForm,
  encodeMessage,
  encodeOptions,
  uintBytes,
  type MessageType,
} from './codec.js';
import {
  Exchange,
  type Endpoint,
  type ExchangeHandler,
  type InboundRequest,
  type MessageLayer,
} from './messages.js';
import { now, type CoapServerOptions, type CoapStats } from './options.js';
import { OBSERVE_FORM_SPLIT, formEtagEquals, observeForm, type DocumentFormat } from './representations.js';
import type { Peer } from './transport.js';

/**
 * The observe layer (RFC 7641; aiocoap's `ObservableResource`, Californium's `ObserveLayer`/`ObserveManager`):
 * relations and their resources, registration and its replacement rules, notification encoding, the RFC 7641
 * 4.5.2 rule for a newer state while a confirmable notification is in flight, the confirmable refresh sweep
 * (4.5) and the fan-out pump. Reliability (ACK matching, retransmission, the in-flight window) is the message
 * layer's; this layer owns what a relation does at each of those events.
 */

export type ResourceKind = 'settings' | 'record';

/** What became of a registration: registered, or refused at one of the relation caps (CoapServerOptions). */
export type Registration = 'registered' | 'endpoint_cap' | 'address_cap' | 'total_cap';

/** Relation lifecycle events, logged at debug level with the device id. */
type RelationEvent =
  'registered' | 'replaced' | 'deregistered' | 'reset' | 'confirmable_timeout' | 'peer_closed';

/** The current document of an observable resource, looked up synchronously; undefined when it is gone. */
export type DocumentLookup = (deviceId: string, kind: ResourceKind) => VisibleDocument | undefined;

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
  /** The device's slot in the delivery recorder (a DeliveryRef; -1: not known yet). */
  deliverySlot = -1;
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
 * One observe relation, kept as small as Observe needs (design §3.7: node-coap's held `res` costs ~4 KB): its
 * message state is the Exchange it extends. The token is a latin1 string: a Buffer would cost an object plus a
 * backing store, and a slice of the request would pin the whole datagram. Times are whole milliseconds.
 */
export class Relation extends Exchange {
  prev: Relation | null = null;
  next: Relation | null = null;
  attached = true;
  /** The document last sent (null: none), so unchanged states are not re-sent; an ACK acknowledges it. */
  lastDoc: VisibleDocument | null = null;
  /** Monotonic ms of the last proof of life: the registration itself or an ACK to a CON notification. */
  lastConfirmedAt: number;
  /** A newer state arrived while a CON was in flight (RFC 7641 4.5.2): sent on ACK or at the next timeout. */
  pending = false;
  queued = false;
  /** Queued for a confirmable liveness refresh (RFC 7641 4.5) rather than for a change. */
  refreshDue = false;
  /** A final 4.04 is in flight; the relation is out of its resource and ends on ACK, RST or timeout. */
  closing = false;

  constructor(
    readonly endpoint: Endpoint<Relation>,
    readonly token: string,
    readonly resource: ObservedResource,
    readonly format: DocumentFormat,
    readonly confirmable: boolean,
    /** Monotonic ms of the registration. */
    readonly since: number,
  ) {
    super();
    this.lastConfirmedAt = since;
  }

  get lastVersion(): number {
    return this.lastDoc?.version ?? 0;
  }
}

/** One relation as the device view shows it (GET /api/devices/{device_id}, design §3.8). */
export interface RelationView {
  resource: ResourceKind;
  transport: DeliveryTransport;
  type: 'CON' | 'NON';
  address: string;
  port: number;
  since: string;
  last_version: number | null;
  con_in_flight: boolean;
  last_confirmed_at: string;
}

const transportOf = (rel: Relation): DeliveryTransport =>
  rel.endpoint.transport.kind === 'dtls' ? 'dtls' : 'plain';

export class ObserveLayer implements ExchangeHandler<Relation> {
  /** Set when the server begins to close: the refresh sweep stops starting fan-outs. */
  closing = false;
  /** Observed resources by device id, one map per kind (no concatenated key string per resource). */
  private readonly settingsResources = new Map<string, ObservedResource>();
  private readonly recordResources = new Map<string, ObservedResource>();
  private relations = 0;
  /**
   * The caps' counts, kept apart for authenticated peers (DTLS sessions: the peer has a device id) and
   * unauthenticated ones (plain CoAP), so that plain traffic, whose source address anyone can forge, can
   * never use up the budget of authenticated devices (GATEWAY_COAP_SECURITY=both). Each budget has
   * maxRelations in all and maxRelationsPerAddress per source address (the IP, any port); a server with one
   * kind of transport uses one budget, so the caps mean what they always meant there.
   */
  private readonly budgets = { authenticated: new RelationBudget(), unauthenticated: new RelationBudget() };
  /** Max-Age of notifications, seconds (see the constructor). */
  readonly observeMaxAgeS: number;
  private queue: Relation[] = [];
  private queueHead = 0;
  private pumpScheduled = false;
  private readonly pumpLater = (): void => {
    this.pumpScheduled = false;
    this.pump();
  };
  private refreshTimer: NodeJS.Timeout | undefined;
  /** Where sends, acknowledgements and relation changes of settings resources are reported (design §3.8). */
  delivery: DeliveryEvents | undefined;

  constructor(
    private readonly messages: MessageLayer<Relation>,
    private readonly options: CoapServerOptions,
    private readonly stats: CoapStats,
    private readonly lookup: DocumentLookup,
  ) {
    // Notifications carry a Max-Age that outlives the refresh period, so a device does not treat a quiet
    // relation as stale before the periodic confirmable notification refreshes it (RFC 7641 4.3.1).
    this.observeMaxAgeS = Math.min(0xffffffff, Math.ceil((options.confirmableRefreshMs * 1.1) / 1000));
  }

  get relationCount(): number {
    return this.relations;
  }

  /** Relations in each budget (see `budgets`): what maxRelations caps, for /metrics. */
  get relationCounts(): { authenticated: number; unauthenticated: number } {
    return {
      authenticated: this.budgets.authenticated.total,
      unauthenticated: this.budgets.unauthenticated.total,
    };
  }

  /**
   * Relations to the device's settings resource on this server (the delivery record's `observed_by`); with
   * `dtlsOnly`, only those of its DTLS sessions.
   */
  settingsRelationsOf(deviceId: string, dtlsOnly = false): number {
    const resource = this.settingsResources.get(deviceId);
    if (resource === undefined || !dtlsOnly) return resource?.count ?? 0;
    let n = 0;
    for (let rel = resource.head; rel !== null; rel = rel.next) if (transportOf(rel) === 'dtls') n++;
    return n;
  }

  /** Devices with at least one relation to their settings here. */
  settingsObserved(): IterableIterator<string> {
    return this.settingsResources.keys();
  }

  /** The device's relations to either resource, at most `limit` of them, and how many there are. */
  relationsOf(deviceId: string, limit: number): { relations: RelationView[]; total: number } {
    const relations: RelationView[] = [];
    let total = 0;
    const wall = Date.now() - now();
    for (const resource of [this.settingsResources.get(deviceId), this.recordResources.get(deviceId)]) {
      for (let rel = resource?.head ?? null; rel !== null; rel = rel.next) {
        total++;
        if (relations.length >= limit) continue;
        relations.push({
          resource: rel.resource.kind,
          transport: transportOf(rel),
          type: rel.confirmable ? 'CON' : 'NON',
          address: rel.endpoint.peer.address,
          port: rel.endpoint.peer.port,
          since: new Date(wall + rel.since).toISOString(),
          last_version: rel.lastDoc?.version ?? null,
          con_in_flight: rel.inflightMid !== -1,
          last_confirmed_at: new Date(wall + rel.lastConfirmedAt).toISOString(),
        });
      }
    }
    return { relations, total };
  }

  get resourceCount(): number {
    return this.settingsResources.size + this.recordResources.size;
  }

  get queued(): number {
    return this.queue.length - this.queueHead;
  }

  /** Starts the confirmable refresh sweep (RFC 7641 4.5), a fraction of the refresh period apart. */
  start(): void {
    this.refreshTimer = setInterval(
      () => this.refreshSweep(),
      Math.max(1000, Math.min(this.options.confirmableRefreshMs / 8, 3_600_000)),
    );
    this.refreshTimer.unref();
  }

  stop(): void {
    if (this.refreshTimer !== undefined) clearInterval(this.refreshTimer);
  }

  // ---- registration ------------------------------------------------------------------------------------

  /**
   * Registers (or replaces) the relation of `req`'s peer and token with the resource `doc` belongs to and
   * answers with the current state. Over a relation cap nothing is registered or sent, and the caller answers:
   * like a plain GET at the endpoint cap (RFC 7641 4.1: a server unwilling to add an observer omits the
   * Observe option), 5.03 with Max-Age at the address and total caps. A replacement is never refused: the
   * relation it replaces is removed before the caps are checked.
   */
  register(
    req: InboundRequest,
    tokenKey: string,
    kind: ResourceKind,
    format: DocumentFormat,
    doc: VisibleDocument,
    etags: readonly Buffer[],
  ): Registration {
    const msg = req.msg;
    // The registry's own id string (the document's), not the request's copy: one string per device.
    const deviceId = (doc.body as { device_id: string }).device_id;
    const resources = this.resourceMap(kind);
    // The same peer observing again with the same token, or the same resource with a new token, replaces its
    // relation (never duplicates it).
    const known = this.messages.endpointOf(req.peer.key);
    if (known !== undefined) {
      const existing = known.exchanges;
      // One ObservedResource per (device, kind) while it has observers, so "the same resource" is an identity
      // test: comparing device-id strings here was the largest cost of a registration (profile of
      // bench:gateway, ~100 relations per endpoint). A relation already closing with its final 4.04 has left
      // its resource and is not replaced; it ends on its own ACK, RST or timeout.
      const current = resources.get(deviceId);
      // Backwards, without copying: removeRelation splices this array. At most maxRelationsPerEndpoint long.
      for (let i = existing.length - 1; i >= 0; i--) {
        const rel = existing[i]!;
        if (rel.token === tokenKey || rel.resource === current) {
          this.removeRelation(rel);
          this.event('replaced', rel);
        }
      }
      if (existing.length >= this.options.maxRelationsPerEndpoint) {
        // The cap keeps per-endpoint lookups (ACK, RST, re-registration) short and stops one endpoint from
        // claiming an unbounded share of memory.
        this.stats.registrationsRefused++;
        return this.refused('endpoint_cap', deviceId, req.peer);
      }
    }
    const budget = this.budgetOf(req.peer);
    if (budget.total >= this.options.maxRelations) {
      this.stats.registrationsOverTotalCap++;
      return this.refused('total_cap', deviceId, req.peer);
    }
    const address = req.peer.address;
    if (budget.at(address) >= this.options.maxRelationsPerAddress) {
      this.stats.registrationsOverAddressCap++;
      return this.refused('address_cap', deviceId, req.peer);
    }
    budget.take(address);
    // removeRelation drops an endpoint with its last relation: then it is created again (one map lookup saved
    // when the peer keeps other relations, the common case of a device observing two resources).
    const endpoint =
      known !== undefined && known.exchanges.length > 0
        ? known
        : this.messages.endpointFor(req.peer, req.transport);
    let resource = resources.get(deviceId);
    if (resource === undefined) {
      resource = new ObservedResource(deviceId, kind);
      resources.set(deviceId, resource);
    }
    const form = this.formFor(resource, doc, format);
    const rel = new Relation(endpoint, tokenKey, resource, format, msg.type === CON, now());
    resource.add(rel);
    endpoint.exchanges.push(rel);
    this.relations++;
    rel.lastDoc = doc;
    this.event('registered', rel);
    // Whether the answer's settings need a confirmable notification after it (design §3.8): the ACK of that one
    // is the evidence that a device registering after its notification (or after a restart) holds them.
    const confirm =
      this.delivery?.registered(deviceId, kind === 'settings' ? doc : null, transportOf(rel), resource) ===
      true;
    // Piggybacked in the ACK of a CON registration; a NON registration gets a NON response (RFC 7252 5.2),
    // whose RST cancels the relation like a notification's.
    const mid = this.messages.replyMid(msg);
    if (msg.type === NON) rel.lastMid = mid;
    const type = this.messages.replyType(msg);
    if (etags.some((e) => formEtagEquals(form, e))) {
      // RFC 7252 5.10.6 / RFC 7641 3.1: the client holds this version already: 2.03 Valid, no payload.
      const validTail = encodeOptions(
        [{ number: Opt.MaxAge, value: uintBytes(this.observeMaxAgeS) }],
        Opt.Observe,
      );
      const validForm = Buffer.concat([form.subarray(0, OBSERVE_FORM_SPLIT), validTail]);
      this.messages.sendReply(req, this.encode(rel, type, VALID, mid, validForm));
      // The device named this version's ETag: it holds these settings (the evidence design §3.8 states).
      if (kind === 'settings') this.delivery?.acknowledged(deviceId, doc, transportOf(rel), resource);
      return 'registered';
    }
    this.messages.sendReply(req, this.encode(rel, type, CONTENT, mid, form));
    if (confirm) {
      // Once more, confirmable, through the fan-out's queue and in-flight window (as a refresh, RFC 7641 4.5).
      rel.refreshDue = true;
      this.enqueue(rel);
      this.schedulePump();
    }
    return 'registered';
  }

  /** Observe=1 (RFC 7641 3.6), or a registration for a resource that is gone: ends the peer's relation. */
  deregister(peerKey: string, tokenKey: string): void {
    const endpoint = this.messages.endpointOf(peerKey);
    if (endpoint === undefined) return;
    const list = endpoint.exchanges;
    for (let i = list.length - 1; i >= 0; i--) {
      const rel = list[i]!;
      if (rel.token === tokenKey) {
        this.removeRelation(rel);
        this.stats.observersDeregistered++;
        this.event('deregistered', rel);
      }
    }
  }

  // ---- notification encoding (the one place) ----------------------------------------------------------

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

  /**
   * Every message that carries an Observe option (registration response or notification): the relation's
   * token, the form, and the resource's next sequence number (RFC 7641 3.4: per resource, strictly increasing).
   */
  private encode(rel: Relation, type: MessageType, code: number, mid: number, form: Buffer): Buffer {
    return encodeFromObserveForm(
      type,
      code,
      mid,
      rel.token,
      form,
      OBSERVE_FORM_SPLIT,
      rel.resource.nextSeq(),
    );
  }

  /**
   * Sends `doc` to the relation. A confirmable one enters retransmission: fresh, or, when it replaces the
   * notification in flight (RFC 7641 4.5.2), keeping that one's retransmission counter and timeout.
   */
  private notify(rel: Relation, doc: VisibleDocument, confirmable: boolean): void {
    const form = this.formFor(rel.resource, doc, rel.format);
    const mid = this.messages.nextMid();
    const bytes = this.encode(rel, confirmable ? CON : NON, CONTENT, mid, form);
    rel.lastDoc = doc;
    rel.lastMid = mid;
    this.stats.notifications++;
    if (rel.resource.kind === 'settings')
      this.delivery?.sent(rel.resource.deviceId, doc, transportOf(rel), confirmable, rel.resource);
    if (confirmable) {
      this.stats.confirmableNotifications++;
      this.messages.track(rel, mid, bytes, rel.inflightMid === -1);
    }
    this.messages.send(rel.endpoint, bytes);
  }

  /**
   * RFC 7641 4.5.2, decided here only: one confirmable notification at a time per relation. While one is in
   * flight a newer state is not sent beside it; it is marked pending and replaces the one in flight at its
   * ACK (onAcknowledged) or at its next retransmission (onRetransmit). True when the relation must wait.
   */
  private holdWhileInFlight(rel: Relation): boolean {
    if (rel.inflightMid === -1) return false;
    rel.pending = true;
    return true;
  }

  /** Sends the relation's current state if it differs from what it last got (or `force`: a liveness refresh). */
  private sendCurrent(rel: Relation, force: boolean): void {
    const resource = rel.resource;
    const doc = this.lookup(resource.deviceId, resource.kind);
    if (doc === undefined) {
      this.sendFinalNotFound(rel);
      return;
    }
    if (doc === rel.lastDoc && !force) return;
    if (this.holdWhileInFlight(rel)) return;
    const confirmable =
      rel.confirmable || force || now() - rel.lastConfirmedAt >= this.options.confirmableRefreshMs;
    this.notify(rel, doc, confirmable);
  }

  /** RFC 7641 4.2: observers of a resource that is gone get a final 4.04 (no Observe option) and are removed. */
  private sendFinalNotFound(rel: Relation): void {
    const mid = this.messages.nextMid();
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
      this.messages.track(rel, mid, bytes, rel.inflightMid === -1);
    } else {
      this.removeRelation(rel);
    }
    this.messages.send(rel.endpoint, bytes);
  }

  // ---- events from the message layer -------------------------------------------------------------------

  onAcknowledged(rel: Relation): void {
    rel.lastConfirmedAt = now();
    this.stats.notificationsAcknowledged++;
    const delivery = this.delivery;
    if (delivery !== undefined) {
      const resource = rel.resource;
      if (resource.kind === 'settings' && !rel.closing && rel.lastDoc !== null)
        delivery.acknowledged(resource.deviceId, rel.lastDoc, transportOf(rel), resource);
      else delivery.heard(resource.deviceId, transportOf(rel), resource);
    }
    if (rel.closing) this.removeRelation(rel);
    else if (rel.pending) {
      rel.pending = false;
      this.sendCurrent(rel, false);
    }
  }

  /** RFC 7641 3.6: an RST in reply to a notification (of any type) cancels the relation. */
  onReset(rel: Relation): void {
    this.removeRelation(rel);
    this.stats.observersRemovedByRst++;
    this.delivery?.heard(rel.resource.deviceId, transportOf(rel), rel.resource);
    this.event('reset', rel);
  }

  onRetransmit(rel: Relation): boolean {
    if (!rel.pending || rel.closing) return false;
    // The newest state replaces the notification in flight (RFC 7641 4.5.2), same counter and timeout.
    rel.pending = false;
    const resource = rel.resource;
    const doc = this.lookup(resource.deviceId, resource.kind);
    if (doc === undefined) this.sendFinalNotFound(rel);
    else this.notify(rel, doc, true);
    return true;
  }

  /** RFC 7641 4.5: an unacknowledged confirmable notification means the client is no longer interested. */
  onGiveUp(rel: Relation): void {
    this.removeRelation(rel);
    this.stats.observersRemovedByTimeout++;
    this.event('confirmable_timeout', rel);
  }

  onPeerClosed(endpoint: Endpoint<Relation>): void {
    const list = endpoint.exchanges;
    for (let i = list.length - 1; i >= 0; i--) {
      const rel = list[i]!;
      this.removeRelation(rel);
      this.stats.observersRemovedByPeerClosed++;
      this.event('peer_closed', rel);
    }
  }

  onWindowOpen(): void {
    // Later, not now: the ACKs read in this turn of the event loop free their slots first, then one pump
    // refills them in a batch.
    this.schedulePump();
  }

  // ---- fan-out -----------------------------------------------------------------------------------------

  onStateChange(changes: readonly DeviceChange[]): void {
    for (const change of changes) {
      if (change.settings) this.enqueueResource(this.settingsResources.get(change.deviceId));
      if (change.record) this.enqueueResource(this.recordResources.get(change.deviceId));
    }
    if (!this.pumpScheduled) this.pump();
  }

  private enqueueResource(resource: ObservedResource | undefined): void {
    if (resource === undefined) return;
    for (let rel = resource.head; rel !== null; rel = rel.next) {
      // Whether or not the window has room: a relation with a CON in flight waits for it (4.5.2).
      if (!this.holdWhileInFlight(rel)) this.enqueue(rel);
    }
  }

  private enqueue(rel: Relation): void {
    if (rel.queued) return;
    rel.queued = true;
    this.queue.push(rel);
  }

  /**
   * Sends queued notifications, `fanoutChunk` per event-loop turn, while the in-flight window has room. Between
   * chunks the transports' ACKs and RSTs are read, so a 100,000-observer fan-out neither stalls ACK processing
   * (which would trigger retransmissions) nor holds 100,000 datagrams in memory at once; a full window pauses
   * the fan-out until ACKs (or first timeouts) free slots. Each notification is built from the current document
   * when it is sent, so a state that changed again meanwhile is sent once, newest first.
   */
  private pump(): void {
    let sent = 0;
    const chunk = this.options.fanoutChunk;
    while (this.queueHead < this.queue.length && sent < chunk) {
      // Resumed by onWindowOpen. Checked before every send: whether the next one is confirmable is only known
      // when it is built, and a paused NON costs no more than the wait for one ACK.
      if (this.messages.windowFull()) return;
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

  /**
   * Queues a confirmable refresh for observers not confirmed within the refresh period (RFC 7641 4.5). The
   * refreshes go through the same queue and window as a fan-out.
   */
  private refreshSweep(): void {
    const t = now();
    const limit = this.options.confirmableRefreshMs;
    for (const endpoint of this.messages.endpoints.values()) {
      for (const rel of endpoint.exchanges) {
        if (!rel.closing && rel.inflightMid === -1 && t - rel.lastConfirmedAt >= limit) {
          rel.refreshDue = true;
          this.enqueue(rel);
        }
      }
    }
    if (!this.pumpScheduled && !this.closing) this.pump();
  }

  // ---- removal -----------------------------------------------------------------------------------------

  private resourceMap(kind: ResourceKind): Map<string, ObservedResource> {
    return kind === 'settings' ? this.settingsResources : this.recordResources;
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
    this.messages.end(rel);
    this.detachFromResource(rel);
    this.relations--;
    this.budgetOf(rel.endpoint.peer).release(rel.endpoint.peer.address);
    if (rel.resource.kind === 'settings')
      this.delivery?.relationsChanged(rel.resource.deviceId, rel.resource);
  }

  // ---- relation lifecycle log (debug level; design §3.8) ---------------------------------------------

  private event(event: RelationEvent, rel: Relation): void {
    if (!this.debug) return;
    const peer = rel.endpoint.peer;
    this.options.logger.debug('observe relation', {
      event,
      device_id: rel.resource.deviceId,
      resource: rel.resource.kind,
      transport: transportOf(rel),
      type: rel.confirmable ? 'CON' : 'NON',
      peer: `${peer.address}:${peer.port}`,
      last_version: rel.lastVersion,
    });
  }

  private refused(cap: Exclude<Registration, 'registered'>, deviceId: string, peer: Peer): Registration {
    if (this.debug) {
      this.options.logger.debug('observe relation', {
        event: 'refused',
        cap,
        device_id: deviceId,
        transport: peer.deviceId === null ? 'plain' : 'dtls',
        peer: `${peer.address}:${peer.port}`,
      });
    }
    return cap;
  }

  /** Whether the logger writes debug lines: checked once per event, so the info level costs nothing. */
  private get debug(): boolean {
    const logger = this.options.logger as { isDebugEnabled?: () => boolean };
    return logger.isDebugEnabled?.() ?? false;
  }

  private budgetOf(peer: Peer): RelationBudget {
    return peer.deviceId === null ? this.budgets.unauthenticated : this.budgets.authenticated;
  }
}

/** Relations counted in all and per source address, for one kind of peer (see ObserveLayer.budgets). */
class RelationBudget {
  total = 0;
  private readonly byAddress = new Map<string, number>();

  at(address: string): number {
    return this.byAddress.get(address) ?? 0;
  }

  take(address: string): void {
    this.total++;
    this.byAddress.set(address, this.at(address) + 1);
  }

  release(address: string): void {
    this.total--;
    const held = this.at(address) - 1;
    if (held <= 0) this.byAddress.delete(address);
    else this.byAddress.set(address, held);
  }
}
