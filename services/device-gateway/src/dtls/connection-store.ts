// Every peer the server holds state for: established sessions and handshakes in progress, each keyed by the
// peer's address and port (RFC 6347 §4.2.8: one association per address and port), and the limits that
// bound them (RFC 6347 §4.2.1 asks a server to bound what an attacker can make it keep).
//
// Handshakes and sessions are counted apart, in all and per source address, so that unauthenticated
// handshakes can never lock authenticated devices out, and the two kinds of limit act differently:
// - a handshake has authenticated nothing, so a full table (or a full share of one address) evicts its
//   oldest handshake that has not got past ClientKeyExchange with a known identity, and refuses only when
//   every slot holds one that has (those still end at the handshake deadline);
// - a session cap is checked when a handshake completes, that is for a newcomer that proved its key: the
//   least recently active session of the full group (the credential's, the address's, all) ends.
import type { DtlsServerOptions } from './options.js';
import type { ServerHandshake } from './server-handshaker.js';
import type { Session } from './session.js';

export type HandshakeRefusal = 'handshakes' | 'handshakesPerAddress';

type Limits = Pick<
  DtlsServerOptions,
  | 'maxSessions'
  | 'maxSessionsPerAddress'
  | 'maxSessionsPerCredential'
  | 'maxHandshakes'
  | 'maxHandshakesPerAddress'
>;

/** What the store asks its owner to end when it must make room (the owner removes them from the store). */
export interface Evictor {
  evictHandshake(hs: ServerHandshake): void;
  evictSession(s: Session): void;
}

export class ConnectionStore {
  /** By peer key; a Map iterates in insertion order, so the first entries are the oldest handshakes. */
  readonly sessions = new Map<string, Session>();
  readonly handshakes = new Map<string, ServerHandshake>();
  private readonly handshakesByAddress = new GroupIndex<ServerHandshake>();
  private readonly sessionsByAddress = new GroupIndex<Session>();
  private readonly sessionsByCredential = new GroupIndex<Session>();

  constructor(
    private readonly limits: Limits,
    private readonly evictor: Evictor,
  ) {}

  /** Source addresses holding a session or a handshake. */
  get addresses(): number {
    let n = this.sessionsByAddress.groups;
    for (const address of this.handshakesByAddress.keys())
      if (this.sessionsByAddress.size(address) === 0) n++;
    return n;
  }

  /**
   * Makes room for a new handshake of peer `key` (a cookie-verified ClientHello), evicting as above; returns
   * the limit that refuses it, if any. A peer that already has a handshake replaces it and needs no room.
   */
  admitHandshake(key: string, address: string): HandshakeRefusal | undefined {
    if (this.handshakes.has(key)) return undefined;
    if (this.handshakesByAddress.size(address) >= this.limits.maxHandshakesPerAddress) {
      const victim = oldestEvictable(this.handshakesByAddress.values(address));
      if (victim === undefined) return 'handshakesPerAddress';
      this.evictor.evictHandshake(victim);
    }
    if (this.handshakes.size >= this.limits.maxHandshakes) {
      const victim = oldestEvictable(this.handshakes.values());
      if (victim === undefined) return 'handshakes';
      this.evictor.evictHandshake(victim);
    }
    return undefined;
  }

  /** Adds a handshake; returns the one of the same peer it replaces, if any (the caller ends that one). */
  addHandshake(hs: ServerHandshake): ServerHandshake | undefined {
    const previous = this.handshakes.get(hs.key);
    if (previous !== undefined) this.unindexHandshake(previous);
    // Delete first: a replacing handshake is the newest, so it goes to the end of the iteration order.
    this.handshakes.delete(hs.key);
    this.handshakes.set(hs.key, hs);
    this.handshakesByAddress.add(hs.address, hs);
    return previous;
  }

  /** Removes `hs` if it is still its peer's handshake; returns whether it was. */
  deleteHandshake(hs: ServerHandshake): boolean {
    if (this.handshakes.get(hs.key) !== hs) return false;
    this.handshakes.delete(hs.key);
    this.unindexHandshake(hs);
    return true;
  }

