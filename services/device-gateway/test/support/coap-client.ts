// A raw CoAP test client over a real UDP socket. It encodes and decodes with coap-packet, an implementation
// independent of the gateway's own codec, and lets a test decide every ACK, RST and retransmission itself.
import dgram from 'node:dgram';
import { generate, parse, type ParsedPacket, type Packet } from 'coap-packet';

export interface Received {
  packet: ParsedPacket;
  raw: Buffer;
  at: number;
}

export class RawCoapClient {
  readonly socket: dgram.Socket;
  readonly inbox: Received[] = [];
  private waiters: (() => void)[] = [];
  private mid = Math.floor(Math.random() * 60000);
  /** When set, every CON from the server is acknowledged automatically (like a conforming client). */
  autoAck = true;

  private constructor(
    readonly port: number,
    readonly host: string,
  ) {
    this.socket = dgram.createSocket('udp4');
    this.socket.on('message', (raw) => {
      let packet: ParsedPacket;
      try {
        packet = parse(raw);
      } catch {
        return;
      }
      this.inbox.push({ packet, raw, at: performance.now() });
      if (this.autoAck && packet.confirmable)
        this.sendRaw(generate({ ack: true, code: '0.00', messageId: packet.messageId }));
      for (const w of this.waiters.splice(0)) w();
    });
  }

  /** `bindAddress`: the client's source address (any 127.0.0.0/8 address is loopback on Linux). */
  static async connect(port: number, host = '127.0.0.1', bindAddress = '127.0.0.1'): Promise<RawCoapClient> {
    const client = new RawCoapClient(port, host);
    await new Promise<void>((resolve) => client.socket.bind(0, bindAddress, resolve));
    return client;
  }

  /**
   * A client on `port` observing the device's settings (a confirmable GET with Observe 0, token `token`), once
   * the first notification (2.05) has arrived.
   */
  static async observeSettings(port: number, deviceId: string, token = 'p1'): Promise<RawCoapClient> {
    const client = await RawCoapClient.connect(port);
    client.send({
      confirmable: true,
      code: 'GET',
      token: Buffer.from(token),
      options: [observe0, ...pathOptions(`/devices/${deviceId}/settings`)],
    });
    await client.waitFor((p) => p.code === '2.05');
    return client;
  }

  nextMid(): number {
    this.mid = (this.mid + 1) & 0xffff;
    return this.mid;
  }

  sendRaw(buf: Buffer): void {
    this.socket.send(buf, this.port, this.host);
  }

  send(packet: Packet): number {
    const messageId = packet.messageId ?? this.nextMid();
    this.sendRaw(generate({ ...packet, messageId }));
    return messageId;
  }

  /** Waits until `predicate` matches a message received after index `from`; returns it. */
  async waitFor(predicate: (p: ParsedPacket) => boolean, timeoutMs = 3000, from = 0): Promise<Received> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const found = this.inbox.slice(from).find((r) => predicate(r.packet));
      if (found !== undefined) return found;
      const left = deadline - performance.now();
      if (left <= 0)
        throw new Error(`no matching CoAP message within ${timeoutMs} ms (inbox ${this.inbox.length})`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Resolves after `ms` and returns messages received meanwhile. */
  async collect(ms: number): Promise<Received[]> {
    const from = this.inbox.length;
    await new Promise((r) => setTimeout(r, ms));
    return this.inbox.slice(from);
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => this.socket.close(() => resolve()));
  }
}

export function option(p: ParsedPacket, name: string): Buffer | undefined {
  return p.options.find((o) => o.name === name)?.value;
}

export function uint(buf: Buffer | undefined): number | undefined {
  if (buf === undefined) return undefined;
  let n = 0;
  for (const b of buf) n = n * 256 + b;
  return n;
}

export function json(p: ParsedPacket): Record<string, unknown> {
  return JSON.parse(p.payload.toString('utf8')) as Record<string, unknown>;
}

export function pathOptions(path: string): { name: 'Uri-Path'; value: Buffer }[] {
  return path
    .split('/')
    .filter((s) => s.length > 0)
    .map((s) => ({ name: 'Uri-Path' as const, value: Buffer.from(s) }));
}

export const observe0 = { name: 'Observe' as const, value: Buffer.alloc(0) };
export const observe1 = { name: 'Observe' as const, value: Buffer.from([1]) };
