import type { AddressInfo } from 'node:net';
import type { GatewayState } from '../domain/gateway-state.js';
import { MessageLayer } from './messages.js';
import type { DeliveryEvents } from '../delivery/recorder.js';
import { ObserveLayer, type DocumentLookup, type Relation, type RelationView } from './observe.js';
import { newCoapStats, now, type CoapServerOptions, type CoapStats } from './options.js';
import { ReportResource, type ReportDeps } from './report-resource.js';
import { Resources } from './resources.js';
import type { Transport } from './transport.js';
import { UdpTransport } from './udp-transport.js';

export { defaultCoapOptions, type CoapLogger, type CoapServerOptions, type CoapStats } from './options.js';

/**
 * The gateway's CoAP endpoint. It implements RFC 7252 message handling and RFC 7641 Observe itself, as a
 * stack of small layers (the split aiocoap and Californium use):
 *
 *   resources.ts   routing, content negotiation, ETag, /.well-known/core      (+ blockwise.ts: Block2)
 *   observe.ts     relations, registration, notifications, RFC 7641 4.5.2, refresh sweep, fan-out pump
 *   messages.ts    parsing, ping/RST, ACK/RST matching, retransmission, in-flight window, timer wheel
 *   transport.ts   datagram endpoints with a peer identity: plain UDP (udp-transport.ts), DTLS
 *
 * The message layer serves several transports at once (plain CoAP and CoAP over DTLS in one process, sharing
 * the observed resources and the fan-out); each relation answers through the transport its peer came by.
 *
 * node-coap 1.5.0 is not used on this path; design §3.7 lists why (duplicate relations, Observe=1 ignored,
 * RST ignored for NON, ACK-typed NON notifications, about 4 KB per held response, a retransmission storm from
 * an unsized socket buffer and a synchronous fan-out, and network-reachable crashes: a Block1 request whose
 * first block is missing throws from the socket's message handler, and an unacknowledged exchange emits
 * 'error' without a listener once EXCHANGE_LIFETIME passes).
 */

/** A transport served beside (or instead of) the default plain UDP one, and where it listens. */
export interface CoapTransportBinding {
  transport: Transport;
  port: number;
  host?: string;
}

export interface CoapServerTransports {
  /** Serve plain CoAP on the port given to listen() (default true). */
  plain?: boolean;
  /** Further transports (e.g. DTLS on 5684), each bound at its own port by listen(). */
  transports?: CoapTransportBinding[];
}

export class CoapServer {
  readonly stats: CoapStats = newCoapStats();
  private readonly messages: MessageLayer<Relation>;
  private readonly observe: ObserveLayer;
  private readonly resources: Resources;
  private readonly plain: UdpTransport | undefined;
  private readonly extra: CoapTransportBinding[] = [];
  private listening = false;
  private closing = false;

  constructor(state: GatewayState, options: CoapServerOptions, transports: CoapServerTransports = {}) {
    const lookup: DocumentLookup = (deviceId, kind) =>
      kind === 'settings' ? state.settingsDocument(deviceId) : state.recordDocument(deviceId);
    this.messages = new MessageLayer<Relation>(options, this.stats);
    this.observe = new ObserveLayer(this.messages, options, this.stats, lookup);
    const resources = new Resources(state, this.messages, this.observe, options, lookup);
    this.resources = resources;
    this.messages.bind(resources, this.observe);
    if (transports.plain !== false) {
      this.plain = new UdpTransport({
        logger: options.logger,
        socketBufferBytes: options.socketBufferBytes,
        onSendError: () => {
          this.stats.sendErrors++;
        },
      });
      this.plain.attach(this.messages);
    }
    for (const binding of transports.transports ?? [])
      this.addTransport(binding.transport, binding.port, binding.host);
    state.onChange((changes) => this.observe.onStateChange(changes));
  }