  /**
   * The handshake completed: its session takes the peer's place, after the session caps made room. Returns
   * the session of the same peer it replaces (RFC 6347 §4.2.8), which the caller ends.
   */
  establish(hs: ServerHandshake, session: Session): Session | undefined {
    this.deleteHandshake(hs);
    const previous = this.sessions.get(hs.key);
    if (previous !== undefined) {
      this.sessions.delete(hs.key);
      this.unindexSession(previous);
    }
    const { credentialId, address } = session.pub;
    if (this.sessionsByCredential.size(credentialId) >= this.limits.maxSessionsPerCredential)
      this.evictor.evictSession(leastRecentlyActive(this.sessionsByCredential.values(credentialId))!);
    if (this.sessionsByAddress.size(address) >= this.limits.maxSessionsPerAddress)
      this.evictor.evictSession(leastRecentlyActive(this.sessionsByAddress.values(address))!);
    // A scan of every session, only when the whole table is full (and only for an authenticated newcomer).
    if (this.sessions.size >= this.limits.maxSessions)
      this.evictor.evictSession(leastRecentlyActive(this.sessions.values())!);
    this.sessions.set(hs.key, session);
    this.sessionsByAddress.add(address, session);
    this.sessionsByCredential.add(credentialId, session);
    return previous;
  }

  /** Removes `s` if it is still its peer's session; returns whether it was. */
  deleteSession(s: Session): boolean {
    if (this.sessions.get(s.pub.key) !== s) return false;
    this.sessions.delete(s.pub.key);
    this.unindexSession(s);
    return true;
  }

  private unindexHandshake(hs: ServerHandshake): void {
    this.handshakesByAddress.remove(hs.address, hs);
  }

  private unindexSession(s: Session): void {
    this.sessionsByAddress.remove(s.pub.address, s);
    this.sessionsByCredential.remove(s.pub.credentialId, s);
  }
}

/** The oldest handshake that authenticated nothing: none past ClientKeyExchange first, then unknown identities. */
function oldestEvictable(handshakes: Iterable<ServerHandshake>): ServerHandshake | undefined {
  let unknownIdentity: ServerHandshake | undefined;
  for (const hs of handshakes) {
    const stage = hs.evictable;
    if (stage === 'before_key_exchange') return hs;
    if (stage === 'unknown_identity') unknownIdentity ??= hs;
  }
  return unknownIdentity;
}

function leastRecentlyActive(sessions: Iterable<Session>): Session | undefined {
  let lru: Session | undefined;
  for (const s of sessions) if (lru === undefined || s.lastRx < lru.lastRx) lru = s;
  return lru;
}

/**
 * Members grouped by a key (an address, a credential id). Most groups have one member (a device per address, a
 * session per key), so a lone member is stored as itself and a Set is made only for the second: a Set per
 * session would cost more than the session's keys.
 */
class GroupIndex<V extends object> {
  private readonly byKey = new Map<string, V | Set<V>>();

  get groups(): number {
    return this.byKey.size;
  }

  keys(): IterableIterator<string> {
    return this.byKey.keys();
  }

  size(key: string): number {
    const group = this.byKey.get(key);
    return group === undefined ? 0 : group instanceof Set ? group.size : 1;
  }

  values(key: string): Iterable<V> {
    const group = this.byKey.get(key);
    return group === undefined ? [] : group instanceof Set ? group : [group];
  }

  add(key: string, value: V): void {
    const group = this.byKey.get(key);
    if (group === undefined) this.byKey.set(key, value);
    else if (group instanceof Set) group.add(value);
    else if (group !== value) this.byKey.set(key, new Set([group, value]));
  }

  remove(key: string, value: V): void {
    const group = this.byKey.get(key);
    if (group === value) this.byKey.delete(key);
    else if (group instanceof Set) {
      group.delete(value);
      if (group.size === 1) this.byKey.set(key, group.values().next().value!);
    }
  }
}
