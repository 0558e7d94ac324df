import { createSocket } from 'node:dgram';
import { createServer } from 'node:net';
import { freePort } from '@platform/testkit';

describe('freePort', () => {
  it('returns a TCP port that can be bound', async () => {
    const port = await freePort('tcp');
    expect(port).toBeGreaterThanOrEqual(1024);
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', resolve);
    });
    await new Promise((resolve) => server.close(resolve));
  });

  it('returns a UDP port that can be bound', async () => {
    const port = await freePort('udp');
    expect(port).toBeGreaterThanOrEqual(1024);
    const socket = createSocket('udp4');
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject);
      socket.bind(port, '127.0.0.1', resolve);
    });
    expect(socket.address().port).toBe(port);
    await new Promise<void>((resolve) => socket.close(resolve));
  });

  it('defaults to TCP and hands out different ports to concurrent callers', async () => {
    const ports = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
    expect(new Set(ports).size).toBe(4);
  });
});
