/**
 * Text PostgreSQL cannot store: `text` and `jsonb` refuse U+0000 (SQLSTATE 22021 / 22P05), and a UTF-16
 * surrogate without its pair has no UTF-8 form (22P02 once the value is cast to json). Everything a request
 * hands to the database — body fields, token claims — is checked once, at the edge, with this.
 */
// eslint-disable-next-line no-control-regex -- U+0000 is exactly what this looks for
const UNSTORABLE = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

export const UNSTORABLE_TEXT_MESSAGE = 'must not contain U+0000 or an unpaired UTF-16 surrogate';

/** RFC 6901: `~` is written `~0` and `/` is written `~1` in a JSON Pointer's reference tokens. */
const pointerToken = (key: string): string => key.replace(/~/g, '~0').replace(/\//g, '~1');

/**
 * JSON Pointers (RFC 6901) of every string in `value` (object keys included: the key's own pointer) that
 * PostgreSQL could not store, in document order; empty when all can be stored. `depthLimit` bounds the walk
 * (express.json's body limit already bounds the size). Every request body passes through here, so a clean
 * document is checked by a walk that allocates nothing; pointers are built only when something failed.
 */
export function unstorableTextPaths(value: unknown, path = '', depthLimit = 64): string[] {
  if (!holdsUnstorable(value, 0, depthLimit)) return [];
  const found: string[] = [];
  const walk = (v: unknown, at: string, depth: number): void => {
    if (typeof v === 'string') {
      if (UNSTORABLE.test(v)) found.push(at);
      return;
    }
    if (v === null || typeof v !== 'object' || depth > depthLimit) return;
    if (Array.isArray(v)) {
      v.forEach((item, i) => walk(item, `${at}/${i}`, depth + 1));
      return;
    }
    for (const [key, item] of Object.entries(v)) {
      const child = `${at}/${pointerToken(key)}`;
      if (UNSTORABLE.test(key)) found.push(child);
      walk(item, child, depth + 1);
    }
  };
  walk(value, path, 0);
  return found;
}

/** Whether `unstorableTextPaths` would find anything, without building a pointer or an array. */
function holdsUnstorable(v: unknown, depth: number, depthLimit: number): boolean {
  if (typeof v === 'string') return UNSTORABLE.test(v);
  if (v === null || typeof v !== 'object' || depth > depthLimit) return false;
  if (Array.isArray(v)) {
    for (const item of v) if (holdsUnstorable(item, depth + 1, depthLimit)) return true;
    return false;
  }
  for (const key in v) {
    if (!Object.hasOwn(v, key)) continue;
    if (UNSTORABLE.test(key)) return true;
    if (holdsUnstorable((v as Record<string, unknown>)[key], depth + 1, depthLimit)) return true;
  }
  return false;
}
