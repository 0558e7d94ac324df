// A minimal HTTP/1.1 keep-alive client for the benchmarks' load generators.
import net from 'node:net';

/**
 * A minimal HTTP/1.1 keep-alive client over raw sockets: node:http's client costs about 1 ms of CPU per
 * request, which at 1,000/s would take most of one of this machine's two cores from the system measured.
 * One request per connection at a time; requests queue for a free connection.
 */
export class RawHttpClient {
  private readonly idle: net.Socket[] = [];
  private readonly waiting: ((s: net.Socket) => void)[] = [];
  private readonly all: net.Socket[] = [];
  private readonly extraHeaders: string;

  /** `headers` go on every request (e.g. `{ authorization: 'Bearer …' }`). */
  constructor(
    private readonly port: number,
    connections: number,
    headers: Record<string, string> = {},
  ) {
    this.extraHeaders = Object.entries(headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('');
    for (let i = 0; i < connections; i++) {
      const socket = net.connect(port, '127.0.0.1');
      socket.setNoDelay(true);
      this.all.push(socket);
      this.idle.push(socket);
    }
  }

  async post(path: string, body: string): Promise<number> {
    const socket = this.idle.pop() ?? (await new Promise<net.Socket>((r) => this.waiting.push(r)));
    const status = await new Promise<number>((resolve) => {
      let buf: Buffer = Buffer.alloc(0);
      const onData = (chunk: Buffer): void => {
        buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
        const headerEnd = buf.indexOf('\r\n\r\n');
        if (headerEnd < 0) return;
        const head = buf.subarray(0, headerEnd).toString('latin1');
        const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < headerEnd + 4 + length) return;
        socket.off('data', onData);
        resolve(Number(head.slice(9, 12)));
      };
      socket.on('data', onData);
      socket.write(
        `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1:${this.port}\r\n${this.extraHeaders}` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
    });
    const next = this.waiting.shift();
    if (next !== undefined) next(socket);
    else this.idle.push(socket);
    return status;
  }

  close(): void {
    for (const s of this.all) s.destroy();
  }
}
