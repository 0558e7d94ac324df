// The names of the gateway's LISTEN/NOTIFY channels (design §3.6): a public base (messages.ts: BUS_CHANNEL,
// INSPECT_CHANNEL, ROLLOUT_CHANNEL) and this installation's secret (migration 0035), `<base>_<secret>`. NOTIFY needs
// no privilege and PostgreSQL sends a notification to every backend that LISTENs on its channel, so a name any
// login could guess let any login flood each replica's listening connection; only the owner and the gateway's
// login can read the secret, so only they can reach a replica's connection.
import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import type pg from 'pg';
import type { GatewayDatabase } from '../db/tables.js';

/** The secret's form (migration 0035's CHECK): what makes `<base>_<secret>` a plain identifier of ≤ 63 bytes. */
const SECRET_PATTERN = /^[0-9a-f]{32}$/;

/** The channel a base name stands for in this installation. */
export function channelName(base: string, secret: string): string {
  return `${base}_${secret}`;
}

/** Reads the installation's channel secret on the listener's connection, before it LISTENs. */
export async function readChannelSecret(client: pg.Client): Promise<string> {
  const { rows } = await client.query<{ secret: string }>('SELECT secret FROM device_gateway.bus_channels');
  const secret = rows[0]?.secret;
  // The table's CHECK makes this unreachable; checked because the name is spliced into LISTEN.
  if (secret === undefined || !SECRET_PATTERN.test(secret))
    throw new Error('device_gateway.bus_channels holds no channel secret (migration 0035)');
  return secret;
}

/**
 * Sends `payload` on the channel of `base`, the name built in SQL from the secret's row, so a sender needs no
 * copy of it. In a statement of its own (migration 0021: a NOTIFY that fails at commit fails only itself).
 */
export async function notifyChannel(
  db: Kysely<GatewayDatabase> | Transaction<GatewayDatabase>,
  base: string,
  payload: string | RawBuilder<string>,
): Promise<void> {
  const text = typeof payload === 'string' ? sql`${payload}::text` : payload;
  await sql`SELECT pg_catalog.pg_notify(${base}::text || '_' || c.secret, ${text})
            FROM device_gateway.bus_channels c`.execute(db);
}
