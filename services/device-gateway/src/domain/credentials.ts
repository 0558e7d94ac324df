import { inspect } from 'node:util';

/** What the DTLS server needs of a device's pre-shared key (design §3.5). */
export interface PskCredential {
  /** The row's surrogate id (`device_credentials.credential_id`): what sessions are ended by. */
  readonly credentialId: string;
  /** The PSK identity the client sends in its ClientKeyExchange (RFC 4279 §2). */
  readonly identity: string;
  /** The raw key bytes, fed into the premaster secret (RFC 4279 §2). Never logged or serialised. */
  readonly key: Buffer;
  readonly deviceId: string;
}

/** A device's keys as the device view shows them (CredentialStore.summaryOf): never the key bytes. */
export interface CredentialSummary {
  valid_keys: number;
  future_keys: number;
  next_expiry: string | null;
  keys: { identity: string; valid: boolean; not_before: string; not_after: string | null }[];
}

/** One row as loaded: a credential and its validity window (ms since the epoch; undefined = no expiry). */
export interface CredentialRecord {
  credentialId: string;
  identity: string;
  key: Buffer;
  deviceId: string;
  notBeforeMs: number;
  notAfterMs: number | undefined;
}

const REDACTED_KEY = '[redacted]';

/**
 * A loaded credential. The key is a private field behind a getter, so it is not an own enumerable property:
 * `JSON.stringify`, `util.inspect`, object spread and winston's metadata walk never see it; `toJSON` and the
 * inspect hook say so explicitly. Anyone who reads `.key` gets the bytes, which is what the handshake needs.
 */
export class DeviceCredential implements PskCredential {
  readonly credentialId: string;
  readonly identity: string;
  readonly deviceId: string;
  /** Valid from this instant on (ms since the epoch, inclusive). */
  readonly notBeforeMs: number;
  /** Valid until this instant (ms, exclusive); undefined: no expiry. */
  readonly notAfterMs: number | undefined;
  readonly #key: Buffer;

  constructor(record: CredentialRecord) {
    this.credentialId = record.credentialId;
    this.identity = record.identity;
    this.deviceId = record.deviceId;
    this.notBeforeMs = record.notBeforeMs;
    this.notAfterMs = record.notAfterMs;
    // A copy: the caller's buffer (a pg row) may be reused or zeroed without touching the snapshot.
    this.#key = Buffer.from(record.key);
  }

  get key(): Buffer {
    return this.#key;
  }

  /** Within `not_before` ≤ now < `not_after` (revoked and disabled ones never reach a snapshot). */
  validAt(nowMs: number): boolean {
    return this.notBeforeMs <= nowMs && (this.notAfterMs === undefined || nowMs < this.notAfterMs);
  }

  /** Expired at `nowMs`: `not_after` has passed (a key not yet valid is not expired). */
  expiredAt(nowMs: number): boolean {
    return this.notAfterMs !== undefined && nowMs >= this.notAfterMs;
  }

  /** The same key for the same device under the same identity and window (a reload that changed nothing). */
  sameAs(other: DeviceCredential): boolean {
    return (
      this.identity === other.identity &&
      this.deviceId === other.deviceId &&
      this.notBeforeMs === other.notBeforeMs &&
      this.notAfterMs === other.notAfterMs &&
      this.#key.equals(other.#key)
    );
  }

  toJSON(): Record<string, unknown> {
    return {
      credentialId: this.credentialId,
      identity: this.identity,
      deviceId: this.deviceId,
      key: REDACTED_KEY,
      notBefore: new Date(this.notBeforeMs).toISOString(),
      notAfter: this.notAfterMs === undefined ? null : new Date(this.notAfterMs).toISOString(),
    };
  }

  [inspect.custom](): string {
    return `DeviceCredential ${JSON.stringify(this.toJSON())}`;
  }
}

export class DuplicateIdentityError extends Error {
  constructor(readonly identity: string) {
    super(`PSK identity ${JSON.stringify(identity)} appears twice in one credential snapshot`);
    this.name = 'DuplicateIdentityError';
  }
}

/** An immutable set of credentials, by identity and by id: what one registry load found. */
export class CredentialSnapshot {
  private readonly byIdentity: ReadonlyMap<string, DeviceCredential>;
  private readonly byId: ReadonlyMap<string, DeviceCredential>;
  /** Devices with at least one key in this snapshot (revoked keys and disabled devices are never loaded). */
  readonly deviceIds: ReadonlySet<string>;

  private constructor(credentials: readonly DeviceCredential[]) {
    const byIdentity = new Map<string, DeviceCredential>();
    const byId = new Map<string, DeviceCredential>();
    for (const credential of credentials) {
      // The table's UNIQUE constraints make both impossible; a snapshot that breaks them is refused whole.
      if (byIdentity.has(credential.identity)) throw new DuplicateIdentityError(credential.identity);
      if (byId.has(credential.credentialId))
        throw new Error(`credential id ${credential.credentialId} appears twice in one snapshot`);
      byIdentity.set(credential.identity, credential);
      byId.set(credential.credentialId, credential);
    }
    this.byIdentity = byIdentity;
    this.byId = byId;
    this.deviceIds = new Set(credentials.map((c) => c.deviceId));
  }

  static readonly empty = new CredentialSnapshot([]);

  static from(records: readonly CredentialRecord[]): CredentialSnapshot {
    return new CredentialSnapshot(records.map((record) => new DeviceCredential(record)));
  }

  get size(): number {
    return this.byId.size;
  }

  byIdentityOf(identity: string): DeviceCredential | undefined {
    return this.byIdentity.get(identity);
  }

