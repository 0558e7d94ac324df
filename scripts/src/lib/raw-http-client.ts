// A minimal HTTP/1.1 keep-alive client for the benchmarks' load generators.
import net from 'node:net';

/**
 * A minimal HTTP/1.1 keep-alive client over raw sockets: node:http's client costs about 1 ms of CPU per
 * request, which at 1,000/s would take most of one of this machine's two cores from the system measured.
 * One request per connection at a time; requests queue for a free connection, which is the least recently
 * used one (first in, first out). A connection the server closed (its keep-alive timeout is 5 s by
 * default) is replaced when next needed, and a request whose connection closes under it answers 0.
 */
export class RawHttpClient {
  private readonly idle: net.Socket[] = [];
  private readonly waiting: ((s: net.Socket) => void)[] = [];
  private readonly all = new Set<net.Socket>();
  private readonly extraHeaders: string;
  private closed = false;

  /** `headers` go on every request (e.g. `{ authorization: 'Bearer …' }`). */
  constructor(
    private readonly port: number,
    connections: number,
    headers: Record<string, string> = {},
  ) {
    this.extraHeaders = Object.entries(headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('');
    for (let i = 0; i < connections; i++) this.idle.push(this.open());
  }

  private open(): net.Socket {
    const socket = net.connect(this.port, '127.0.0.1');
    socket.setNoDelay(true);
    // Errors end in 'close'; without a listener an ECONNRESET would be thrown.
    socket.on('error', () => undefined);
    socket.once('close', () => this.all.delete(socket));
    this.all.add(socket);
    return socket;
  }

  private async acquire(): Promise<net.Socket> {
    const socket = this.idle.shift() ?? (await new Promise<net.Socket>((r) => this.waiting.push(r)));
    return socket.destroyed ? this.open() : socket;
  }

  post(path: string, body: string): Promise<number> {
    return this.request(
      `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1:${this.port}\r\n${this.extraHeaders}` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
  }

  get(path: string): Promise<number> {
    return this.request(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1:${this.port}\r\n${this.extraHeaders}\r\n`);
  }

  /** Sends one request (its whole text) and resolves with the status once the whole response is read. */
  private async request(text: string): Promise<number> {
    const socket = await this.acquire();
    const status = await new Promise<number>((resolve) => {
      let buf: Buffer = Buffer.alloc(0);
      const done = (code: number): void => {
        socket.off('data', onData);
        socket.off('close', onClose);
        resolve(code);
      };
      const onClose = (): void => done(0);
      const onData = (chunk: Buffer): void => {
        buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
        const headerEnd = buf.indexOf('\r\n\r\n');
        if (headerEnd < 0) return;
        const head = buf.subarray(0, headerEnd).toString('latin1');
        const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < headerEnd + 4 + length) return;
        done(Number(head.slice(9, 12)));
      };
      socket.on('data', onData);
      socket.once('close', onClose);
      socket.write(text);
    });
    const next = this.waiting.shift();
    if (next !== undefined) next(socket);
    else if (!this.closed) this.idle.push(socket);
    return status;
  }

  close(): void {
    this.closed = true;
    for (const s of this.all) s.destroy();
  }
}
