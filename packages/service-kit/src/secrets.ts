import { createHmac, createSecretKey, hash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { KeyObject } from 'node:crypto';
import { closeSync, constants, fstatSync, openSync, readFileSync } from 'node:fs';
import type { Stats } from 'node:fs';
import type { IncomingHttpHeaders } from 'node:http';

export interface SecretListSource {
  /** Comma- or newline-separated secrets, e.g. from `GATEWAY_API_KEYS`. */
  value?: string | undefined;
  /** A mounted file with one secret per line (or comma-separated), e.g. `GATEWAY_API_KEYS_FILE`. */
  file?: string | undefined;
}

/** A secrets file that is not a regular file (a FIFO, a device, a directory): refused before it is read. */
export class NotARegularFileError extends Error {
  override readonly name = 'NotARegularFileError';
  /** As node's own errors carry one, so callers that report `code` name the problem. */
  readonly code = 'ENOTREGULAR';

  constructor(
    readonly file: string,
    readonly kind: string,
  ) {
    super(`${file} is ${kind}, not a regular file`);
  }
}

function kindOf(stat: Stats): string {
  if (stat.isFIFO()) return 'a FIFO';
  if (stat.isDirectory()) return 'a directory';
  if (stat.isCharacterDevice()) return 'a character device';
  if (stat.isBlockDevice()) return 'a block device';
  if (stat.isSocket()) return 'a socket';
  return 'not a file';
}

/**
 * The text of a regular file; anything else throws NotARegularFileError before a byte is read. Reading a FIFO
 * waits for a writer, and a character device such as /dev/zero never ends: either blocks the event loop (this
 * read is synchronous), so a SIGHUP reload with such a "file" hung the whole process (issue 39 §4). The file is
 * opened with O_NONBLOCK, so opening a FIFO without a writer does not wait either (regular files ignore the
 * flag), and checked on the descriptor it is read from (fstat), so a swap between a check and the read cannot
 * slip one in. Symbolic links are followed (a Kubernetes Secret's mounted file is one).
 */
export function readRegularFile(file: string): string {
  const fd = openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const stat = fstatSync(fd);
    if (!stat.isFile()) throw new NotARegularFileError(file, kindOf(stat));
    return readFileSync(fd, 'utf8');
  } finally {
    closeSync(fd);
  }
}

/**
 * Every secret from the variable and the file together (rotation: old and new keys both listed),
 * trimmed, without blanks, `#` comment lines or duplicates. A file that cannot be read throws, and so does
 * one that is not a regular file (NotARegularFileError).
 */
export function readSecretList(source: SecretListSource): string[] {
  const texts: string[] = [];
  if (source.value !== undefined) texts.push(source.value);
  if (source.file !== undefined && source.file !== '') texts.push(readRegularFile(source.file));
  const secrets = texts
    .flatMap((text) => text.split(/\r?\n/))
    .filter((line) => !line.trimStart().startsWith('#'))
    .flatMap((line) => line.split(','))
    .map((item) => item.trim())
    .filter((item) => item !== '');
  return [...new Set(secrets)];
}

/** SHA-256 of the UTF-8 text, one call (no Hash object: `has` runs on every authenticated request). */
function digest(secret: string): Buffer {
  return hash('sha256', secret, 'buffer');
}

/** `sha256:` and the first 12 hex digits of the secret's SHA-256: names a key in logs without revealing it. */
export function fingerprint(secret: string): string {
  return `sha256:${digest(secret).toString('hex').slice(0, 12)}`;
}

/**
 * A set of accepted secrets (API keys, webhook tokens). `has` compares SHA-256 digests with
 * `timingSafeEqual`, so every comparison takes the same time whatever the presented value's length
 * or content, and it checks every entry rather than stopping at the first match.
 */
export class SecretSet {
  readonly #digests: Buffer[];
  readonly #fingerprints: string[];

