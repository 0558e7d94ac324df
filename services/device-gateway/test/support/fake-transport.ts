// An in-process Transport for layer tests: it hands datagrams to the server as a DTLS transport would (with a
// peer that carries the device it authenticated as) and records what the server sends. Messages are encoded
// and decoded with coap-packet, independent of the gateway's codec. No socket: the end-to-end DTLS tests use
// real ones; this one tests what the layers above a transport do with a peer identity.
import type { AddressInfo } from 'node:net';
import { generate, parse, type Packet, type ParsedPacket } from 'coap-packet';
import type { Peer, Transport, TransportReceiver } from '../../src/coap/transport.js';

export interface Sent {
  peer: Peer;
  raw: Buffer;
  packet: ParsedPacket;
}

export function fakePeer(n: number, deviceId: string | null, address = `10.0.0.${n}`): Peer {
  return { key: `fake|${n}`, address, port: 40000 + n, deviceId };
}

export class FakeTransport implements Transport {
  readonly kind = 'dtls';
  readonly sent: Sent[] = [];
  private receiver: TransportReceiver | undefined;
  private isBound = false;
  private mid = 1000;

  get bound(): boolean {
    return this.isBound;
  }

  attach(receiver: TransportReceiver): void {
    this.receiver = receiver;
  }

  listen(): Promise<void> {
    this.isBound = true;
    return Promise.resolve();
  }

  address(): AddressInfo {
    return { address: '127.0.0.1', family: 'IPv4', port: 5684 };
  }

  send(bytes: Buffer, peer: Peer): void {
    if (!this.isBound) return;
    this.sent.push({ peer, raw: Buffer.from(bytes), packet: parse(bytes) });
  }

  close(): Promise<void> {
    this.isBound = false;
    return Promise.resolve();
  }

  /** Delivers one request from `peer`; returns its message id. */
  deliver(peer: Peer, packet: Packet): number {
    const messageId = packet.messageId ?? (this.mid = (this.mid + 1) & 0xffff);
    this.receiver!.onDatagram(generate({ ...packet, messageId }), peer, this);
    return messageId;
  }

  /** The session of `peer` ended (as a DTLS transport reports a close_notify, a revocation or a new handshake). */
  closePeer(peer: Peer): void {
    this.receiver!.onPeerClosed(peer);
  }

  /** What was sent to `peer` from index `from` on. */
  to(peer: Peer, from = 0): Sent[] {
    return this.sent.slice(from).filter((s) => s.peer.key === peer.key);
  }

  /** The reply to message id `mid` sent to `peer` (piggybacked ACK). */
  reply(peer: Peer, mid: number): ParsedPacket {
    const found = this.to(peer).find((s) => s.packet.ack && s.packet.messageId === mid);
    if (found === undefined) throw new Error(`no reply to message ${mid}`);
    return found.packet;
  }
}
