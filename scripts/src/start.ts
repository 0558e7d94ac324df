// `npm start`: the whole platform on one machine, in the foreground (design §5). Embedded PostgreSQL
// (data in .data/postgres, or PLATFORM_DATA_DIR), migrations and demo seed, s3rver whose ObjectCreated events are forwarded
// to the workflow's webhook the way MinIO sends them, a development token issuer with Keycloak's paths,
// both services as separate processes, and PostgREST when a `postgrest` binary is on PATH. Any piece can
// point at a real server instead: DATABASE_URL, S3_ENDPOINT, OIDC_ISSUER_URL. Ctrl-C stops everything.
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { gatewayLoginPassword, GATEWAY_LOGIN_ROLE } from '@platform/device-gateway';
import { API_LOGIN, AUTHENTICATOR, rolePasswordsFromEnv, urlForLogin } from '@platform/enterprise-db';
import { startIssuer, startPostgres, startS3 } from '@platform/testkit';
import type { Issuer, PostgresServer, S3EventRecord, S3Server } from '@platform/testkit';
import { migrateAll, seedAll } from '@platform/deploy';
import { ensureDatabase } from './lib/database.js';
import { ensureDevDeviceKey } from './lib/dev-device-key.js';
import { dataDir, devSecrets, envPort, localPorts, repoRoot } from './lib/local.js';
import { forwardToWebhook } from './lib/webhook-bridge.js';
import { postgrestEnvironment } from './lib/postgrest.js';
import { waitReady } from './lib/wait.js';
import { errorMessage, readSecretList } from '@platform/service-kit';

const env = process.env;
/** The portal's origin in development, whose browser uploads s3rver's CORS rule allows (PORTAL_ORIGINS). */
const DEFAULT_PORTAL_ORIGIN = 'http://localhost:5173';
const log = (message: string): void => console.error(`[stack] ${message}`);

interface Running {
  postgres?: PostgresServer;
  s3?: S3Server;
  issuer?: Issuer;
  children: Array<{ name: string; process: ChildProcess }>;
}
const running: Running = { children: [] };
let stopping = false;

