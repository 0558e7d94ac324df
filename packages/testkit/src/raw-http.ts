import { connect } from 'node:net';

export interface RawHttpAnswer {
  /** Everything the server sent before it closed the connection. */
  text: string;
  /** The status line's code (NaN if the answer has none). */
  status: number;
  /** The Content-Type header's value (undefined without one). */
  contentType: string | undefined;
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
  const contentType = /\r\ncontent-type: *([^\r]*)\r\n/i.exec(at === -1 ? text : text.slice(0, at + 2))?.[1];
  return { text, status, contentType, json, closedAfterMs };
}

/**
 * What is wrong (nothing: []) with a service's answer to a request whose headers never end (design §6: read
 * within 10 s, checked every second): it must be a 408 problem+json `request_timeout`, and the connection
 * closed between 9.5 and 12.5 s after the request began.
 */
export async function headersDeadlineFaults(port: number, path: string): Promise<string[]> {
  const answer = await rawHttpExchange(port, `GET ${path} HTTP/1.1\r\nHost: x\r\n`);
  const faults: string[] = [];
  if (answer.status !== 408) faults.push(`status ${answer.status}, not 408`);
  if (answer.contentType !== 'application/problem+json') faults.push(`Content-Type ${answer.contentType}`);
  if (answer.json?.code !== 'request_timeout') faults.push(`code ${String(answer.json?.code)}`);
  if (answer.closedAfterMs < 9_500 || answer.closedAfterMs >= 12_500)
    faults.push(`closed after ${answer.closedAfterMs} ms, not within 9.5-12.5 s`);
  return faults;
}