  constructor(secrets: Iterable<string>) {
    const unique = [...new Set(secrets)].filter((secret) => secret !== '');
    this.#digests = unique.map(digest);
    this.#fingerprints = unique.map(fingerprint);
  }

  get size(): number {
    return this.#digests.length;
  }

  has(presented: string | undefined | null): boolean {
    if (presented === undefined || presented === null || presented === '') return false;
    const candidate = digest(presented);
    let matched = false;
    for (const known of this.#digests) {
      if (timingSafeEqual(known, candidate)) matched = true;
    }
    return matched;
  }

  /** Fingerprints of the accepted secrets, in order; safe to log or show in `/api/config`. */
  fingerprints(): string[] {
    return [...this.#fingerprints];
  }

  /** Keep secrets out of JSON and util.inspect output. */
  toJSON(): { size: number; fingerprints: string[] } {
    return { size: this.size, fingerprints: this.fingerprints() };
  }
}

/**
 * The key of keyed fingerprints: 32 random bytes drawn once per process, never shown or stored. An unkeyed digest
 * (`fingerprint`) lets whoever reads it test guesses at a secret offline (issue 39: a holder of one API key reading
 * /api/config, a reader of the workflow's logs); a fingerprint keyed with a secret that never leaves the process
 * cannot be computed, or a guess tested, anywhere else. It names a secret only within one process's life: enough to
 * see that a SIGHUP rotation took the new secret and dropped the old one.
 */
const FINGERPRINT_KEY: KeyObject = createSecretKey(randomBytes(32));

/** `hmac-sha256:` and 12 hex digits of the secret's HMAC-SHA-256 under this process's fingerprint key. */
export function keyedFingerprint(secret: string): string {
  return `hmac-sha256:${createHmac('sha256', FINGERPRINT_KEY).update(secret, 'utf8').digest('hex').slice(0, 12)}`;
}

/** A SecretSet whose fingerprints are keyed (`keyedFingerprint`) wherever they are shown or logged. */
export class KeyedSecretSet extends SecretSet {
  readonly #fingerprints: string[];

  constructor(secrets: Iterable<string>) {
    const unique = [...new Set(secrets)].filter((secret) => secret !== '');
    super(unique);
    this.#fingerprints = unique.map(keyedFingerprint);
  }

  override fingerprints(): string[] {
    return [...this.#fingerprints];
  }
}

/** RFC 6750 / RFC 9110 11.2 token68: the only form a Bearer credential can take. */
const TOKEN68 = '[A-Za-z0-9\\-._~+/]+=*';

/** RFC 6750: `Authorization: Bearer <token68>`; the scheme is case-insensitive (RFC 9110 11.1). */
const BEARER = new RegExp(`^Bearer +(${TOKEN68}) *$`, 'i');
const IS_TOKEN68 = new RegExp(`^${TOKEN68}$`);

/**
 * How many of `secrets` could never be presented as `Authorization: Bearer <secret>` (a space, `!`, `%`, a
 * non-ASCII character…): such a key would be configured yet refuse every request, so callers refuse to start
 * with it instead. A count, never the values, so the message can be logged.
 */
export function countNonBearerSecrets(secrets: readonly string[]): number {
  return secrets.filter((secret) => !IS_TOKEN68.test(secret)).length;
}

/**
 * The bearer token of a request, or undefined when the header is absent or not a Bearer credential.
 *
 * Authorization sent more than once gives the empty string, which no key or token matches (so the caller
 * answers 401 invalid_token): it carries one credential (RFC 9110 §11.6.2), and node:http keeps only the
 * first copy, so a proxy that checked or rewrote another copy would have seen a different credential.
 */
export function bearerToken(req: {
  headers: IncomingHttpHeaders;
  headersDistinct?: Record<string, string[] | undefined>;
}): string | undefined {
  const header = req.headers.authorization;
  if (header === undefined) return undefined;
  if ((req.headersDistinct?.authorization?.length ?? 1) > 1) return '';
  return BEARER.exec(header)?.[1];
}
