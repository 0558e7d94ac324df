import { connect } from 'node:net';

export interface RawHttpAnswer {
  /** Everything the server sent before it closed the connection. */
  text: string;
  /** The status line's code (NaN if the answer has none). */
  status: number;
  /** The body after the blank line, parsed as JSON (undefined if it is not JSON). */
  json: Record<string, unknown> | undefined;
  /** ms from sending until the server closed the connection. */
  closedAfterMs: number;
}

/**
 * Sends `bytes` over a fresh TCP connection to 127.0.0.1:`port` and reads until the server closes it: what
 * node:http answers before any route runs (a read deadline, bytes that are not HTTP, oversized headers).
 */
export async function rawHttpExchange(port: number, bytes: string | Buffer): Promise<RawHttpAnswer> {
  const socket = connect(port, '127.0.0.1');
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
  const started = Date.now();
  const closedAfterMs = await new Promise<number>((resolve, reject) => {
    socket.once('error', reject);
    socket.once('close', () => resolve(Date.now() - started));
    socket.write(bytes);
  });
  const status = Number(/^HTTP\/1\.1 (\d{3}) /.exec(text)?.[1]);
  const at = text.indexOf('\r\n\r\n');
  let json: Record<string, unknown> | undefined;
  try {
    json = at === -1 ? undefined : (JSON.parse(text.slice(at + 4)) as Record<string, unknown>);
  } catch {
    json = undefined;
  }
  return { text, status, json, closedAfterMs };
}
