// Every peer the server holds state for: established sessions and handshakes in progress, each keyed by the
// peer's address and port (RFC 6347 §4.2.8: one association per address and port), and the limits that
// bound them (RFC 6347 §4.2.1 asks a server to bound what an attacker can make it keep).
//
// Handshakes and sessions are counted apart, in all and per source address, so that unauthenticated
// handshakes can never lock authenticated devices out, and the two kinds of limit act differently:
// - a handshake has authenticated nothing until its Finished verifies (a ClientKeyExchange only names an
//   identity, and identities travel in clear), so every handshake is alike to the limits, whatever identity it
//   named (which an eviction order must not reveal either). A full share of one address evicts that address's
//   oldest handshake; a full table evicts the oldest handshake of the address holding the most, so that a
//   flood from few addresses evicts itself and one spread over many addresses evicts its own oldest slots
//   before a device's, which completes in one round trip;
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
  /**
   * For the operator's per-device view (sessionsOf) only. At 100,000 sessions a lookup here takes 3 µs, a scan
   * of the table 1.8 ms (up to 15 ms); the index costs about 37 bytes of heap per device (the id string is the
   * session's own). Measured on the development VM, 2026-11-25.
   */
  private readonly sessionsByDevice = new GroupIndex<Session>();

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
      const victim = first(this.handshakesByAddress.values(address));
      if (victim === undefined) return 'handshakesPerAddress';
      this.evictor.evictHandshake(victim);
    }
    if (this.handshakes.size >= this.limits.maxHandshakes) {
      const victim = this.oldestOfBusiestAddress();
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
      this.evictor.evictSession(
        this.evictionCandidate(this.sessionsByAddress.values(address), credentialId)!,
      );
    // A scan of every session, only when the whole table is full (and only for an authenticated newcomer).
    if (this.sessions.size >= this.limits.maxSessions)
      this.evictor.evictSession(this.evictionCandidate(this.sessions.values(), credentialId)!);
    this.sessions.set(hs.key, session);
    this.sessionsByAddress.add(address, session);
    this.sessionsByCredential.add(credentialId, session);
    this.sessionsByDevice.add(session.pub.deviceId, session);
    return previous;
  }

  /** The sessions of one device, oldest first. */
  sessionsOfDevice(deviceId: string): Iterable<Session> {
    return this.sessionsByDevice.values(deviceId);
  }

  /** Removes `s` if it is still its peer's session; returns whether it was. */
  deleteSession(s: Session): boolean {
    if (this.sessions.get(s.pub.key) !== s) return false;
    this.sessions.delete(s.pub.key);
    this.unindexSession(s);
    return true;
  }

  /**
   * Which session of a full group makes room: the least recently active of those whose key holds more than
   * one session (the newcomer's included), if any, else the least recently active of all. A key that opens sessions to push its
   * neighbours out so displaces its own first (observers that only listen look idle, and would go first).
   */
  private evictionCandidate(group: Iterable<Session>, newcomer: string): Session | undefined {
    let shared: Session | undefined;
    let any: Session | undefined;
    for (const s of group) {
      if (any === undefined || s.lastRx < any.lastRx) any = s;
      const cid = s.pub.credentialId;
      if (
        this.sessionsByCredential.size(cid) + (cid === newcomer ? 1 : 0) > 1 &&
        (shared === undefined || s.lastRx < shared.lastRx)
      )
        shared = s;
    }
    return shared ?? any;
  }

  /**
   * The oldest handshake (the handshakes Map iterates oldest first) of the address holding the most; a scan of
   * the table, only when it is full (at most maxHandshakes entries).
   */
  private oldestOfBusiestAddress(): ServerHandshake | undefined {
    let victim: ServerHandshake | undefined;
    let most = 0;
    for (const hs of this.handshakes.values()) {
      const n = this.handshakesByAddress.size(hs.address);
      if (n > most) {
        most = n;
        victim = hs;
      }
    }
    return victim;
  }

  private unindexHandshake(hs: ServerHandshake): void {
    this.handshakesByAddress.remove(hs.address, hs);
  }

  private unindexSession(s: Session): void {
    this.sessionsByAddress.remove(s.pub.address, s);
    this.sessionsByCredential.remove(s.pub.credentialId, s);
    this.sessionsByDevice.remove(s.pub.deviceId, s);
  }
}

function first<V>(values: Iterable<V>): V | undefined {
  for (const v of values) return v;
  return undefined;
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
