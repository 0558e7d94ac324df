import { createDb, createLogger, createMetrics } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import type { Kysely } from 'kysely';
import { buildApp, type GatewayApp } from '../../src/app.js';
import { ApiKeys, loadGatewayConfig } from '../../src/config.js';
import { gatewayLoginUrl, gatewayMigrations } from '../../src/db/migrations.js';
import { seedDevices } from '../../src/db/seed.js';
import type { GatewayDatabase } from '../../src/db/tables.js';

export const API_KEYS = ['test-key-one-0123456789', 'test-key-two-9876543210'];

/** The same database, as the gateway's read-only login (dev default password outside production). */
export function loginUrl(ownerUrl: string): string {
  return gatewayLoginUrl(ownerUrl);
}

export interface GatewayFixture {
  app: GatewayApp;
  owner: Kysely<GatewayDatabase>;
  reader: Kysely<GatewayDatabase>;
  database: TestDatabase;
  coapPort: number;
  close(): Promise<void>;
}

/** A migrated, seeded database and a gateway built on it (CoAP bound to a free port, registry loaded). */
export async function startGateway(
  options: { env?: Record<string, string>; adminUrl?: string; load?: boolean } = {},
): Promise<GatewayFixture> {
  const database = await createTestDatabase({
    migrations: [gatewayMigrations],
    ...(options.adminUrl === undefined ? {} : { adminUrl: options.adminUrl }),
  });
  const quiet = { warn: () => undefined };
  const owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: quiet });
  await seedDevices(owner);
  const config = loadGatewayConfig({
    DATABASE_URL: loginUrl(database.url),
    GATEWAY_API_KEYS: API_KEYS.join(','),
    COAP_ACK_TIMEOUT_MS: '200',
    // One process: overrides apply here directly (the replica tests run real processes with the bus).
    GATEWAY_CLUSTER_BUS: 'false',
    ...options.env,
  });
  const reader = createDb<GatewayDatabase>(config.database.url, {
    max: 2,
    connectionTimeoutMs: 2000,
    logger: quiet,
  });
  const logger = createLogger({ service: 'device-gateway-test', level: 'error' });
  const keys = new ApiKeys(API_KEYS);
  const app = buildApp({
    config,
    logger,
    db: reader,
    apiKeys: () => keys,
    metrics: createMetrics({ service: 'gw' }),
  });
  await app.coap.listen(0, '127.0.0.1');
  if (options.load !== false) await app.service.reload();
  return {
    app,
    owner,
    reader,
    database,
    coapPort: app.coap.address().port,
    async close() {
      // Gives the lease up and closes the driver's own connection (a replica without the bus has one).
      await app.rollouts.driver.stop();
      app.rollouts.assignments.stop();
      await app.coap.close(100);
      await reader.destroy();
      await owner.destroy();
      await database.drop();
    },
  };
}
