import type { GatewayState } from '../domain/gateway-state.js';

/**
 * /.well-known/core (RFC 6690). Every visible device has two observable resources; their link attributes are
 * the same for every device, so attribute filters (rt, ct, obs) select resource kinds and only `href` selects
 * devices. Devices are found by prefix in the state's sorted id list, bounded by `maxLinks`: a query can never
 * make the gateway walk or dump the whole registry. A query matching more than `maxLinks` links is refused.
 * A peer authenticated as a device (`scope`, DESIGN 3.5) sees that device's resources and no other.
 */
const KINDS = [
  { suffix: '', attrs: { rt: ['platform.device'], ct: ['50', '60'], obs: [] as string[] } },
  { suffix: '/settings', attrs: { rt: ['platform.device.settings'], ct: ['50', '60'], obs: [] as string[] } },
] as const;

const PREFIX = '/devices/';

function linkOf(deviceId: string, suffix: string, rt: string): string {
  return `<${PREFIX}${deviceId}${suffix}>;rt="${rt}";ct="50 60";obs`;
}

/** RFC 6690 4.1: a value ending in `*` matches as a prefix, else exactly. */
function matches(filter: string, value: string): boolean {
  return filter.endsWith('*') ? value.startsWith(filter.slice(0, -1)) : value === filter;
}

export type LinkFormatResult = { ok: true; links: string } | { ok: false; reason: 'too_many' };

export function linkFormat(
  state: GatewayState,
  queries: readonly string[],
  maxLinks: number,
  scope: string | null,
): LinkFormatResult {
  let href: string | undefined;
  const attrFilters: [string, string][] = [];
  for (const q of queries) {
    const eq = q.indexOf('=');
    const name = eq === -1 ? q : q.slice(0, eq);
    const value = eq === -1 ? '' : q.slice(eq + 1);
    if (name === 'href') href = value;
    else attrFilters.push([name, value]);
  }
  const kinds = KINDS.filter((kind) =>
    attrFilters.every(([name, value]) => {
      const attr = (kind.attrs as Record<string, readonly string[] | undefined>)[name];
      if (attr === undefined) return false;
      // `obs` is a flag attribute: it matches a filter without a value.
      if (attr.length === 0) return value === '' || value === '*';
      return attr.some((v) => matches(value, v));
    }),
  );
  if (kinds.length === 0) return { ok: true, links: '' };

  let idPrefix = '';
  let exactId = false;
  if (href !== undefined) {
    const literal = href.endsWith('*') ? href.slice(0, -1) : href;
    if (literal.startsWith(PREFIX)) {
      const rest = literal.slice(PREFIX.length);
      const slash = rest.indexOf('/');
      exactId = slash !== -1 || !href.endsWith('*');
      idPrefix = slash === -1 ? rest : rest.slice(0, slash);
    } else if (!(href.endsWith('*') && PREFIX.startsWith(literal))) {
      return { ok: true, links: '' };
    }
  }
  let ids: string[];
  if (scope !== null) ids = state.recordDocument(scope) === undefined ? [] : [scope];
  else if (exactId) ids = state.deviceIdsWithPrefix(idPrefix, 1).filter((id) => id === idPrefix);
  else ids = state.deviceIdsWithPrefix(idPrefix, maxLinks + 1);
  const links: string[] = [];
  for (const id of ids) {
    for (const kind of kinds) {
      const path = `${PREFIX}${id}${kind.suffix}`;
      if (href !== undefined && !matches(href, path)) continue;
      if (links.length === maxLinks) return { ok: false, reason: 'too_many' };
      links.push(linkOf(id, kind.suffix, kind.attrs.rt[0]));
    }
  }
  return { ok: true, links: links.join(',') };
}
