// Opaque row ids and list cursors (second cold review of issue 42). The audit's ids and the rollouts' order are
// sequence numbers: shown as they are, the gap between two of a scoped caller's own rows counts the changes made at
// other sites in between. Sealed here, a number is one AES-256 block under a key of this installation (derived from
// the secret of migration 0038, which every replica reads, so a cursor one replica issued reads back on another):
// the same number always gives the same 22 characters (an id stays an id), and nothing of its value shows.
//
// One block, no mode: AES is a pseudorandom permutation of 16-byte blocks, which is exactly a reversible, keyed
// scramble of one short value (no IV, as the value is never repeated with another meaning: the block holds a
// purpose and the number). Opening checks the purpose's 8 bytes, so a forged or another list's cursor is refused
// with overwhelming probability (2^-64) rather than read as some other row.
import { createCipheriv, createDecipheriv, createHmac, createSecretKey, type KeyObject } from 'node:crypto';
import { mapDbError } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import type { GatewayDatabase } from '../db/tables.js';

/** What a sealed number numbers: a block sealed for one purpose does not open for another. */
export type SealPurpose = 'audit' | 'rollouts';

const PURPOSE: Record<SealPurpose, Buffer> = {
  audit: Buffer.from('gw-audit', 'latin1'),
  rollouts: Buffer.from('gw-rolls', 'latin1'),
};

/** A sealed number's text: base64url of one 16-byte block. */
const SEALED = /^[A-Za-z0-9_-]{22}$/;

export class CursorSeal {
  private key: KeyObject | undefined;
  private loading: Promise<KeyObject> | undefined;

  constructor(private readonly db: Kysely<GatewayDatabase>) {}

  /**
   * Reads the installation's secret once. A database error is thrown as the API's problem (mapDbError: 503 and the
   * like); a later call tries again.
   */
  async ready(): Promise<void> {
    if (this.key !== undefined) return;
    this.loading ??= this.load().finally(() => (this.loading = undefined));
    this.key = await this.loading.catch((err: unknown) => {
      throw mapDbError(err);
    });
  }

  private async load(): Promise<KeyObject> {
    const { rows } = await sql<{ secret: string }>`
      SELECT secret FROM device_gateway.list_cursor_key`.execute(this.db);
    const secret = rows[0]?.secret;
    if (secret === undefined)
      throw new Error('device_gateway.list_cursor_key has no secret (migration 0038)');
    // A key of its own for this use (HKDF-like: HMAC of the secret over a label), a KeyObject for the hot path.
    return createSecretKey(createHmac('sha256', secret).update('device-gateway list cursors v1').digest());
  }

  /** `n` (a positive decimal below 2^63) sealed for `purpose`. Call `ready()` first. */
  seal(purpose: SealPurpose, n: string): string {
    const block = Buffer.alloc(16);
    PURPOSE[purpose].copy(block, 0);
    block.writeBigUInt64BE(BigInt(n), 8);
    const cipher = createCipheriv('aes-256-ecb', this.keyOrThrow(), null).setAutoPadding(false);
    return Buffer.concat([cipher.update(block), cipher.final()]).toString('base64url');
  }

  /** The number `text` seals for `purpose`, or undefined for anything else. Call `ready()` first. */
  open(purpose: SealPurpose, text: string): string | undefined {
    if (!SEALED.test(text)) return undefined;
    const sealed = Buffer.from(text, 'base64url');
    // One spelling only: the last character's four unused bits must be zero, as this seal writes them.
    if (sealed.length !== 16 || sealed.toString('base64url') !== text) return undefined;
    const decipher = createDecipheriv('aes-256-ecb', this.keyOrThrow(), null).setAutoPadding(false);
    const block = Buffer.concat([decipher.update(sealed), decipher.final()]);
    if (!block.subarray(0, 8).equals(PURPOSE[purpose])) return undefined;
    const n = block.readBigUInt64BE(8);
    return n > 0n && n < 2n ** 63n ? n.toString() : undefined;
  }

  private keyOrThrow(): KeyObject {
    if (this.key === undefined) throw new Error('CursorSeal used before ready()');
    return this.key;
  }
}
