import type { AddressInfo } from 'node:net';
import type { DtlsServer, DtlsSession } from '../dtls/index.js';
import type { Peer, Transport, TransportReceiver } from './transport.js';

/**
 * CoAP over DTLS (RFC 7252 §9.1, the "coaps" scheme): every established DTLS session is one peer, identified
 * by the device its pre-shared key belongs to. The session object is the peer (it carries key, address, port
 * and deviceId), so the message layer answers and notifies through the session the request came by, and a
 * session that ends (close_notify, idle, replaced by a new handshake from the same address, key revoked or
 * expired) takes its Observe relations with it.
 */
export class DtlsTransport implements Transport {
  readonly kind = 'dtls';

  constructor(readonly server: DtlsServer) {}

  get bound(): boolean {
    return this.server.bound;
  }

  attach(receiver: TransportReceiver): void {
    this.server.onApplicationData = (session, data) => receiver.onDatagram(data, session, this);
    this.server.onSessionEnd = (session) => receiver.onPeerClosed(session);
  }

  listen(port: number, host?: string): Promise<void> {
    return this.server.listen(port, host);
  }

  address(): AddressInfo {
    return this.server.address();
  }

  send(bytes: Buffer, peer: Peer): void {
    // Peers of this transport are the server's own session objects (see attach).
    this.server.send(peer as DtlsSession, bytes);
  }

  close(): Promise<void> {
    return this.server.close();
  }
}
