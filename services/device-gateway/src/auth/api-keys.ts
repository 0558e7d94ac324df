// Named API keys (design §3.1, issue 42 §2): tools get a key with a name, a role and optional sites or companies,
// in the same key file as the specification's anonymous keys, re-read on SIGHUP. A bare line stays an anonymous key
// (an unscoped admin, as before); a line of `field=value` words is a named key:
//
//   # an anonymous key (the specification's), as before
//   3f9c…
//   name=ci-deployer role=operator sites=5e000000-0000-4000-8000-000000000a01 key=8a1d…
//   name=borealis-bms role=viewer companies=c0000000-0000-4000-8000-0000000b0ea1 key=77e0…
import { createHash, timingSafeEqual } from 'node:crypto';
import { countNonBearerSecrets, keyedFingerprint, KeyedSecretSet } from '@platform/service-kit';
import { ANONYMOUS_KEY, isRole, Principal, ROLES, type Role } from './principal.js';

/** An API key's fingerprint, keyed with a per-process secret (service-kit keyedFingerprint; issue 39). */
export const apiKeyFingerprint = keyedFingerprint;

/**
 * The gateway's API keys: a SecretSet (constant-time checks) whose fingerprints are keyed, wherever they are shown:
 * /api/config, the SIGHUP reload's log line, its JSON form.
 */
export class ApiKeys extends KeyedSecretSet {}

export interface NamedKeySpec {
  name: string;
  role: Role;
  sites: readonly string[] | null;
  companies: readonly string[] | null;
  key: string;
}

/** A key file that cannot be used; the message names the line and the field, never a key. */
export class KeyFileError extends Error {
  override readonly name = 'KeyFileError';
}

/** A key's name: what logs, /api/config and the audit show (`key:<name>`). */
const KEY_NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const FIELDS = new Set(['name', 'role', 'sites', 'companies', 'key']);

function uuidList(value: string, field: string, line: number): string[] {
  const ids = value.split(',').map((id) => id.trim().toLowerCase());
  if (ids.length === 0 || ids.some((id) => !UUID.test(id)))
    throw new KeyFileError(`line ${line}: ${field} must be a comma-separated list of uuids`);
  return [...new Set(ids)];
}

/** One `name=… role=… [sites=…] [companies=…] key=…` line. */
function namedLine(text: string, line: number): NamedKeySpec {
  const fields = new Map<string, string>();
  for (const word of text.split(/\s+/)) {
    const eq = word.indexOf('=');
    const field = eq < 0 ? word : word.slice(0, eq);
    if (eq < 0 || !FIELDS.has(field))
      throw new KeyFileError(`line ${line}: expected name=, role=, sites=, companies= or key= words`);
    if (fields.has(field)) throw new KeyFileError(`line ${line}: ${field}= given twice`);
    fields.set(field, word.slice(eq + 1));
  }
  const name = fields.get('name') ?? '';
  if (!KEY_NAME.test(name))
    throw new KeyFileError(
      `line ${line}: name must be 1-64 of a-z 0-9 . _ - (starting with a letter or digit)`,
    );
  const role = fields.get('role');
  if (!isRole(role))
    throw new KeyFileError(`line ${line} (${name}): role must be one of ${ROLES.join(', ')}`);
  const key = fields.get('key');
  if (key === undefined || key === '') throw new KeyFileError(`line ${line} (${name}): key= is missing`);
  if (countNonBearerSecrets([key]) > 0)
    throw new KeyFileError(
      `line ${line} (${name}): the key cannot be used in an Authorization header (RFC 6750 token68)`,
    );
  const sites = fields.get('sites');
  const companies = fields.get('companies');
  return {
    name,
    role,
    key,
    sites: sites === undefined ? null : uuidList(sites, 'sites', line),
    companies: companies === undefined ? null : uuidList(companies, 'companies', line),
  };
}

/**
 * The key file's text: bare lines are anonymous keys (comma- or newline-separated, as before), `name=` lines
 * named keys. `#` lines and blank lines are skipped. Throws KeyFileError (naming the line, never the key) for a
 * malformed line, a name given twice, or one key given twice (a key must name one principal).
 */
export function parseKeyFile(text: string): { anonymous: string[]; named: NamedKeySpec[] } {
  const anonymous: string[] = [];
  const named: NamedKeySpec[] = [];
  text.split(/\r?\n/).forEach((raw, index) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) return;
    if (line.startsWith('name=')) named.push(namedLine(line, index + 1));
    else
      anonymous.push(
        ...line
          .split(',')
          .map((k) => k.trim())
          .filter((k) => k !== ''),
      );
  });
  const names = new Set<string>();
  for (const k of named) {
    if (names.has(k.name)) throw new KeyFileError(`key name ${k.name} is given twice`);
    names.add(k.name);
  }
  const keys = new Set(anonymous);
  for (const k of named) {
    if (keys.has(k.key)) throw new KeyFileError(`the key of ${k.name} is also given elsewhere in the file`);
    keys.add(k.key);
  }
  return { anonymous: [...new Set(anonymous)], named };
}

/** A named key as /api/config shows it: never the key, its keyed fingerprint. */
export interface NamedKeyView {
  name: string;
  role: Role;
  sites: string[] | null;
  companies: string[] | null;
  fingerprint: string;
}

function digest(secret: string): Buffer {
  return createHash('sha256').update(secret, 'utf8').digest();
}

/**
 * The gateway's keys: the anonymous ones (ApiKeys: constant-time `has`, keyed fingerprints) and the named ones.
 * `identify` compares the presented key with every key, anonymous and named, in constant time (SHA-256 digests,
 * timingSafeEqual, no early exit) and answers its principal.
 */
export class GatewayKeys extends ApiKeys {
  readonly #named: readonly { spec: NamedKeySpec; digest: Buffer; principal: Principal }[];

  constructor(anonymous: Iterable<string>, named: readonly NamedKeySpec[] = []) {
    super(anonymous);
    this.#named = named.map((spec) => ({
      spec,
      digest: digest(spec.key),
      principal: new Principal({
        kind: 'api_key',
        id: `key:${spec.name}`,
        name: spec.name,
        role: spec.role,
        sites: spec.sites,
        companies: spec.companies,
      }),
    }));
  }

  /** Keys of either kind. */
  get total(): number {
    return this.size + this.#named.length;
  }

  /** The principal of the presented key, or undefined. */
  identify(presented: string | undefined): Principal | undefined {
    if (presented === undefined || presented === '') return undefined;
    const candidate = digest(presented);
    let found: Principal | undefined;
    for (const entry of this.#named) {
      if (timingSafeEqual(entry.digest, candidate)) found = entry.principal;
    }
    // ApiKeys.has is constant-time over the anonymous keys itself.
    const anonymous = this.has(presented);
    return found ?? (anonymous ? ANONYMOUS_KEY : undefined);
  }

  namedKeys(): NamedKeyView[] {
    return this.#named.map(({ spec }) => ({
      name: spec.name,
      role: spec.role,
      sites: spec.sites === null ? null : [...spec.sites],
      companies: spec.companies === null ? null : [...spec.companies],
      fingerprint: apiKeyFingerprint(spec.key),
    }));
  }

  override toJSON(): { size: number; fingerprints: string[] } & { named?: NamedKeyView[] } {
    return { ...super.toJSON(), named: this.namedKeys() };
  }
}
