// The gateway's channel names as its replicas LISTEN on them (migration 0035: `<base>_<secret>`), read as the owner:
// what a test that plays someone who learned the names sends on, or listens to.
import { sql, type Kysely } from 'kysely';
import { channelName } from '../../src/cluster/channels.js';
import { BUS_CHANNEL, INSPECT_CHANNEL, ROLLOUT_CHANNEL } from '../../src/cluster/messages.js';
import type { GatewayDatabase } from '../../src/db/tables.js';

export interface GatewayChannels {
  bus: string;
  inspect: string;
  rollout: string;
}

export async function gatewayChannels(owner: Kysely<GatewayDatabase>): Promise<GatewayChannels> {
  const { rows } = await sql<{ secret: string }>`SELECT secret FROM device_gateway.bus_channels`.execute(
    owner,
  );
  const secret = rows[0]!.secret;
  return {
    bus: channelName(BUS_CHANNEL, secret),
    inspect: channelName(INSPECT_CHANNEL, secret),
    rollout: channelName(ROLLOUT_CHANNEL, secret),
  };
}
