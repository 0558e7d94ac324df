import { randomBytes } from 'node:crypto';
import { sqlState } from '@platform/service-kit';
import { sql, type Kysely } from 'kysely';
import type { CredentialRecord } from '../domain/credentials.js';
import type { GatewayDatabase } from './tables.js';

/**
 * The credentials a registry load hands the gateway: not revoked, not expired (at the database's clock) and
 * belonging to an enabled device. Keys issued for later (`not_before` ahead) are included: the store applies
 * the window at each handshake, so they start working on time without another reload. Read in the reload's
 * transaction, so the registry and its keys are one snapshot.
 *
 * A disabled device's keys are left out on purpose: the gateway answers a disabled device as an unknown one
 * (design §3.2/3.4), so its session could do nothing but hold a slot, and disabling a device is the operator's
 * quickest way to cut it off (a stolen unit) without touching its keys; enabling it again restores them.
 */
export async function loadCredentials(db: Kysely<GatewayDatabase>): Promise<CredentialRecord[]> {
  const rows = await db
    .selectFrom('device_gateway.device_credentials as c')
    .innerJoin('device_gateway.device_registry as r', 'r.device_id', 'c.device_id')
    .select(['c.credential_id', 'c.psk_identity', 'c.psk_key', 'c.device_id', 'c.not_before', 'c.not_after'])
    .where('c.revoked_at', 'is', null)
    .where('r.enabled', '=', true)
    .where((eb) => eb.or([eb('c.not_after', 'is', null), eb('c.not_after', '>', sql<Date>`now()`)]))
    .execute();
  return rows.map((row) => ({
    credentialId: row.credential_id,
    identity: row.psk_identity,
    key: row.psk_key,
    deviceId: row.device_id,
    notBeforeMs: row.not_before.getTime(),
    notAfterMs: row.not_after === null ? undefined : row.not_after.getTime(),
  }));
}

/** Printable ASCII without spaces, 1..128 characters: the table's check (RFC 4279 §5.3 identity length). */
export const PSK_IDENTITY_PATTERN = /^[\x21-\x7e]{1,128}$/;

/** Random bytes behind an issued key: 24 bytes (192 bits) are 32 base64url characters. */
const KEY_RANDOM_BYTES = 24;
/** Random bytes behind a generated identity: 12 bytes (96 bits) are 16 base64url characters. */
const IDENTITY_RANDOM_BYTES = 12;
/** Longest validity `--valid-days` accepts; longer means "no expiry" (`not_after` NULL). */
export const MAX_VALID_DAYS = 3650;

/**
 * A new key as printable text: libcoap 4.3.1's `-k` takes the key as text and uses its bytes, so the stored
 * key is the UTF-8 (here ASCII) bytes of this text, never its base64 decoding.
 */
export function generateKeyText(): string {
  return randomBytes(KEY_RANDOM_BYTES).toString('base64url');
}

/**
 * A new opaque identity. Not derived from the device id: the identity crosses the network in clear
 * (RFC 4279 §7.2), and an opaque one does not tell an eavesdropper which device is talking.
 * The `psk-` prefix keeps it from starting with `-`, which command-line tools would read as an option.
 */
export function generateIdentity(): string {
  return `psk-${randomBytes(IDENTITY_RANDOM_BYTES).toString('base64url')}`;
}

export class CredentialCommandError extends Error {
  constructor(
    readonly code: 'unknown_device' | 'unknown_identity' | 'identity_taken' | 'invalid_identity',
    message: string,
  ) {
    super(message);
    this.name = 'CredentialCommandError';
  }
}

export interface IssuedCredential {
  credentialId: string;
  identity: string;
  /** The printable key; shown once, never stored anywhere but the table. */
  keyText: string;
  deviceId: string;
  /** The device's site (the audit's scope). */
  siteId: string;
  deviceEnabled: boolean;
  notBefore: Date;
  notAfter: Date | null;
}

