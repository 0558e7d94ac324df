import type dgram from 'node:dgram';
import type { AddressInfo } from 'node:net';
import { bindUdpSocket, createUdpSocket } from '../net/udp-socket.js';
import type { CoapLogger } from './options.js';
import type { Peer, Transport, TransportReceiver } from './transport.js';

export interface UdpTransportOptions {
  logger: CoapLogger;
  /** SO_RCVBUF / SO_SNDBUF request in bytes; ACKs of a large fan-out must not be dropped in the kernel. */
  socketBufferBytes: number;
  /** Called for each send error the socket reports (counted by the server). */
  onSendError?: (err: Error) => void;
  /**
   * Prefix of this transport's peer keys, so they never equal another transport's (DTLS keys carry their own).
   * Two UDP transports in one server need different prefixes: a client may use one address and port for both.
   */
  keyPrefix?: string;
}

/** A plain CoAP peer: its address and port; it has no identity (RFC 7252 9: NoSec). */
class UdpPeer implements Peer {
  readonly deviceId = null;
  constructor(
    readonly key: string,
    readonly address: string,
    readonly port: number,
  ) {}
}

/** Plain CoAP over one UDP socket (RFC 7252, the "coap" scheme). */
export class UdpTransport implements Transport {
  readonly kind = 'udp';
  private socket: dgram.Socket | undefined;
  private isBound = false;
  private receiver: TransportReceiver | undefined;
  private readonly keyPrefix: string;

  constructor(private readonly options: UdpTransportOptions) {
    this.keyPrefix = options.keyPrefix ?? 'udp';
  }

  get bound(): boolean {
    return this.isBound;
  }

  attach(receiver: TransportReceiver): void {
    this.receiver = receiver;
  }

  address(): AddressInfo {
    if (this.socket === undefined) throw new Error('CoAP server is not listening');
    return this.socket.address();
  }

  /** Binds the socket. Resolves once bound; rejects if the port cannot be bound. */
  listen(port: number, host = '0.0.0.0'): Promise<void> {
    const receiver = this.receiver;
    if (receiver === undefined) return Promise.reject(new Error('UDP transport has no receiver attached'));
    const socket = createUdpSocket(host, this.options.socketBufferBytes);
    this.socket = socket;
    const prefix = this.keyPrefix;
    socket.on('message', (buf, rinfo) =>
      receiver.onDatagram(
        buf,
        new UdpPeer(`${prefix}|${rinfo.port}|${rinfo.address}`, rinfo.address, rinfo.port),
        this,
      ),
    );
    // A send error (e.g. EMSGSIZE, a vanished interface) must never take the process down.
    return bindUdpSocket(socket, port, host, (err) => {
      this.options.onSendError?.(err);
      this.options.logger.warn('coap socket error', { error: err.message });
    }).then(
      () => {
        this.isBound = true;
        this.options.logger.info('coap listening', {
          transport: this.kind,
          address: socket.address().address,
          port: socket.address().port,
          recv_buffer_bytes: socket.getRecvBufferSize(),
          send_buffer_bytes: socket.getSendBufferSize(),
        });
      },
      (err: unknown) => {
        this.socket = undefined;
        throw err;
      },
    );
  }

  send(bytes: Buffer, peer: Peer): void {
    const socket = this.socket;
    // Not bound: before listen() or once close() has begun. A notification can still be produced then (a bus
    // message or a reload finishing during shutdown), and dgram throws synchronously on a closing socket.
    if (socket === undefined || !this.isBound) return;
    // No callback: a failed send surfaces as the socket's 'error' event, which is handled (counted, logged).
    socket.send(bytes, peer.port, peer.address);
  }

  /** Closes the socket; datagrams already handed to it are sent first. */
  async close(): Promise<void> {
    const socket = this.socket;
    if (socket === undefined) return;
    this.isBound = false;
    // One more turn so sends queued on process.nextTick by dgram reach the kernel before the close.
    await new Promise((r) => setImmediate(r));
    await new Promise<void>((resolve) => socket.close(() => resolve()));
    this.socket = undefined;
  }
}
