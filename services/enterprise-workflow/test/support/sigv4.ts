// An independent check of AWS Signature V4 query-string authentication ("presigned URLs"), written
// from the AWS specification (Amazon S3 API Reference, "Authenticating Requests: Using Query
// Parameters (AWS Signature Version 4)"), not from the SDK that produced the URL. s3rver accepts any
// signature, so tests verify URLs with this and put `startVerifyingProxy` in front of s3rver to
// show that a store that does verify refuses tampered or expired URLs.
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';

/** RFC 3986 unreserved characters stay; every other byte is %XX with upper-case hex. */
function uriEncode(value: string, keepSlash: boolean): string {
  let out = '';
  for (const byte of Buffer.from(value, 'utf8')) {
    const ch = String.fromCharCode(byte);
    if (/[A-Za-z0-9\-_.~]/.test(ch) || (keepSlash && ch === '/')) out += ch;
    else out += `%${byte.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
}

function hmac(key: Buffer | string, data: string): Buffer {
  return createHmac('sha256', key).update(data, 'utf8').digest();
}

export interface PresignedRequest {
  method: string;
  url: string;
  /** Request headers as the client sends them (names in any case). `host` is taken from the URL when absent. */
  headers: Record<string, string | undefined>;
}

export type UrlVerdict =
  { ok: true; signedHeaders: string[]; expiresAt: Date } | { ok: false; reason: string };

/** Parses `20261122T063712Z`. */
function parseAmzDate(value: string): Date | undefined {
  const m = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(value);
  if (m === null) return undefined;
  return new Date(
    Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6])),
  );
}

export function verifyPresigned(
  req: PresignedRequest,
  credentials: { accessKeyId: string; secretAccessKey: string },
  now: Date = new Date(),
): UrlVerdict {
  const url = new URL(req.url);
  const q = url.searchParams;
  if (q.get('X-Amz-Algorithm') !== 'AWS4-HMAC-SHA256') return { ok: false, reason: 'algorithm' };
  const credential = q.get('X-Amz-Credential') ?? '';
  const [accessKeyId, day, region, service, terminator] = credential.split('/');
  if (accessKeyId !== credentials.accessKeyId) return { ok: false, reason: 'access key' };
  if (service !== 's3' || terminator !== 'aws4_request' || region === undefined || day === undefined) {
    return { ok: false, reason: 'credential scope' };
  }
  const amzDate = q.get('X-Amz-Date') ?? '';
  const signedAt = parseAmzDate(amzDate);
  if (signedAt === undefined || !amzDate.startsWith(day)) return { ok: false, reason: 'date' };
  const expiresS = Number(q.get('X-Amz-Expires'));
  // SigV4 presigned URLs may live at most seven days.
  if (!Number.isInteger(expiresS) || expiresS < 1 || expiresS > 604800)
    return { ok: false, reason: 'expires' };
  const expiresAt = new Date(signedAt.getTime() + expiresS * 1000);
  if (now.getTime() > expiresAt.getTime()) return { ok: false, reason: 'expired' };

  const signedHeaders = (q.get('X-Amz-SignedHeaders') ?? '').split(';').filter((h) => h !== '');
  if (!signedHeaders.includes('host')) return { ok: false, reason: 'host not signed' };
  const headers = new Map<string, string>();
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) headers.set(name.toLowerCase(), value);
  }
  if (!headers.has('host')) headers.set('host', url.host);
  let canonicalHeaders = '';
  for (const name of [...signedHeaders].sort()) {
    const value = headers.get(name);
    if (value === undefined) return { ok: false, reason: `signed header ${name} missing` };
    canonicalHeaders += `${name}:${value.trim().replace(/\s+/g, ' ')}\n`;
  }

  const params: Array<[string, string]> = [];
  for (const [k, v] of q)
    if (k !== 'X-Amz-Signature') params.push([uriEncode(k, false), uriEncode(v, false)]);
  params.sort(([a, av], [b, bv]) => (a < b ? -1 : a > b ? 1 : av < bv ? -1 : av > bv ? 1 : 0));
  const canonicalQuery = params.map(([k, v]) => `${k}=${v}`).join('&');
  // S3 paths are encoded once, with '/' kept; decode what the URL carries before re-encoding.
  const canonicalUri = uriEncode(decodeURIComponent(url.pathname), true);
  const canonicalRequest = [
    req.method.toUpperCase(),
    canonicalUri,
    canonicalQuery,
    canonicalHeaders,
    [...signedHeaders].sort().join(';'),
    q.get('X-Amz-Content-Sha256') ?? 'UNSIGNED-PAYLOAD',
  ].join('\n');
  const scope = `${day}/${region}/s3/aws4_request`;
  const stringToSign = [
    'AWS4-HMAC-SHA256',
    amzDate,
    scope,
    createHash('sha256').update(canonicalRequest, 'utf8').digest('hex'),
  ].join('\n');
  const signingKey = hmac(
    hmac(hmac(hmac(`AWS4${credentials.secretAccessKey}`, day), region), 's3'),
    'aws4_request',
  );
  const expected = Buffer.from(hmac(signingKey, stringToSign).toString('hex'));
  const presented = Buffer.from(q.get('X-Amz-Signature') ?? '');
  if (presented.length !== expected.length || !timingSafeEqual(presented, expected)) {
    return { ok: false, reason: 'signature mismatch' };
  }
  return { ok: true, signedHeaders, expiresAt };
}

/**
 * An HTTP proxy that checks every request's presigned signature like S3/MinIO would (403 when it
 * does not verify) and forwards verified requests to `target()` (s3rver, whose address may be known
 * only after the proxy's own, since presigned URLs must name the proxy).
 */
export async function startVerifyingProxy(
  target: () => string,
  credentials: { accessKeyId: string; secretAccessKey: string },
): Promise<{ endpoint: string; refused: string[]; stop(): Promise<void> }> {
  const refused: string[] = [];
  const server = createServer((req, res) => {
    const targetUrl = new URL(target());
    const url = `http://${req.headers.host ?? ''}${req.url ?? '/'}`;
    const headers: Record<string, string | undefined> = {};
    for (const [k, v] of Object.entries(req.headers)) headers[k] = Array.isArray(v) ? v.join(',') : v;
    const verdict = verifyPresigned({ method: req.method ?? 'GET', url, headers }, credentials);
    if (!verdict.ok) {
      refused.push(verdict.reason);
      req.resume();
      res.writeHead(403, { 'Content-Type': 'application/xml' });
      res.end(`<Error><Code>SignatureDoesNotMatch</Code><Message>${verdict.reason}</Message></Error>`);
      return;
    }
    const upstream = httpRequest(
      {
        host: targetUrl.hostname,
        port: targetUrl.port,
        method: req.method,
        path: req.url,
        headers: { ...req.headers, host: targetUrl.host },
      },
      (up) => {
        res.writeHead(up.statusCode ?? 502, up.headers);
        up.pipe(res);
      },
    );
    upstream.on('error', () => {
      res.writeHead(502);
      res.end();
    });
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://127.0.0.1:${port}`,
    refused,
    stop: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((err) => (err ? reject(err) : resolve()));
      }),
  };
}
