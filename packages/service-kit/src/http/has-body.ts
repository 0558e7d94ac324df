import type { IncomingMessage } from 'node:http';

/** Whether a request carries a body (RFC 9112 §6.3): Transfer-Encoding, or a Content-Length above zero. */
export function hasBody(req: IncomingMessage): boolean {
  if (req.headers['transfer-encoding'] !== undefined) return true;
  const length = Number(req.headers['content-length'] ?? 0);
  return Number.isFinite(length) && length > 0;
}