export interface IssueOptions {
  /** Days until `not_after`; undefined: no expiry. */
  validDays?: number | undefined;
  /** The identity to use instead of a generated one. */
  identity?: string | undefined;
}

const FOREIGN_KEY_VIOLATION = '23503';

/**
 * Stores a new key for `deviceId` (valid from now; several keys per device may be valid at once). The times
 * come from the database's clock, the one the gateway's load compares with. A generated identity that
 * collides with an existing one (96 random bits: practically never; the UNIQUE constraint decides) is drawn
 * again. A collision is `ON CONFLICT DO NOTHING` rather than a caught unique violation, so `db` may be a
 * transaction (the command writes the audit row in the same one): an error would abort it.
 */
export async function issueCredential(
  db: Kysely<GatewayDatabase>,
  deviceId: string,
  options: IssueOptions = {},
): Promise<IssuedCredential> {
  const given = options.identity;
  if (given !== undefined) {
    if (!PSK_IDENTITY_PATTERN.test(given))
      throw new CredentialCommandError(
        'invalid_identity',
        'the identity must be 1-128 printable ASCII characters without spaces',
      );
    if (given === deviceId)
      throw new CredentialCommandError(
        'invalid_identity',
        'the identity must differ from the device id (it is sent in clear)',
      );
  }
  const device = await db
    .selectFrom('device_gateway.device_registry')
    .select(['device_id', 'site_id', 'enabled'])
    .where('device_id', '=', deviceId)
    .executeTakeFirst();
  if (device === undefined)
    throw new CredentialCommandError('unknown_device', `device ${deviceId} is not in the registry`);
  const keyText = generateKeyText();
  const notAfter =
    options.validDays === undefined
      ? sql<Date | null>`NULL`
      : sql<Date>`now() + make_interval(days => ${options.validDays}::int)`;
  for (let attempt = 0; ; attempt++) {
    const identity = given ?? generateIdentity();
    let row;
    try {
      row = await db
        .insertInto('device_gateway.device_credentials')
        .values({
          psk_identity: identity,
          psk_key: Buffer.from(keyText, 'utf8'),
          device_id: deviceId,
          not_after: notAfter,
        })
        .onConflict((oc) => oc.column('psk_identity').doNothing())
        .returning(['credential_id', 'not_before', 'not_after'])
        .executeTakeFirst();
    } catch (err) {
      // The device was deleted since it was read.
      if (sqlState(err) === FOREIGN_KEY_VIOLATION)
        throw new CredentialCommandError('unknown_device', `device ${deviceId} is not in the registry`);
      throw err;
    }
    if (row !== undefined)
      return {
        credentialId: row.credential_id,
        identity,
        keyText,
        deviceId,
        siteId: device.site_id,
        deviceEnabled: device.enabled,
        notBefore: row.not_before,
        notAfter: row.not_after,
      };
    if (given !== undefined)
      throw new CredentialCommandError('identity_taken', `the identity ${given} is already in use`);
    if (attempt >= 3) throw new Error('four generated identities in a row were taken');
  }
}

export interface RevokeResult {
  /** The device whose keys these are, and its site (the audit's scope). */
  deviceId: string;
  siteId: string;
  /** Identities revoked by this call. */
  revoked: string[];
  /** Identities that were revoked before (nothing changed for them). */
  alreadyRevoked: string[];
}

