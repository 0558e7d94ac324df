import type { GatewayState } from '../domain/gateway-state.js';

/**
 * /.well-known/core (RFC 6690), with `href` and attribute filters (RFC 6690 4.1). What a peer sees depends on
 * who it is (design §3.5):
 *
 * - A peer authenticated as a device (a DTLS PSK session) sees that device's two observable resources and
 *   its report resource, nothing else.
 * - A plain CoAP peer has no identity, so it sees no device: one link to the collection the device resources
 *   live under, typed with the resource types found there. Listing device ids handed the registry to anyone
 *   who could send a datagram and, for a spoofed source, turned a 22-byte request into a 938-byte reply (RFC
 *   7252 11.3, amplification). A device knows its own id; the reply is now a few dozen bytes whatever the
 *   registry holds.
 */
const KINDS = [
  { suffix: '', attrs: { rt: ['platform.device'], ct: ['50', '60'], obs: [] as string[] } },
  { suffix: '/settings', attrs: { rt: ['platform.device.settings'], ct: ['50', '60'], obs: [] as string[] } },
  // The device's report of what it did with its settings (report-resource.ts): POST or PUT, not observable.
  { suffix: '/reported', attrs: { rt: ['platform.device.reported'], ct: ['50', '60'] } },
] as const;

const PREFIX = '/devices/';

const COLLECTION = '/devices';
// The observable kinds only: the report resource is in a device's own listing (over DTLS), and naming it here
// would take the plain reply past 3.5 times a spoofable request (RFC 7252 §11.3; 81 bytes against 56).
const COLLECTION_TYPES = KINDS.filter((kind) => 'obs' in kind.attrs).map((kind) => kind.attrs.rt[0]);
/** The plain CoAP listing: 56 bytes. */
const COLLECTION_LINK = `<${COLLECTION}>;rt="${COLLECTION_TYPES.join(' ')}"`;

function linkOf(deviceId: string, suffix: string, rt: string, observable: boolean): string {
  return `<${PREFIX}${deviceId}${suffix}>;rt="${rt}";ct="50 60"${observable ? ';obs' : ''}`;
}

/** RFC 6690 4.1: a value ending in `*` matches as a prefix, else exactly. */
function matches(filter: string, value: string): boolean {
  return filter.endsWith('*') ? value.startsWith(filter.slice(0, -1)) : value === filter;
}

/**
 * The link-format document for a peer authenticated as `deviceId`, or for a plain CoAP peer (`null`).
 * At most three links either way: no query can make the gateway walk or list the registry.
 */
export function linkFormat(state: GatewayState, queries: readonly string[], deviceId: string | null): string {
  let href: string | undefined;
  const attrFilters: [string, string][] = [];
  for (const q of queries) {
    const eq = q.indexOf('=');
    const name = eq === -1 ? q : q.slice(0, eq);
    const value = eq === -1 ? '' : q.slice(eq + 1);
    if (name === 'href') href = value;
    else attrFilters.push([name, value]);
  }

  if (deviceId === null) {
    if (href !== undefined && !matches(href, COLLECTION)) return '';
    const selected = attrFilters.every(
      ([name, value]) => name === 'rt' && COLLECTION_TYPES.some((rt) => matches(value, rt)),
    );
    return selected ? COLLECTION_LINK : '';
  }

  if (state.recordDocument(deviceId) === undefined) return '';
  const links: string[] = [];
  for (const kind of KINDS) {
    const selected = attrFilters.every(([name, value]) => {
      const attr = (kind.attrs as Record<string, readonly string[] | undefined>)[name];
      if (attr === undefined) return false;
      // `obs` is a flag attribute: it matches a filter without a value.
      if (attr.length === 0) return value === '' || value === '*';
      return attr.some((v) => matches(value, v));
    });
    const path = `${PREFIX}${deviceId}${kind.suffix}`;
    if (!selected || (href !== undefined && !matches(href, path))) continue;
    links.push(linkOf(deviceId, kind.suffix, kind.attrs.rt[0], 'obs' in kind.attrs));
  }
  return links.join(',');
}