async function main(): Promise<void> {
  mkdirSync(dataDir, { recursive: true });
  const ports = {
    postgres: envPort(env, 'LOCAL_POSTGRES_PORT', localPorts.postgres),
    gatewayHttp: envPort(env, 'GATEWAY_HTTP_PORT', localPorts.gatewayHttp),
    gatewayCoap: envPort(env, 'GATEWAY_COAP_PORT', localPorts.gatewayCoap),
    gatewayCoaps: envPort(env, 'GATEWAY_COAPS_PORT', localPorts.gatewayCoaps),
    workflow: envPort(env, 'PORT', localPorts.workflow),
    postgrest: envPort(env, 'POSTGREST_PORT', localPorts.postgrest),
    s3: envPort(env, 'LOCAL_S3_PORT', localPorts.s3),
    issuer: envPort(env, 'LOCAL_ISSUER_PORT', localPorts.issuer),
  };
  const apiKeys = env.GATEWAY_API_KEYS ?? devSecrets.gatewayApiKey;
  const webhookTokens = env.WEBHOOK_TOKENS ?? devSecrets.webhookToken;
  const webhookToken = readSecretList({ value: webhookTokens })[0] ?? devSecrets.webhookToken;

  // 1. Database: the given server, or the embedded one (its data survives restarts).
  let ownerUrl = env.DATABASE_URL;
  if (ownerUrl === undefined || ownerUrl === '') {
    log(`starting embedded PostgreSQL on 127.0.0.1:${ports.postgres} (data in ${dataDir}/postgres)`);
    running.postgres = await startPostgres({ port: ports.postgres, dataDir: `${dataDir}/postgres` });
    ownerUrl = await ensureDatabase(running.postgres.url, 'platform');
  }
  log('applying migrations and demo seed');
  await migrateAll(ownerUrl, env);
  await seedAll(ownerUrl);
  // The demo device's PSK for coaps, issued on the first start and kept in the data folder (dev only).
  const deviceKey = await ensureDevDeviceKey(ownerUrl, `${dataDir}/dev-device-key.json`, 'acme-hq-hvac-01');
  const passwords = rolePasswordsFromEnv(env);
  const gatewayDbUrl = urlForLogin(ownerUrl, GATEWAY_LOGIN_ROLE, gatewayLoginPassword(env));
  const workflowDbUrl = urlForLogin(ownerUrl, API_LOGIN, passwords.enterpriseApi);
  const authenticatorUrl = urlForLogin(ownerUrl, AUTHENTICATOR, passwords.authenticator);

  // 2. Object storage: the given endpoint, or s3rver with events bridged to the webhook.
  const portalOrigins = (env.PORTAL_ORIGINS ?? DEFAULT_PORTAL_ORIGIN)
    .split(',')
    .map((origin) => origin.trim())
    .filter((origin) => origin !== '');
  const workflowUrl = `http://127.0.0.1:${ports.workflow}`;
  const webhookUrl = `${workflowUrl}/internal/media/object-created`;
  let s3Env: Record<string, string>;
  if (env.S3_ENDPOINT !== undefined && env.S3_ENDPOINT !== '') {
    s3Env = {};
  } else {
    running.s3 = await startS3({
      port: ports.s3,
      // A browser on the portal's origin uploads straight to the store (design §4.4).
      corsOrigins: portalOrigins,
      directory: `${dataDir}/s3`,
      bucket: env.S3_BUCKET ?? 'media',
      // As deploy/minio/setup.sh configures MinIO: uploads only, not the workflow's accepted copies.
      eventPrefix: 'sites/',
      onObjectCreated: (record: S3EventRecord) => forwardToWebhook(webhookUrl, webhookToken, record, log),
      onError: (err) => log(`s3 event bridge: ${errorMessage(err)}`),
    });
    s3Env = {
      S3_ENDPOINT: running.s3.endpoint,
      S3_REGION: running.s3.region,
      S3_BUCKET: running.s3.bucket,
      S3_ACCESS_KEY_ID: running.s3.accessKeyId,
      S3_SECRET_ACCESS_KEY: running.s3.secretAccessKey,
      S3_FORCE_PATH_STYLE: 'true',
    };
  }

  // 3. Identity: the given issuer, or the development one (keys kept in .data so tokens survive restarts).
  let issuerUrl = env.OIDC_ISSUER_URL;
  if (issuerUrl === undefined || issuerUrl === '') {
    running.issuer = await startIssuer({
      port: ports.issuer,
      host: '127.0.0.1',
      keyStore: `${dataDir}/dev-issuer-keys.json`,
    });
    issuerUrl = running.issuer.issuerUrl;
  }

  // 4. The services, each its own process as in production.
  const common = {
    PATH: env.PATH ?? '',
    LOG_LEVEL: env.LOG_LEVEL ?? 'info',
    NODE_ENV: 'development',
  };
  spawnService('device-gateway', `${repoRoot}services/device-gateway/dist/main.js`, {
    ...common,
    DATABASE_URL: gatewayDbUrl,
    GATEWAY_HTTP_PORT: String(ports.gatewayHttp),
    GATEWAY_COAP_PORT: String(ports.gatewayCoap),
    GATEWAY_COAPS_PORT: String(ports.gatewayCoaps),
    // Both: coaps as in production, and plain CoAP for tools without DTLS.
    GATEWAY_COAP_SECURITY: env.GATEWAY_COAP_SECURITY ?? 'both',
    GATEWAY_API_KEYS: apiKeys,
  });
  spawnService('enterprise-workflow', `${repoRoot}services/enterprise-workflow/dist/main.js`, {
    ...common,
    ...s3Env,
    ...pick(env, [
      'S3_ENDPOINT',
      'S3_REGION',
      'S3_BUCKET',
      'S3_ACCESS_KEY_ID',
      'S3_SECRET_ACCESS_KEY',
      'S3_FORCE_PATH_STYLE',
    ]),
    DATABASE_URL: workflowDbUrl,
    PORT: String(ports.workflow),
    OIDC_ISSUER_URL: issuerUrl,
    OIDC_CLIENT_ID: env.OIDC_CLIENT_ID ?? 'platform-enterprise-web',
    WEBHOOK_TOKENS: webhookTokens,
  });
  const postgrest = spawnSync('sh', ['-c', 'command -v postgrest'], { encoding: 'utf8' }).stdout.trim();
  if (postgrest !== '') {
    spawnService('postgrest', postgrest, {
      ...common,
      ...(await postgrestEnvironment(ownerUrl, authenticatorUrl, ports.postgrest, issuerUrl)),
    });
  }

  await Promise.all([
    serviceReady('device-gateway', `http://127.0.0.1:${ports.gatewayHttp}/api/ready`),
    serviceReady('enterprise-workflow', `${workflowUrl}/ready`),
  ]);
  if (stopping) return;

  const banner = [
    '',
    'Facility platform: local stack is up (Ctrl-C stops all of it)',
    `  PostgreSQL           ${ownerUrl}${running.postgres ? `  (embedded, data in ${dataDir}/postgres)` : ''}`,
    `  gateway HTTP API     http://127.0.0.1:${ports.gatewayHttp}/api   (API key: ${apiKeys === devSecrets.gatewayApiKey ? devSecrets.gatewayApiKey : 'from GATEWAY_API_KEYS'})`,
    `  gateway CoAP         coap://127.0.0.1:${ports.gatewayCoap}/devices/acme-hq-hvac-01/settings   (plain, no device authentication)`,
    `  gateway CoAP+DTLS    coaps://127.0.0.1:${ports.gatewayCoaps}/devices/acme-hq-hvac-01/settings   (PSK identity ${deviceKey.identity}, key in ${dataDir}/dev-device-key.json)`,
    `  workflow API         ${workflowUrl}`,
    `  webhook              ${webhookUrl}   (token: ${webhookTokens === devSecrets.webhookToken ? devSecrets.webhookToken : 'from WEBHOOK_TOKENS'})`,
    `  object storage       ${s3Env.S3_ENDPOINT ?? env.S3_ENDPOINT ?? ''}   bucket ${s3Env.S3_BUCKET ?? env.S3_BUCKET ?? ''}${running.s3 ? `   (CORS for ${portalOrigins.join(', ')})` : ''}`,
    `  token issuer         ${issuerUrl}`,
    postgrest === ''
      ? '  PostgREST            not started (no `postgrest` binary on PATH)'
      : `  PostgREST            http://127.0.0.1:${ports.postgrest}`,
    '',
    '  a token:             npm run token -- alice      (alice, bob, carol, dave)',
    `  observe a device:    coap-client-openssl -m get -s 60 -u '${deviceKey.identity}' -k '${deviceKey.keyText}' coaps://127.0.0.1:${ports.gatewayCoaps}/devices/acme-hq-hvac-01/settings`,
    `    (no DTLS client:   coap-client-notls -m get -s 60 coap://127.0.0.1:${ports.gatewayCoap}/devices/acme-hq-hvac-01/settings)`,
    '  device keys:         npm run device-key -- issue|revoke|list   (DATABASE_URL: the owner URL above)',
    `  push settings:       curl -H 'Authorization: Bearer ${readSecretList({ value: apiKeys })[0] ?? devSecrets.gatewayApiKey}' -H 'Content-Type: application/json' \\`,
    `                         -d '{"device_id":"acme-hq-hvac-01","settings":{"reporting_interval_s":60}}' http://127.0.0.1:${ports.gatewayHttp}/api/notify-settings`,
    '',
  ];
  console.log(banner.join('\n'));
}

