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
 * (express.json's body limit already bounds the size). Every request body passes through here, so the walk
 * keeps the keys on its way down and builds a pointer only for a string that fails.
 */
export function unstorableTextPaths(value: unknown, path = '', depthLimit = 64): string[] {
  const found: string[] = [];
  collect(value, 0, { path, depthLimit, keys: [], found });
  return found;
}

interface Walk {
  path: string;
  depthLimit: number;
  /** The keys from `value` down to the current node. */
  keys: string[];
  found: string[];
}

function collect(v: unknown, depth: number, walk: Walk): void {
  if (typeof v === 'string') {
    if (UNSTORABLE.test(v)) walk.found.push(pointer(walk));
    return;
  }
  if (v === null || typeof v !== 'object' || depth > walk.depthLimit) return;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      walk.keys.push(String(i));
      collect(v[i], depth + 1, walk);
      walk.keys.pop();
    }
    return;
  }
  for (const key in v) {
    if (!Object.hasOwn(v, key)) continue;
    walk.keys.push(key);
    if (UNSTORABLE.test(key)) walk.found.push(pointer(walk));
    collect((v as Record<string, unknown>)[key], depth + 1, walk);
    walk.keys.pop();
  }
}

function pointer(walk: Walk): string {
  return walk.path + walk.keys.map((key) => `/${pointerToken(key)}`).join('');
}
