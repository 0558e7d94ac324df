// Every peer the server holds state for: established sessions and handshakes in progress, each keyed by the
// peer's address and port (RFC 6347 §4.2.8: one association per address and port), with the limits that
// bound them.
import type { DtlsServerOptions } from './options.js';
import type { ServerHandshake } from './server-handshaker.js';
import type { Session } from './session.js';

export type LimitRefusal = 'sessions' | 'sessionsPerAddress' | 'handshakes';

export class ConnectionStore {
  readonly sessions = new Map<string, Session>();
  readonly handshakes = new Map<string, ServerHandshake>();
  /** Peers (address:port) holding a session or a handshake, per source IP address. */
  private readonly perAddress = new Map<string, number>();

  constructor(
    private readonly limits: Pick<
      DtlsServerOptions,
      'maxSessions' | 'maxSessionsPerAddress' | 'maxHandshakes'
    >,
  ) {}

  get addresses(): number {
    return this.perAddress.size;
  }

  /**
   * Whether a cookie-verified ClientHello of `key` may start a handshake. Limits count peers that hold a
   * session or a handshake; a peer already known replaces its own state and takes no new slot.
   */
  refusal(key: string, address: string): LimitRefusal | undefined {
    const handshaking = this.handshakes.has(key);
    if (!handshaking && this.handshakes.size >= this.limits.maxHandshakes) return 'handshakes';
    if (handshaking || this.sessions.has(key)) return undefined;
    if (this.sessions.size + this.handshakes.size >= this.limits.maxSessions) return 'sessions';
    if ((this.perAddress.get(address) ?? 0) >= this.limits.maxSessionsPerAddress) return 'sessionsPerAddress';
    return undefined;
  }

  /** Adds a handshake; returns the one of the same peer it replaces, if any (the caller ends that one). */
  addHandshake(hs: ServerHandshake): ServerHandshake | undefined {
    const previous = this.handshakes.get(hs.key);
    const known = previous !== undefined || this.sessions.has(hs.key);
    this.handshakes.set(hs.key, hs);
    if (!known) this.perAddress.set(hs.address, (this.perAddress.get(hs.address) ?? 0) + 1);
    return previous;
  }

  /** Removes `hs` if it is still its peer's handshake; returns whether it was. */
  deleteHandshake(hs: ServerHandshake): boolean {
    if (this.handshakes.get(hs.key) !== hs) return false;
    this.handshakes.delete(hs.key);
    if (!this.sessions.has(hs.key)) this.release(hs.address);
    return true;
  }

  /**
   * The handshake completed: its session takes the peer's place. Returns the session it replaces (RFC 6347
   * §4.2.8), which the caller ends; the peer's address slot carries over.
   */
  establish(hs: ServerHandshake, session: Session): Session | undefined {
    this.handshakes.delete(hs.key);
    const previous = this.sessions.get(hs.key);
    this.sessions.set(hs.key, session);
    return previous;
  }

  /** Removes `s` if it is still its peer's session; returns whether it was. */
  deleteSession(s: Session): boolean {
    if (this.sessions.get(s.pub.key) !== s) return false;
    this.sessions.delete(s.pub.key);
    if (!this.handshakes.has(s.pub.key)) this.release(s.pub.address);
    return true;
  }

  private release(address: string): void {
    const n = (this.perAddress.get(address) ?? 1) - 1;
    if (n <= 0) this.perAddress.delete(address);
    else this.perAddress.set(address, n);
  }
}
