// The local stack behind `npm start` (design §5), started by start.ts in a process group of its own.
// Embedded PostgreSQL (data in .data/postgres, or PLATFORM_DATA_DIR), migrations and demo seed, s3rver
// whose ObjectCreated events are forwarded to the workflow's webhook the way MinIO sends them, a
// development token issuer with Keycloak's paths, both services as separate processes, and PostgREST when
// a `postgrest` binary is on PATH (else the banner says how to run it: postgrest.env below). Any piece can
// point at a real server instead: DATABASE_URL, S3_ENDPOINT, OIDC_ISSUER_URL.
//
// What clients call (both services, CoAP, PostgREST) listens on 127.0.0.1 unless LOCAL_BIND_HOST says
// otherwise; PostgreSQL, s3rver and the issuer always listen on 127.0.0.1. The banner prints development
// secrets only: a key or token that came from the environment is named, never printed.
//
// Stopping: SIGINT or SIGTERM (start.ts forwards one), or the end of stdin (start.ts is gone): the
// services get one SIGTERM each and drain, then the stores stop. Nothing here is in the terminal's
// process group, so a Ctrl-C reaches the services only through this sequence, once.
import { spawn, spawnSync } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { existsSync, fstatSync, mkdirSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import { gatewayLoginPassword, GATEWAY_LOGIN_ROLE } from '@platform/device-gateway';
import { API_LOGIN, AUTHENTICATOR, rolePasswordsFromEnv, urlForLogin } from '@platform/enterprise-db';
import { startIssuer, startPostgres, startS3 } from '@platform/testkit';
import type { Issuer, PostgresServer, S3EventRecord, S3Server } from '@platform/testkit';
import { migrateAll, seedAll } from '@platform/deploy';
import { ensureDatabase } from './lib/database.js';
import { ensureDevDeviceKey } from './lib/dev-device-key.js';
import { dataDir, devSecrets, envPort, localPorts, repoRoot } from './lib/local.js';
import { forwardToWebhook } from './lib/webhook-bridge.js';
import { demoCalls, demoExamples } from './lib/demo-examples.js';
import { envFileText, postgrestEnvironment } from './lib/postgrest.js';
import { waitReady } from './lib/wait.js';
import { errorMessage, readSecretList, redactUrl } from '@platform/service-kit';
import { writePrivateFile } from './lib/private-file.js';
import { acquireStackLock, StackRunningError } from './lib/stack-lock.js';
import { logFormatFrom, prettyLogLine } from './lib/log-format.js';
import type { LogFormat } from './lib/log-format.js';

const env = process.env;
/** The portal's origin in development, whose browser uploads s3rver's CORS rule allows (PORTAL_ORIGINS). */
const DEFAULT_PORTAL_ORIGIN = 'http://localhost:5173';
/** Where the services and PostgREST listen unless LOCAL_BIND_HOST says otherwise: this machine only. */
const DEFAULT_BIND_HOST = '127.0.0.1';
const log = (message: string): void => console.error(`[stack] ${message}`);

interface Running {
  postgres?: PostgresServer;
  s3?: S3Server;
  issuer?: Issuer;
  children: Array<{ name: string; process: ChildProcess }>;
}
const running: Running = { children: [] };
let stopping = false;
/** How the services' log lines are printed (LOG_FORMAT): as they write them, or as text (lib/log-format.ts). */
let logFormat: LogFormat = 'json';

async function main(): Promise<void> {
  mkdirSync(dataDir, { recursive: true });
  // Before anything else touches the data folder or a port: a second stack on the same data would stop this
  // one's PostgreSQL (stack-lock.ts). Released when this process exits, however it exits short of SIGKILL.
  const lock = acquireStackLock(dataDir);
  process.on('exit', () => lock.release());
  logFormat = logFormatFrom(env.LOG_FORMAT);
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
  const bindHost =
    env.LOCAL_BIND_HOST === undefined || env.LOCAL_BIND_HOST === '' ? DEFAULT_BIND_HOST : env.LOCAL_BIND_HOST;
  // The address this machine reaches the services at: the bound one, or loopback for a wildcard.
  const localHost = ['0.0.0.0', '::'].includes(bindHost)
    ? '127.0.0.1'
    : bindHost.includes(':')
      ? `[${bindHost}]`
      : bindHost;

  // 1. Database: the given server, or the embedded one (its data survives restarts).
  let ownerUrl = env.DATABASE_URL;
  const databaseFromEnv = ownerUrl !== undefined && ownerUrl !== '';
  if (ownerUrl === undefined || ownerUrl === '') {
    const fresh = !existsSync(`${dataDir}/postgres/PG_VERSION`);
    log(
      `starting embedded PostgreSQL on 127.0.0.1:${ports.postgres} (data in ${dataDir}/postgres` +
        `${fresh ? '; first start: creating the cluster' : ''})`,
    );
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
  const workflowUrl = `http://${localHost}:${ports.workflow}`;
  const gatewayUrl = `http://${localHost}:${ports.gatewayHttp}`;
  const webhookUrl = `${workflowUrl}/internal/media/object-created`;
  let s3Env: Record<string, string>;
  if (env.S3_ENDPOINT !== undefined && env.S3_ENDPOINT !== '') {
    s3Env = {};
  } else {
    log(`starting the local object store (s3rver) on 127.0.0.1:${ports.s3} (data in ${dataDir}/s3)`);
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
    log(`starting the development token issuer on 127.0.0.1:${ports.issuer}`);
    running.issuer = await startIssuer({
      port: ports.issuer,
      host: '127.0.0.1',
      keyStore: `${dataDir}/dev-issuer-keys.json`,
    });
    issuerUrl = running.issuer.issuerUrl;
  }

  // 4. The services, each its own process as in production.
  log(
    'starting device-gateway and enterprise-workflow; their own log lines follow' +
      (logFormat === 'json' ? ' (JSON; LOG_FORMAT=pretty prints them as text)' : ''),
  );
  const common = {
    PATH: env.PATH ?? '',
    LOG_LEVEL: env.LOG_LEVEL ?? 'info',
    NODE_ENV: 'development',
  };
  spawnService('device-gateway', `${repoRoot}services/device-gateway/dist/main.js`, {
    ...common,
    DATABASE_URL: gatewayDbUrl,
    GATEWAY_HTTP_HOST: bindHost,
    GATEWAY_HTTP_PORT: String(ports.gatewayHttp),
    GATEWAY_COAP_HOST: bindHost,
    GATEWAY_COAP_PORT: String(ports.gatewayCoap),
    GATEWAY_COAPS_PORT: String(ports.gatewayCoaps),
    // Both: coaps as in production, and plain CoAP for tools without DTLS.
    GATEWAY_COAP_SECURITY: env.GATEWAY_COAP_SECURITY ?? 'both',
    GATEWAY_API_KEYS: apiKeys,
    // People on /api (design §3.1): the same issuer's tokens for the operations client (npm run -s token -- olga).
    GATEWAY_OIDC_ISSUER_URL: issuerUrl,
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
    HOST: bindHost,
    PORT: String(ports.workflow),
    OIDC_ISSUER_URL: issuerUrl,
    OIDC_CLIENT_ID: env.OIDC_CLIENT_ID ?? 'platform-enterprise-web',
    WEBHOOK_TOKENS: webhookTokens,
  });
  // PostgREST's settings, written out whether or not it runs here: with no binary on PATH the banner says
  // how to run the version compose pins against this stack with exactly these settings. Without a binary,
  // failing to prepare them (an issuer given in OIDC_ISSUER_URL that does not answer, a password no env
  // file can carry) is reported and the rest of the stack starts; with one, it stops the start as before.
  const postgrest = spawnSync('sh', ['-c', 'command -v postgrest'], { encoding: 'utf8' }).stdout.trim();
  const postgrestEnvFile = `${dataDir}/postgrest.env`;
  let postgrestSettings = '';
  try {
    const postgrestEnv = await postgrestEnvironment(ownerUrl, authenticatorUrl, {
      host: bindHost,
      port: ports.postgrest,
      issuerUrl,
    });
    if (postgrest !== '') spawnService('postgrest', postgrest, { ...common, ...postgrestEnv });
    writePrivateFile(postgrestEnvFile, envFileText(postgrestEnv));
    postgrestSettings = postgrestEnvFile;
  } catch (err) {
    if (postgrest !== '' && !running.children.some((c) => c.name === 'postgrest')) throw err;
    log(`PostgREST's settings not written to ${postgrestEnvFile}: ${errorMessage(err)}`);
  }

  log(`waiting until both answer ready (${gatewayUrl}/api/ready, ${workflowUrl}/ready)`);
  await Promise.all([
    serviceReady('device-gateway', `${gatewayUrl}/api/ready`),
    serviceReady('enterprise-workflow', `${workflowUrl}/ready`),
  ]);
  if (stopping) return;

  const apiKeyFromEnv = env.GATEWAY_API_KEYS !== undefined;
  const postgrestImage = composePostgrestImage();
  const calls = demoCalls(workflowUrl);

  const banner = [
    '',
    'Facility platform: local stack is up (Ctrl-C stops all of it)',
    `  PostgreSQL           ${databaseFromEnv ? `${redactUrl(ownerUrl)}  (DATABASE_URL)` : ownerUrl}${running.postgres ? `  (embedded, data in ${dataDir}/postgres)` : ''}`,
    `  listening on         ${bindHost}${bindHost === DEFAULT_BIND_HOST ? ' (this machine only; LOCAL_BIND_HOST=0.0.0.0 opens the services to the network)' : ' (LOCAL_BIND_HOST)'}`,
    `  gateway HTTP API     ${gatewayUrl}/api   (API key: ${apiKeyFromEnv ? 'from GATEWAY_API_KEYS' : devSecrets.gatewayApiKey})`,
    `  gateway CoAP         coap://${localHost}:${ports.gatewayCoap}/devices/acme-hq-hvac-01/settings   (plain, no device authentication)`,
    `  gateway CoAP+DTLS    coaps://${localHost}:${ports.gatewayCoaps}/devices/acme-hq-hvac-01/settings   (PSK identity ${deviceKey.identity}, key in ${dataDir}/dev-device-key.json)`,
    `  workflow API         ${workflowUrl}`,
    `  webhook              ${webhookUrl}   (token: ${env.WEBHOOK_TOKENS === undefined ? devSecrets.webhookToken : 'from WEBHOOK_TOKENS'})`,
    `  object storage       ${s3Env.S3_ENDPOINT ?? env.S3_ENDPOINT ?? ''}   bucket ${s3Env.S3_BUCKET ?? env.S3_BUCKET ?? ''}${running.s3 ? `   (CORS for ${portalOrigins.join(', ')})` : ''}`,
    `  token issuer         ${issuerUrl}`,
    ...(postgrest === '' && postgrestSettings === ''
      ? [
          '  PostgREST            not started (no `postgrest` binary on PATH), and its settings could not be prepared (above)',
        ]
      : postgrest === ''
        ? [
            `  PostgREST            not started (no \`postgrest\` binary on PATH); its settings for this stack are in ${postgrestEnvFile}:`,
            `                         docker run --rm --network host --env-file ${postgrestEnvFile} ${postgrestImage}`,
            `                         or PostgREST ${postgrestImage.split(':')[1] ?? ''}'s binary: (set -a; . ${postgrestEnvFile}; exec postgrest)`,
            `                       then http://${localHost}:${ports.postgrest}. npm test checks the read surface without it (design §4.3).`,
          ]
        : [`  PostgREST            http://${localHost}:${ports.postgrest}`]),
    '',
    '  a token:             npm run -s token -- alice   (prints the bare token; alice, bob, carol, dave)',
    `  fleet API, a person: curl -H "Authorization: Bearer $(npm run -s token -- olga)" ${gatewayUrl}/api/devices   (olga admin, oscar operator of Acme HQ, vera viewer of Borealis)`,
    `  demo ids:            site ${demoExamples.site.id} (${demoExamples.site.name}: alice, bob)`,
    `                       proposed work item ${demoExamples.proposedWorkItemId}, media item ready to download ${demoExamples.readyMediaId}`,
    `  try:                 ${calls.token}`,
    `                       ${calls.download}`,
    `                       ${calls.decide}`,
    `  observe a device:    coap-client-openssl -m get -s 60 -u '${deviceKey.identity}' -k '${deviceKey.keyText}' coaps://${localHost}:${ports.gatewayCoaps}/devices/acme-hq-hvac-01/settings`,
    `    (no DTLS client:   coap-client-notls -m get -s 60 coap://${localHost}:${ports.gatewayCoap}/devices/acme-hq-hvac-01/settings`,
    '                       reads the settings, but this device has a key: a plain observer does not count as delivered',
    '                       (the device view and fleet list say observed_unauthenticated) and cannot report for it; design §3.8)',
    `  report it applied:   coap-client-openssl -m post -t json -e '{"version":<the settings' version>,"outcome":"applied"}' -u '${deviceKey.identity}' -k '${deviceKey.keyText}' coaps://${localHost}:${ports.gatewayCoaps}/devices/acme-hq-hvac-01/reported`,
    `  where it stands:     curl -H 'Authorization: Bearer ${apiKeyFromEnv ? '<a key of GATEWAY_API_KEYS>' : devSecrets.gatewayApiKey}' ${gatewayUrl}/api/devices/acme-hq-hvac-01   (delivery.state; runbook §13)`,
    databaseFromEnv
      ? '  device keys:         npm run device-key -- issue|revoke|list   (with the DATABASE_URL this stack was given)'
      : `  device keys:         DATABASE_URL=${ownerUrl} npm run device-key -- list   (or issue, revoke)`,
    `  push settings:       curl -H 'Authorization: Bearer ${apiKeyFromEnv ? '<a key of GATEWAY_API_KEYS>' : devSecrets.gatewayApiKey}' -H 'Content-Type: application/json' \\`,
    `                         -d '{"device_id":"acme-hq-hvac-01","settings":{"reporting_interval_s":60}}' ${gatewayUrl}/api/notify-settings`,
    '',
  ];
  console.log(banner.join('\n'));
}

/** PostgREST's image as docker-compose.yml pins it (`postgrest/postgrest:vX.Y`), the version to run here. */
function composePostgrestImage(): string {
  const compose = readFileSync(`${repoRoot}docker-compose.yml`, 'utf8');
  const image = /^\s*image:\s*(postgrest\/postgrest:\S+)\s*$/m.exec(compose)?.[1];
  if (image === undefined) throw new Error('docker-compose.yml names no postgrest/postgrest image');
  return image;
}

function pick(source: NodeJS.ProcessEnv, names: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of names) {
    const value = source[name];
    if (value !== undefined && value !== '') out[name] = value;
  }
  return out;
}

/**
 * Starts `command` (a Node entry point when it ends in .js) with exactly `childEnv`, its output on our stdout
 * and stderr: as it is, or with LOG_FORMAT=pretty each line as text.
 */
function spawnService(name: string, command: string, childEnv: Record<string, string>): void {
  const [file, args] = command.endsWith('.js') ? [process.execPath, [command]] : [command, []];
  const output = logFormat === 'json' ? 'inherit' : 'pipe';
  const child = spawn(file, args, { env: childEnv, stdio: ['ignore', output, output] });
  if (logFormat === 'pretty') {
    printLines(child.stdout!, process.stdout);
    printLines(child.stderr!, process.stderr);
  }
  running.children.push({ name, process: child });
  child.on('exit', (code, signal) => {
    // One line per service and stop: the stack's test counts them (each exits once, with code 0).
    log(`${name} exited (code ${String(code)}, signal ${String(signal)})`);
    if (!stopping) {
      log(`${name} exited unexpectedly; stopping the stack`);
      void stop(1);
    }
  });
}

function printLines(from: Readable, to: Writable): void {
  createInterface({ input: from, crlfDelay: Infinity }).on('line', (line) => {
    to.write(`${prettyLogLine(line)}\n`);
  });
}

async function serviceReady(name: string, url: string): Promise<void> {
  try {
    await waitReady(url, { timeoutMs: 60_000, intervalMs: 200, cancelled: () => stopping });
  } catch (err) {
    throw new Error(`${name}: ${errorMessage(err)}`, { cause: err });
  }
  if (!stopping) log(`${name} is ready`);
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
          // 'close': exited, and its output (piped with LOG_FORMAT=pretty) all printed.
          child.once('close', () => {
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
// A closed terminal: stop as on Ctrl-C rather than die and leave the services running.
process.on('SIGHUP', () => void stop(0));
// start.ts holds our stdin (a pipe) open for as long as it lives: its end means the launcher is gone (even
// if it was killed outright), and a stack nobody can stop any more must not outlive it. Only for a pipe: a
// terminal or /dev/null says nothing about a launcher.
const stdin = fstatSync(0);
if (stdin.isFIFO() || stdin.isSocket()) {
  process.stdin.on('end', () => void stop(0));
  process.stdin.on('error', () => void stop(0));
  process.stdin.resume();
}

main().catch((err: unknown) => {
  if (err instanceof StackRunningError) {
    // Nothing was started, so nothing is stopped: the running stack is left exactly as it was.
    log(`${err.message} on ${dataDir}: stop it first (Ctrl-C in its terminal, or kill ${err.pid})`);
    process.exit(1);
  }
  log(`failed to start: ${errorMessage(err)}`);
  void stop(1);
});