function pick(source: NodeJS.ProcessEnv, names: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of names) {
    const value = source[name];
    if (value !== undefined && value !== '') out[name] = value;
  }
  return out;
}

/** Starts `command` (a Node entry point when it ends in .js) with exactly `childEnv`, logs to our stdio. */
function spawnService(name: string, command: string, childEnv: Record<string, string>): void {
  const [file, args] = command.endsWith('.js') ? [process.execPath, [command]] : [command, []];
  const child = spawn(file, args, { env: childEnv, stdio: ['ignore', 'inherit', 'inherit'] });
  running.children.push({ name, process: child });
  child.on('exit', (code, signal) => {
    if (!stopping) {
      log(`${name} exited unexpectedly (code ${String(code)}, signal ${String(signal)}); stopping the stack`);
      void stop(1);
    }
  });
}

async function serviceReady(name: string, url: string): Promise<void> {
  try {
    await waitReady(url, { timeoutMs: 60_000, intervalMs: 200, cancelled: () => stopping });
  } catch (err) {
    throw new Error(`${name}: ${errorMessage(err)}`, { cause: err });
  }
}

/** Stops the services first (they drain), then the stores they depend on. */
async function stop(exitCode: number): Promise<void> {
  if (stopping) return;
  stopping = true;
  log('stopping');
  await Promise.all(
    running.children.map(
      ({ process: child }) =>
        new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) return resolve();
          const force = setTimeout(() => child.kill('SIGKILL'), 12_000);
          child.once('exit', () => {
            clearTimeout(force);
            resolve();
          });
          child.kill('SIGTERM');
        }),
    ),
  );
  await running.issuer?.stop().catch(() => undefined);
  await running.s3?.stop().catch(() => undefined);
  await running.postgres?.stop().catch(() => undefined);
  log('stopped');
  process.exit(exitCode);
}

process.on('SIGINT', () => void stop(0));
process.on('SIGTERM', () => void stop(0));

main().catch((err: unknown) => {
  log(`failed to start: ${errorMessage(err)}`);
  void stop(1);
});
