// The stateless cookie of RFC 6347 §4.2.1: Cookie = HMAC(Secret, Client-IP, Client-Parameters).
import { createHmac, createSecretKey, randomBytes, timingSafeEqual, type KeyObject } from 'node:crypto';
import type { ClientHello } from './handshake.js';

/** issued_at(4) + mac(28): 32 bytes, the length every client stores (RFC 6347 §4.2.1 allows up to 255). */
const COOKIE_BYTES = 32;
const TIME_BYTES = 4;

/**
 * HMAC-SHA256 over the cookie's own issue time, the source address and port, and every byte of the
 * ClientHello body except the cookie vector. The time is in the cookie (server clock, ms, mod 2^32), so a
 * cookie is accepted only for `lifetimeMs` after it was made, whatever the secret's rotation: a recorded
 * cookie-bearing ClientHello cannot be replayed for minutes (the review's attack 5). The secret rotates every
 * `rotationMs`; a cookie made with the previous secret is still accepted within its lifetime, so a client
 * that got its HelloVerifyRequest just before a rotation is not refused.
 */
export class CookieJar {
  private current: KeyObject = newSecret();
  private previous: KeyObject = newSecret();
  private rotatedAt: number;
  /** The server clock as last seen by maybeRotate (the server calls it on every timer tick). */
  private clock: number;

  constructor(
    private readonly rotationMs: number,
    now: number,
    private readonly lifetimeMs = 60_000,
  ) {
    this.rotatedAt = now;
    this.clock = now;
  }

  /** Rotates when the current secret is older than rotationMs. */
  maybeRotate(now: number): void {
    this.clock = now;
    if (now - this.rotatedAt < this.rotationMs) return;
    this.previous = this.current;
    this.current = newSecret();
    this.rotatedAt = now;
  }

  make(address: string, port: number, helloBody: Buffer, hello: ClientHello, now = this.clock): Buffer {
    const cookie = Buffer.allocUnsafe(COOKIE_BYTES);
    cookie.writeUInt32BE(now >>> 0, 0);
    this.mac(this.current, cookie, address, port, helloBody, hello).copy(cookie, TIME_BYTES);
    return cookie;
  }

  verify(address: string, port: number, helloBody: Buffer, hello: ClientHello, now = this.clock): boolean {
    const cookie = hello.cookie;
    if (cookie.length !== COOKIE_BYTES) return false;
    // Unsigned difference: the 32-bit clock wraps after 49 days, long after any secret it was made with.
    const age = ((now >>> 0) - cookie.readUInt32BE(0)) >>> 0;
    if (age > this.lifetimeMs) return false;
    const mac = cookie.subarray(TIME_BYTES);
    return (
      timingSafeEqual(mac, this.mac(this.current, cookie, address, port, helloBody, hello)) ||
      timingSafeEqual(mac, this.mac(this.previous, cookie, address, port, helloBody, hello))
    );
  }

  private mac(
    secret: KeyObject,
    cookie: Buffer,
    address: string,
    port: number,
    helloBody: Buffer,
    hello: ClientHello,
  ): Buffer {
    return createHmac('sha256', secret)
      .update(cookie.subarray(0, TIME_BYTES))
      .update(`${address}|${port}|`)
      .update(helloBody.subarray(0, hello.cookieStart))
      .update(helloBody.subarray(hello.cookieEnd))
      .digest()
      .subarray(0, COOKIE_BYTES - TIME_BYTES);
  }
}

function newSecret(): KeyObject {
  return createSecretKey(randomBytes(32));
}
