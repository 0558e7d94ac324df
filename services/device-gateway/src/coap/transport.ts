import type { AddressInfo } from 'node:net';

/**
 * The bottom layer of the CoAP stack (the place of aiocoap's `transports/` and Californium's `Connector`): a
 * datagram endpoint that hands whole datagrams up with the identity of the peer that sent them, and sends
 * datagrams to a peer. Plain UDP (udp-transport.ts) and DTLS (RFC 6347, a session per peer) implement it; the
 * message layer above serves several transports at once and answers each peer through the transport it came by.
 */
export interface Peer {
  /** Unique among the live peers of all transports: ACK/RST matching and relations are keyed by it. */
  readonly key: string;
  readonly address: string;
  readonly port: number;
  /** The device this peer authenticated as (DTLS PSK session); null over plain CoAP (no identity). */
  readonly deviceId: string | null;
}

export interface TransportReceiver {
  onDatagram(bytes: Buffer, peer: Peer, transport: Transport): void;
  /** The peer is gone (a DTLS session ended, was revoked or replaced): drop every relation it holds. */
  onPeerClosed(peer: Peer): void;
}

export interface Transport {
  readonly kind: 'udp' | 'dtls';
  attach(receiver: TransportReceiver): void;
  listen(port: number, host?: string): Promise<void>;
  address(): AddressInfo;
  readonly bound: boolean;
  send(bytes: Buffer, peer: Peer): void;
  close(): Promise<void>;
}
