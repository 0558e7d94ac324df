// Redaction of secrets in anything that may reach a log line or a diagnostic response.
// Two rules: a value under a sensitive key is replaced whole, and inside every string bearer tokens,
// JWT-shaped tokens, URL passwords and secret-bearing query parameters are masked.

export const REDACTED = '***';

/** Object depth past which values are summarised rather than walked (log lines stay bounded). */
const MAX_DEPTH = 12;

// Keys are compared after lower-casing and dropping `_`/`-`, so `access_token`, `X-Api-Key` and
// `apiKey` all match. Exact `key`/`keys` are redacted, but `object_key` or `request_id` are not.
const SENSITIVE_EXACT = new Set([
  'key',
  'keys',
  'auth',
  'cookie',
  'cookies',
  'setcookie',
  'jwt',
  'pass',
  'pwd',
]);
const SENSITIVE_PARTS = [
  'authorization',
  'token',
  'password',
  'passwd',
  'passphrase',
  'secret',
  'apikey',
  'privatekey',
  'accesskey',
  'credential',
  'signature',
];

/** True when a value stored under `key` must never be logged or shown. */
export function isSensitiveKey(key: string): boolean {
  const normalised = key.toLowerCase().replace(/[_-]/g, '');
  if (SENSITIVE_EXACT.has(normalised)) return true;
  return SENSITIVE_PARTS.some((part) => normalised.includes(part));
}

// `scheme://user:password@host` → `scheme://user:***@host`.
const URL_PASSWORD = /([a-z][a-z0-9+.-]*:\/\/[^\s:/?#@]*):[^\s/?#@]*@/gi;
// RFC 6750 token68 after the Bearer (or Basic) scheme.
const AUTH_SCHEME_CREDENTIALS = /\b(Bearer|Basic)\s+[A-Za-z0-9\-._~+/]+=*/gi;
// Compact JWS: three base64url segments, the first two starting with `eyJ` (`{"`).
const JWT_SHAPE = /\beyJ[A-Za-z0-9_-]*\.eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*/g;
// `name=value` where the name carries a credential: query parameters (including S3 presigned-URL
// `X-Amz-Signature`/`X-Amz-Credential`), connection strings, `password=...` in error text. A bare
// `key=` counts only as a whole word, so `object_key=` stays readable.
const SECRET_ASSIGNMENT =
  /\b((?:[A-Za-z0-9_-]*(?:token|password|passwd|secret|api_?key|signature|credential))|key)=[^&\s"',;]*/gi;

// Every pattern above needs one of these; most log strings (methods, routes, ids) have none and skip the four
// replacements (one test instead of four scans, on every string field of every log line).
const MAY_HOLD_SECRET = /:\/\/|bearer|basic|eyJ|=/i;

/** Masks credentials inside free text (messages, URLs, error strings). */
export function redactString(text: string): string {
  if (!MAY_HOLD_SECRET.test(text)) return text;
  return text
    .replace(URL_PASSWORD, `$1:${REDACTED}@`)
    .replace(AUTH_SCHEME_CREDENTIALS, `$1 ${REDACTED}`)
    .replace(JWT_SHAPE, REDACTED)
    .replace(SECRET_ASSIGNMENT, `$1=${REDACTED}`);
}

/** A URL with its password (and secret query parameters) replaced by `***`; safe to print or log. */
export function redactUrl(url: string): string {
  return redactString(url);
}

/**
 * A deep copy of `value` that is safe to serialise: sensitive keys masked, strings scrubbed,
 * circular references replaced by `[Circular]`, Errors turned into `{ name, message, stack, ... }`.
 * Never throws, whatever the input (getters that throw are reported as `[Unreadable]`).
 */
export function redactValue(value: unknown): unknown {
  return walk(value, new WeakSet<object>(), 0);
}

function walk(value: unknown, ancestors: WeakSet<object>, depth: number): unknown {
  if (typeof value === 'string') return redactString(value);
  if (value === null || typeof value !== 'object') {
    if (typeof value === 'bigint') return value.toString();
    if (typeof value === 'function' || typeof value === 'symbol') return undefined;
    return value;
  }
  if (ancestors.has(value)) return '[Circular]';
  if (depth >= MAX_DEPTH) return '[Truncated]';
  if (value instanceof Date) return value;
  if (Buffer.isBuffer(value)) return `[Buffer ${value.length} bytes]`;

  ancestors.add(value);
  try {
    if (Array.isArray(value)) return value.map((item) => walk(item, ancestors, depth + 1));
    const out: Record<string, unknown> = {};
    if (value instanceof Error) {
      // name/message/stack are not enumerable; copy them explicitly so the log keeps them.
      out.name = value.name;
      out.message = redactString(value.message);
      if (value.stack !== undefined) out.stack = redactString(value.stack);
      if (value.cause !== undefined) out.cause = walk(value.cause, ancestors, depth + 1);
    }
    for (const key of Object.keys(value)) {
      let item: unknown;
      try {
        item = (value as Record<string, unknown>)[key];
      } catch {
        out[key] = '[Unreadable]';
        continue;
      }
      out[key] = isSensitiveKey(key) ? REDACTED : walk(item, ancestors, depth + 1);
    }
    return out;
  } finally {
    ancestors.delete(value);
  }
}