  byCredentialId(credentialId: string): DeviceCredential | undefined {
    return this.byId.get(credentialId);
  }

  values(): IterableIterator<DeviceCredential> {
    return this.byId.values();
  }

  toJSON(): Record<string, unknown> {
    return { credentials: this.size };
  }

  [inspect.custom](): string {
    return `CredentialSnapshot { credentials: ${this.size} }`;
  }
}

/**
 * The keys the DTLS server accepts. Holds one immutable snapshot, swapped whole on each registry load;
 * the time window is applied at each lookup (the moment of the handshake), so a key whose `not_after` has
 * passed is refused even before the next reload (the failure californium#1071 describes).
 *
 * Invalidation reports each credential once: `replace` names the ids of the previous snapshot that are not
 * valid in the new one (revoked, deleted, device disabled or deleted, expired, key or window changed), and
 * `expiredSince` those whose `not_after` passed between reloads. The caller ends those credentials' sessions.
 */
export class CredentialStore {
  private snapshot: CredentialSnapshot = CredentialSnapshot.empty;
  /** Ids of the current snapshot already reported invalid (expired): not reported a second time. */
  private reported = new Set<string>();

  get size(): number {
    return this.snapshot.size;
  }

  /** The credential for `identity` if it is valid at `nowMs` (ms since the epoch); else undefined. */
  lookup(identity: string, nowMs: number): DeviceCredential | undefined {
    const credential = this.snapshot.byIdentityOf(identity);
    return credential !== undefined && credential.validAt(nowMs) ? credential : undefined;
  }

  /** Whether the device has a key: it is meant to speak CoAP over DTLS (a Set lookup, for the CoAP path). */
  hasKeys(deviceId: string): boolean {
    return this.snapshot.deviceIds.has(deviceId);
  }

  /** The DTLS server's synchronous callback: `lookup` at the current time. */
  readonly lookupPsk = (identity: string): PskCredential | undefined => this.lookup(identity, Date.now());

  /** Whether the credential a session was established with is still valid at `nowMs`. */
  isValid(credentialId: string, nowMs: number): boolean {
    return this.snapshot.byCredentialId(credentialId)?.validAt(nowMs) === true;
  }

  /**
   * Swaps in `next` and returns the ids of credentials of the previous snapshot whose sessions must end:
   * gone from `next` (revoked, deleted, device disabled or deleted), changed (key, identity, device or
   * window), or expired at `nowMs`. Ids already reported by `expiredSince` are not repeated.
   */
  replace(next: CredentialSnapshot, nowMs: number): string[] {
    const invalidated: string[] = [];
    for (const old of this.snapshot.values()) {
      if (this.reported.has(old.credentialId)) continue;
      const now = next.byCredentialId(old.credentialId);
      // Unchanged and not yet valid (issued for later) is not an invalidation: it had no session to end.
      if (now === undefined || !now.sameAs(old) || now.expiredAt(nowMs)) invalidated.push(old.credentialId);
    }
    const reported = new Set<string>();
    for (const credential of next.values()) {
      // Expired in the new snapshot: either reported just now or before, or never valid since it came.
      if (credential.expiredAt(nowMs)) reported.add(credential.credentialId);
    }
    this.snapshot = next;
    this.reported = reported;
    return invalidated;
  }

  /** Ids whose `not_after` passed at or before `nowMs` and were not reported yet; each is reported once. */
  expiredSince(nowMs: number): string[] {
    const expired: string[] = [];
    for (const credential of this.snapshot.values()) {
      if (credential.expiredAt(nowMs) && !this.reported.has(credential.credentialId)) {
        this.reported.add(credential.credentialId);
        expired.push(credential.credentialId);
      }
    }
    return expired;
  }

  /** The earliest `not_after` after `nowMs` among credentials not yet reported (ms), or undefined. */
  nextExpiryMs(nowMs: number): number | undefined {
    let next: number | undefined;
    for (const credential of this.snapshot.values()) {
      const at = credential.notAfterMs;
      if (at !== undefined && at > nowMs && (next === undefined || at < next)) next = at;
    }
    return next;
  }

  /**
   * A device's keys for the device view (design §3.8): how many are valid at `nowMs`, how many are issued for
   * later, and the earliest expiry among the valid ones; identities and windows, never key bytes. A scan of the
   * snapshot (about 1 ms at 100,000 keys): an on-call read, not a device's path.
   */
  summaryOf(deviceId: string, nowMs: number): CredentialSummary {
    const keys: CredentialSummary['keys'] = [];
    let valid = 0;
    let later = 0;
    let nextExpiry: number | undefined;
    for (const c of this.snapshot.values()) {
      if (c.deviceId !== deviceId || c.expiredAt(nowMs)) continue;
      const isValid = c.validAt(nowMs);
      if (isValid) valid++;
      else later++;
      if (isValid && c.notAfterMs !== undefined && (nextExpiry === undefined || c.notAfterMs < nextExpiry))
        nextExpiry = c.notAfterMs;
      keys.push({
        identity: c.identity,
        valid: isValid,
        not_before: new Date(c.notBeforeMs).toISOString(),
        not_after: c.notAfterMs === undefined ? null : new Date(c.notAfterMs).toISOString(),
      });
    }
    return {
      valid_keys: valid,
      future_keys: later,
      next_expiry: nextExpiry === undefined ? null : new Date(nextExpiry).toISOString(),
      keys,
    };
  }

  toJSON(): Record<string, unknown> {
    return { credentials: this.size };
  }

  [inspect.custom](): string {
    return `CredentialStore { credentials: ${this.size} }`;
  }
}
