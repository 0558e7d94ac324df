// AWS Signature Version 4 for S3, written from the specification (Amazon S3 API Reference,
// "Authenticating Requests (AWS Signature Version 4)": "Using Query Parameters" for presigned URLs,
// "Using the Authorization Header" for the rest), not from the SDK whose URLs it checks. The test kit's
// s3rver verifies presigned URLs with it (s3rver itself accepts any signature), and the RADOS Gateway
// set-up signs its few configuration requests (bucket, CORS, topic, notification) with it.
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';

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

function sha256Hex(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

export interface SigningCredentials {
  accessKeyId: string;
  secretAccessKey: string;
}

/** The path as S3 signs it: each segment encoded once, `/` kept (whatever encoding the URL carries). */
function canonicalUri(url: URL): string {
  return uriEncode(decodeURIComponent(url.pathname), true);
}

/** Every query parameter but the signature, encoded and sorted by name, then value. */
function canonicalQuery(url: URL): string {
  const params: Array<[string, string]> = [];
  for (const [k, v] of url.searchParams)
    if (k !== 'X-Amz-Signature') params.push([uriEncode(k, false), uriEncode(v, false)]);
  params.sort(([a, av], [b, bv]) => (a < b ? -1 : a > b ? 1 : av < bv ? -1 : av > bv ? 1 : 0));
  return params.map(([k, v]) => `${k}=${v}`).join('&');
}

function signature(
  secretAccessKey: string,
  day: string,
  region: string,
  service: string,
  stringToSign: string,
): string {
  const key = hmac(hmac(hmac(hmac(`AWS4${secretAccessKey}`, day), region), service), 'aws4_request');
  return hmac(key, stringToSign).toString('hex');
}

/** `20261122T063712Z`. */
function amzDate(at: Date): string {
  return at
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d{3}/, '');
}

/**
 * The headers that sign `method url` with `body` in the Authorization header (the payload signed), for
 * `service` (`s3`, or `sns` for the gateway's topic API) in `region`.
 */
export function signedHeaders(input: {
  method: string;
  url: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
  region: string;
  service: string;
  credentials: SigningCredentials;
  now?: Date;
}): Record<string, string> {
  const url = new URL(input.url);
  const date = amzDate(input.now ?? new Date());
  const day = date.slice(0, 8);
  const payloadHash = sha256Hex(input.body ?? '');
  const headers: Record<string, string> = {
    ...Object.fromEntries(Object.entries(input.headers ?? {}).map(([k, v]) => [k.toLowerCase(), v])),
    host: url.host,
    'x-amz-date': date,
    'x-amz-content-sha256': payloadHash,
  };
  const names = Object.keys(headers).sort();
  const canonicalRequest = [
    input.method.toUpperCase(),
    canonicalUri(url),
    canonicalQuery(url),
    names.map((n) => `${n}:${headers[n]!.trim()}\n`).join(''),
    names.join(';'),
    payloadHash,
  ].join('\n');
  const scope = `${day}/${input.region}/${input.service}/aws4_request`;
  const stringToSign = ['AWS4-HMAC-SHA256', date, scope, sha256Hex(canonicalRequest)].join('\n');
  const signed = signature(input.credentials.secretAccessKey, day, input.region, input.service, stringToSign);
  return {
    ...headers,
    authorization:
      `AWS4-HMAC-SHA256 Credential=${input.credentials.accessKeyId}/${scope}, ` +
      `SignedHeaders=${names.join(';')}, Signature=${signed}`,
  };
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

/** Whether a request is authenticated by query parameters (a presigned URL) rather than a header. */
export function isPresigned(url: string): boolean {
  return new URL(url, 'http://host').searchParams.has('X-Amz-Signature');
}

/** Checks a presigned (query-string authenticated) request as S3 does: scope, expiry, signature. */
export function verifyPresigned(
  req: PresignedRequest,
  credentials: SigningCredentials,
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
  const date = q.get('X-Amz-Date') ?? '';
  const signedAt = parseAmzDate(date);
  if (signedAt === undefined || !date.startsWith(day)) return { ok: false, reason: 'date' };
  const expiresS = Number(q.get('X-Amz-Expires'));
  // SigV4 presigned URLs may live at most seven days.
  if (!Number.isInteger(expiresS) || expiresS < 1 || expiresS > 604800)
    return { ok: false, reason: 'expires' };
  const expiresAt = new Date(signedAt.getTime() + expiresS * 1000);
  if (now.getTime() > expiresAt.getTime()) return { ok: false, reason: 'expired' };

  const signedNames = (q.get('X-Amz-SignedHeaders') ?? '').split(';').filter((h) => h !== '');
  if (!signedNames.includes('host')) return { ok: false, reason: 'host not signed' };
  const headers = new Map<string, string>();
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) headers.set(name.toLowerCase(), value);
  }
  if (!headers.has('host')) headers.set('host', url.host);
  let canonicalHeaders = '';
  for (const name of [...signedNames].sort()) {
    const value = headers.get(name);
    if (value === undefined) return { ok: false, reason: `signed header ${name} missing` };
    canonicalHeaders += `${name}:${value.trim().replace(/\s+/g, ' ')}\n`;
  }
  const canonicalRequest = [
    req.method.toUpperCase(),
    canonicalUri(url),
    canonicalQuery(url),
    canonicalHeaders,
    [...signedNames].sort().join(';'),
    q.get('X-Amz-Content-Sha256') ?? 'UNSIGNED-PAYLOAD',
  ].join('\n');
  const scope = `${day}/${region}/s3/aws4_request`;
  const stringToSign = ['AWS4-HMAC-SHA256', date, scope, sha256Hex(canonicalRequest)].join('\n');
  const expected = Buffer.from(signature(credentials.secretAccessKey, day, region, 's3', stringToSign));
  const presented = Buffer.from(q.get('X-Amz-Signature') ?? '');
  if (presented.length !== expected.length || !timingSafeEqual(presented, expected)) {
    return { ok: false, reason: 'signature mismatch' };
  }
  return { ok: true, signedHeaders: signedNames, expiresAt };
}
