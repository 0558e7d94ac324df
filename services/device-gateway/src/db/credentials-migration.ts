import { sql, type Kysely, type Migration } from 'kysely';

const LOGIN = 'device_gateway_login';

/**
 * The devices' DTLS pre-shared keys (design §3.5).
 *
 * - `psk_key` holds the raw key bytes. A PSK cannot be stored hashed: both ends feed it into the premaster
 *   secret (RFC 4279 §2), so the gateway needs the bytes themselves. The operator command issues printable
 *   keys (base64url text) and stores the UTF-8 bytes of that text, which is what libcoap's `-k` sends.
 *   16..64 bytes: 128 bits at least (the strength of the AES-128 suite), and RFC 4279 §5.3 obliges every
 *   TLS implementation to accept PSKs up to 64 octets, so a longer key might not work in some device stack.
 * - `psk_identity` is what a client sends in clear in its ClientKeyExchange (RFC 4279 §7.2: eavesdroppers
 *   see it), so it is its own opaque name, never the device id. Printable ASCII without spaces (it is typed
 *   on command lines and appears in logs), 1..128 characters: RFC 4279 §5.3's required identity length.
 *   COLLATE "C": identities compare byte for byte, as the handshake does.
 * - Several rows per device may be valid at once (rotation with overlap); nothing here limits them.
 * - `not_after` NULL means no expiry (a device that cannot be re-keyed in the field); the operator command
 *   sets one unless asked not to. A non-NULL `revoked_at` revokes the key whatever its value.
 * - A device deleted from the registry takes its keys with it (ON DELETE CASCADE), and a device with keys
 *   cannot be renamed (the default NO ACTION on update): a key never outlives its device or moves to another.
 * - Only the owner (migrations, the operator command) writes. The gateway's login may SELECT, nobody else
 *   (REVOKE from PUBLIC; no grant to any enterprise role; the schema's USAGE is the gateway login's only).
 */
export const deviceCredentialsMigration: Migration = {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql`
      CREATE TABLE device_gateway.device_credentials (
        credential_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        psk_identity text COLLATE "C" NOT NULL UNIQUE
          CHECK (psk_identity ~ '^[!-~]{1,128}$'),
        psk_key bytea NOT NULL CHECK (octet_length(psk_key) BETWEEN 16 AND 64),
        device_id text NOT NULL
          REFERENCES device_gateway.device_registry (device_id) ON DELETE CASCADE,
        not_before timestamptz NOT NULL DEFAULT now(),
        not_after timestamptz,
        revoked_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT device_credentials_identity_not_device_id CHECK (psk_identity <> device_id),
        CONSTRAINT device_credentials_window CHECK (not_after IS NULL OR not_after > not_before)
      )`.execute(db);
    // The reload reads the keys that are neither revoked nor expired: a partial index over the unrevoked
    // rows, ordered by expiry, so revoked and long-expired keys (never deleted) are not read at all.
    await sql`
      CREATE INDEX device_credentials_live_idx ON device_gateway.device_credentials (not_after)
      WHERE revoked_at IS NULL`.execute(db);
    // `list <device>`, `revoke --device` and the ON DELETE CASCADE from the registry look rows up by device.
    await sql`
      CREATE INDEX device_credentials_device_idx ON device_gateway.device_credentials (device_id)`.execute(
      db,
    );
    await sql`REVOKE ALL ON TABLE device_gateway.device_credentials FROM PUBLIC`.execute(db);
    await sql.raw(`GRANT SELECT ON TABLE device_gateway.device_credentials TO ${LOGIN}`).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql`DROP TABLE device_gateway.device_credentials`.execute(db);
  },
};
