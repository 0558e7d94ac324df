// Two gateway replicas (dist/main.js) on one embedded PostgreSQL with the seeded registry, and PLAIN observed on
// A: what the device view's review tests (review-44-bus, review-45-bus) attack.
import { createDb } from '@platform/service-kit';
import { createTestDatabase, startPostgres, type PostgresServer, type TestDatabase } from '@platform/testkit';
import type { Kysely } from 'kysely';
import { gatewayMigrations } from '../../src/db/migrations.js';
import { seedDevices } from '../../src/db/seed.js';
import type { GatewayDatabase } from '../../src/db/tables.js';
import { RawCoapClient } from './coap-client.js';
import { API_KEYS } from './gateway.js';
import { startReplica, type Replica } from './replicas.js';

/** A seeded device, observed on A (a confirmable relation to its settings). */
export const PLAIN = 'acme-hq-hvac-01';

/** What these tests read of a device view. */
export interface PartSeen {
  replica: string;
  answered: boolean;
  relations_total?: number;
}
export interface ViewSeen {
  replicas?: PartSeen[];
}

export interface ViewCluster {
  pg: PostgresServer;
  database: TestDatabase;
  /** The database's owner (a table lock, rows written directly). */
  owner: Kysely<GatewayDatabase>;
  a: Replica;
  b: Replica;
  originA: string;
  originB: string;
  stop(): Promise<void>;
}

/** Two replicas on one seeded database; `env` adds to (or overrides) the replicas' environment. */
export async function startViewCluster(env: Record<string, string> = {}): Promise<ViewCluster> {
  const pg = await startPostgres();
  const database = await createTestDatabase({ migrations: [gatewayMigrations], adminUrl: pg.url });
  const owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await seedDevices(owner);
  const replicaEnv = { GATEWAY_DELIVERY_FLUSH_MS: '200', LOG_LEVEL: 'info', ...env };
  const [a, b] = await Promise.all([
    startReplica('A', database.url, replicaEnv),
    startReplica('B', database.url, replicaEnv),
  ]);
  await Promise.all([a.waitReady(), b.waitReady()]);
  const originA = (await a.cluster()).origin as string;
  const originB = (await b.cluster()).origin as string;
  // A relation on A, so A's true part is not empty.
  const observer = await RawCoapClient.observeSettings(a.coapPort, PLAIN);
  return {
    pg,
    database,
    owner,
    a,
    b,
    originA,
    originB,
    async stop() {
      await observer.close();
      await a.stop();
      await b.stop();
      await owner.destroy();
      await database.drop();
      await pg.stop();
    },
  };
}

/** GET /api/devices/{deviceId} on `r` with the API key: status, time taken and body. */
export async function viewOf(
  r: Replica,
  deviceId: string,
): Promise<{ status: number; ms: number; text: string }> {
  const t0 = Date.now();
  const res = await fetch(`${r.url}/api/devices/${deviceId}`, {
    headers: { Authorization: `Bearer ${API_KEYS[0]!}` },
  });
  const text = await res.text();
  return { status: res.status, ms: Date.now() - t0, text };
}