  /**
   * Adds a transport (e.g. DTLS) bound at `port` by listen(), beside the plain one. Its peers share the
   * observed resources, the fan-out and the in-flight window with every other transport's.
   */
  addTransport(transport: Transport, port: number, host?: string): void {
    if (this.listening || this.closing) throw new Error('CoAP transports must be added before listen()');
    transport.attach(this.messages);
    this.extra.push(host === undefined ? { transport, port } : { transport, port, host });
  }

  /** Every transport, the plain one first. */
  get transports(): readonly Transport[] {
    const all: Transport[] = this.plain === undefined ? [] : [this.plain];
    for (const binding of this.extra) all.push(binding.transport);
    return all;
  }

  /** Every transport is bound (readiness). */
  get bound(): boolean {
    const all = this.transports;
    return all.length > 0 && all.every((t) => t.bound);
  }

  /** Where the delivery record hears of sends, acknowledgements and relations (design §3.8). */
  set delivery(events: DeliveryEvents | undefined) {
    this.observe.delivery = events;
  }

  /** Serves `/devices/{id}/reported` (design §3.4): where devices' reports go and who may speak for whom. */
  set reports(deps: ReportDeps) {
    const counts = this.stats.reportsByResult;
    this.resources.reports = new ReportResource(this.messages, {
      ...deps,
      count: (result) => {
        counts[result] = (counts[result] ?? 0) + 1;
      },
    });
  }

  /** Relations to the device's settings resource on this server. */
  settingsRelationsOf(deviceId: string, dtlsOnly = false): number {
    return this.observe.settingsRelationsOf(deviceId, dtlsOnly);
  }

  /** Devices observing their settings here. */
  settingsObserved(): IterableIterator<string> {
    return this.observe.settingsObserved();
  }

  /** The device's live relations here (at most `limit` listed) for the device view. */
  relationsOf(deviceId: string, limit: number): { relations: RelationView[]; total: number } {
    return this.observe.relationsOf(deviceId, limit);
  }

  get observerCount(): number {
    return this.observe.relationCount;
  }

  /** Relations of authenticated (DTLS) and of plain CoAP peers: each is capped apart (COAP_MAX_RELATIONS). */
  get observerCounts(): { authenticated: number; unauthenticated: number } {
    return this.observe.relationCounts;
  }

  /** The plain transport's address (the first added transport's when plain CoAP is off). */
  address(): AddressInfo {
    const first = this.transports[0];
    if (first === undefined) throw new Error('CoAP server is not listening');
    return first.address();
  }

  /**
   * Binds the plain transport at `port` and `host`, and every added transport at its own. Resolves once all are
   * bound; rejects (with none left bound) if one cannot be.
   */
  async listen(port: number, host = '0.0.0.0'): Promise<void> {
    const bindings: CoapTransportBinding[] = [];
    if (this.plain !== undefined) bindings.push({ transport: this.plain, port, host });
    bindings.push(...this.extra);
    if (bindings.length === 0) throw new Error('CoAP server has no transport');
    const started: Transport[] = [];
    try {
      for (const b of bindings) {
        await b.transport.listen(b.port, b.host);
        started.push(b.transport);
      }
    } catch (err) {
      for (const t of started) await t.close();
      throw err;
    }
    this.listening = true;
    this.observe.start();
  }

  /**
   * Stops reading requests, lets the notification queue drain (bounded by `graceMs`), then closes every
   * transport. Datagrams already handed to a transport are sent before it closes.
   */
  async close(graceMs = 2000): Promise<void> {
    if (!this.listening || this.closing) return;
    this.closing = true;
    this.messages.closing = true;
    this.observe.closing = true;
    const deadline = now() + graceMs;
    while (this.observe.queued > 0 && now() < deadline) await new Promise((r) => setImmediate(r));
    this.messages.stop();
    this.observe.stop();
    await Promise.all(this.transports.map((t) => t.close()));
    this.listening = false;
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
      observers: this.observe.relationCount,
      resources: this.observe.resourceCount,
      endpoints: this.messages.endpoints.size,
      queued: this.observe.queued,
      inflightWindow: this.messages.inflightWindow,
    };
  }
}