/** Revokes the key with this identity (idempotent: a key revoked before keeps its first `revoked_at`). */
export async function revokeIdentity(db: Kysely<GatewayDatabase>, identity: string): Promise<RevokeResult> {
  const row = await db
    .selectFrom('device_gateway.device_credentials as c')
    .innerJoin('device_gateway.device_registry as r', 'r.device_id', 'c.device_id')
    .select(['c.psk_identity', 'c.revoked_at', 'c.device_id', 'r.site_id'])
    .where('c.psk_identity', '=', identity)
    .executeTakeFirst();
  if (row === undefined)
    throw new CredentialCommandError('unknown_identity', `no key has the identity ${identity}`);
  const of = { deviceId: row.device_id, siteId: row.site_id };
  if (row.revoked_at !== null) return { ...of, revoked: [], alreadyRevoked: [identity] };
  const updated = await db
    .updateTable('device_gateway.device_credentials')
    .set({ revoked_at: sql<Date>`now()` })
    .where('psk_identity', '=', identity)
    .where('revoked_at', 'is', null)
    .returning('psk_identity')
    .execute();
  // Empty: a concurrent revoke won between the two statements; the key is revoked either way.
  return updated.length === 1
    ? { ...of, revoked: [identity], alreadyRevoked: [] }
    : { ...of, revoked: [], alreadyRevoked: [identity] };
}

/** Revokes every key of `deviceId` not revoked yet (a lost or compromised device). */
export async function revokeDevice(db: Kysely<GatewayDatabase>, deviceId: string): Promise<RevokeResult> {
  const device = await db
    .selectFrom('device_gateway.device_registry')
    .select(['device_id', 'site_id'])
    .where('device_id', '=', deviceId)
    .executeTakeFirst();
  if (device === undefined)
    throw new CredentialCommandError('unknown_device', `device ${deviceId} is not in the registry`);
  const updated = await db
    .updateTable('device_gateway.device_credentials')
    .set({ revoked_at: sql<Date>`now()` })
    .where('device_id', '=', deviceId)
    .where('revoked_at', 'is', null)
    .returning('psk_identity')
    .execute();
  return {
    deviceId,
    siteId: device.site_id,
    revoked: updated.map((r) => r.psk_identity).sort(),
    alreadyRevoked: [],
  };
}

export type CredentialStatus = 'valid' | 'not_yet_valid' | 'expired' | 'revoked' | 'device_disabled';

/** A key as `list` shows it: everything but the key. */
export interface CredentialListing {
  identity: string;
  deviceId: string;
  status: CredentialStatus;
  notBefore: Date;
  notAfter: Date | null;
  revokedAt: Date | null;
  createdAt: Date;
}

/** Every key (of one device, or all), newest first; the key column is never selected. */
export async function listCredentials(
  db: Kysely<GatewayDatabase>,
  deviceId?: string,
): Promise<CredentialListing[]> {
  let query = db
    .selectFrom('device_gateway.device_credentials as c')
    .innerJoin('device_gateway.device_registry as r', 'r.device_id', 'c.device_id')
    .select([
      'c.psk_identity',
      'c.device_id',
      'c.not_before',
      'c.not_after',
      'c.revoked_at',
      'c.created_at',
      'r.enabled',
    ])
    .select(sql<Date>`now()`.as('now'))
    .orderBy('c.device_id')
    .orderBy('c.created_at', 'desc')
    .orderBy('c.credential_id', 'desc');
  if (deviceId !== undefined) query = query.where('c.device_id', '=', deviceId);
  const rows = await query.execute();
  return rows.map((row) => {
    const now = row.now.getTime();
    let status: CredentialStatus;
    if (row.revoked_at !== null) status = 'revoked';
    else if (row.not_after !== null && row.not_after.getTime() <= now) status = 'expired';
    else if (!row.enabled) status = 'device_disabled';
    else if (row.not_before.getTime() > now) status = 'not_yet_valid';
    else status = 'valid';
    return {
      identity: row.psk_identity,
      deviceId: row.device_id,
      status,
      notBefore: row.not_before,
      notAfter: row.not_after,
      revokedAt: row.revoked_at,
      createdAt: row.created_at,
    };
  });
}

/** Whether `deviceId` is in the registry (`list <device>` of an unknown device is an error, not empty). */
export async function deviceExists(db: Kysely<GatewayDatabase>, deviceId: string): Promise<boolean> {
  const row = await db
    .selectFrom('device_gateway.device_registry')
    .select('device_id')
    .where('device_id', '=', deviceId)
    .executeTakeFirst();
  return row !== undefined;
}
