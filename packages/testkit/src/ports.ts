import { createSocket } from 'node:dgram';
import { createServer } from 'node:net';

/**
 * A port the OS reports free right now on 127.0.0.1 (bind to port 0, read it, release it).
 * Another process may take it before the caller binds; the OS hands out ephemeral ports
 * round-robin, so parallel test workers practically never receive the same one.
 */
export async function freePort(protocol: 'tcp' | 'udp' = 'tcp'): Promise<number> {
  return protocol === 'tcp' ? freeTcpPort() : freeUdpPort();
}

function freeTcpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    server.listen({ port: 0, host: '127.0.0.1', exclusive: true }, () => {
      const address = server.address();
      if (address === null || typeof address === 'string') {
        server.close();
        reject(new Error('no TCP port assigned'));
        return;
      }
      server.close(() => {
        resolve(address.port);
      });
    });
  });
}

function freeUdpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const socket = createSocket('udp4');
    socket.unref();
    socket.once('error', reject);
    socket.bind({ port: 0, address: '127.0.0.1', exclusive: true }, () => {
      const { port } = socket.address();
      socket.close(() => {
        resolve(port);
      });
    });
  });
}
