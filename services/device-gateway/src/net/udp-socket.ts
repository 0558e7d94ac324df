import dgram from 'node:dgram';
import { lookup as dnsLookup } from 'node:dns';
import { isIP, isIPv6 } from 'node:net';

/**
 * The UDP socket both CoAP transports bind (plain CoAP, and DTLS beneath coaps), with sized kernel buffers so
 * the ACKs of a large fan-out are not dropped. dgram resolves the destination of every send() on an
 * unconnected socket through `lookup`; the default (dns.lookup) answers even an IP literal on a later tick,
 * so no datagram of a synchronous fan-out chunk left before the chunk ended and each send paid a closure and
 * a tick. Peers here are always IP literals (rinfo.address): they are answered synchronously; names (a bind
 * host) still go to dns.lookup.
 */
export function createUdpSocket(host: string, bufferBytes: number | undefined): dgram.Socket {
  return dgram.createSocket({
    type: isIPv6(host) ? 'udp6' : 'udp4',
    ...(bufferBytes === undefined ? {} : { recvBufferSize: bufferBytes, sendBufferSize: bufferBytes }),
    lookup: (hostname, options, callback) => {
      const family = isIP(hostname);
      if (family !== 0) callback(null, hostname, family);
      else dnsLookup(hostname, options, callback);
    },
  });
}

/**
 * Binds `socket`: resolves once bound, rejects if the port cannot be bound. Once bound, socket errors (a
 * failed send: EMSGSIZE, a vanished interface) go to `onSocketError` and never take the process down.
 */
export function bindUdpSocket(
  socket: dgram.Socket,
  port: number,
  host: string,
  onSocketError: (err: Error) => void,
): Promise<void> {
  return new Promise((resolve, reject) => {
    socket.once('error', reject);
    socket.bind(port, host, () => {
      socket.off('error', reject);
      socket.on('error', onSocketError);
      resolve();
    });
  });
}
