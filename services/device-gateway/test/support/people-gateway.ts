// One gateway on the platform's database as the people-and-scopes tests need it: the enterprise and gateway
// migrations with both demo seeds, a delivery record row per device (the fleet list's rows, as a gateway that served
// them would have written), the test kit's issuer for the operations client, a key file, and an app without the
// replica bus or a driver of its own (the tests tick it). Real parts throughout.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { enterpriseMigrations, seedEnterprise } from '@platform/enterprise-db';
import { createDb, createLogger } from '@platform/service-kit';
import {
  createTestDatabase,
  OPERATIONS_CLIENT,
  startIssuer,
  type Issuer,
  type TestDatabase,
} from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import { buildApp, type GatewayApp } from '../../src/app.js';
import { loadGatewayConfig, readApiKeys } from '../../src/config.js';
import { gatewayLoginUrl, gatewayMigrations } from '../../src/db/migrations.js';
import { seedDevices } from '../../src/db/seed.js';
import type { GatewayDatabase } from '../../src/db/tables.js';

export interface PeopleGateway {
  database: TestDatabase;
  /** The owner login (seeds, the test's own reads and writes). */
  owner: Kysely<GatewayDatabase>;
  /** The gateway's login, the app's pool. */
  reader: Kysely<GatewayDatabase>;
  issuer: Issuer;
  app: GatewayApp;
  /** The audit rows of a request id once written (a notify's row is written after its answer): at least `n`, or what is there after `ms`. */
  auditRowsOf(requestId: string, n?: number, ms?: number): Promise<number>;
  /** POST /api/notify-settings as `token` with this request id; the status. */
  notify(token: string, deviceId: string, requestId: string, interval?: number): Promise<number>;
  close(): Promise<void>;
}

export async function startPeopleGateway(options: {
  /** Names the key file's folder and the logger's service. */
  name: string;
  /** The key file's lines (a bare key is the anonymous one, `name= role= …` a named key). */
  keyLines: string[];
  /** More of the gateway's environment (statement timeouts, …). */
  env?: Record<string, string>;
  /** Runs with the owner after the seeds, before the first reload (the test's own sites and devices). */
  seed?: (owner: Kysely<GatewayDatabase>) => Promise<void>;
}): Promise<PeopleGateway> {
  const database = await createTestDatabase({ migrations: [enterpriseMigrations, gatewayMigrations] });
  const owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  await seedEnterprise(owner);
  await seedDevices(owner);
  await options.seed?.(owner);
  await sql`INSERT INTO device_gateway.device_delivery (device_id, site_id, desired_at, observed_by)
    SELECT device_id, site_id, now(), '{}' FROM device_gateway.device_registry`.execute(owner);
  const issuer = await startIssuer({ clientId: OPERATIONS_CLIENT });
  const keyFile = join(mkdtempSync(join(tmpdir(), `${options.name}-keys-`)), 'keys');
  writeFileSync(keyFile, options.keyLines.join('\n'));
  const config = loadGatewayConfig({
    DATABASE_URL: gatewayLoginUrl(database.url),
    GATEWAY_API_KEYS_FILE: keyFile,
    GATEWAY_CLUSTER_BUS: 'false',
    GATEWAY_DELIVERY_FLUSH_MS: '200',
    // Ticked by the tests, never on its own.
    GATEWAY_ROLLOUT_DRIVER: 'false',
    GATEWAY_OIDC_ISSUER_URL: issuer.issuerUrl,
    ...options.env,
  });
  const keys = readApiKeys(config);
  const reader = createDb<GatewayDatabase>(config.database.url, {
    max: 4,
    statementTimeoutMs: config.database.statementTimeoutMs,
    logger: { warn: () => undefined },
  });
  const app = buildApp({
    config,
    logger: createLogger({ service: `${options.name}-test`, level: 'error' }),
    db: reader,
    apiKeys: () => keys,
  });
  await app.service.reload();
  return {
    database,
    owner,
    reader,
    issuer,
    app,
    async auditRowsOf(requestId, n = 1, ms = 5000) {
      const deadline = Date.now() + ms;
      for (;;) {
        await app.audit.flush();
        const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM device_gateway.audit_events
          WHERE request_id = ${requestId}`.execute(owner);
        if (rows[0]!.n >= n || Date.now() > deadline) return rows[0]!.n;
        await new Promise((r) => setTimeout(r, 20));
      }
    },
    async notify(token, deviceId, requestId, interval = 90) {
      const res = await request(app.http)
        .post('/api/notify-settings')
        .set('Authorization', `Bearer ${token}`)
        .set('X-Request-Id', requestId)
        .send({ device_id: deviceId, settings: { reporting_interval_s: interval } });
      return res.status;
    },
    async close() {
      app.registry.stopSitesRefresh();
      await app.delivery?.stop();
      await app.rollouts.driver.stop();
      app.rollouts.assignments.stop();
      await reader.destroy();
      await owner.destroy();
      await issuer.stop();
      await database.drop();
    },
  };
}
