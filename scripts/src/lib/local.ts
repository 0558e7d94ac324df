// Defaults of the local development stack (design §5): fixed ports a developer can remember, data under
// the git-ignored `.data/`, development secrets that are printed in the banner. Nothing here is used
// by a deployed service: they read their own environment (services/*/src/config.ts).
import { fileURLToPath } from 'node:url';

export const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
/** Where the local stack keeps its data; `PLATFORM_DATA_DIR` moves it (the stack's own test does). */
export const dataDir = process.env.PLATFORM_DATA_DIR ?? `${repoRoot}.data`;

export const localPorts = {
  postgres: 5433,
  gatewayHttp: 8080,
  gatewayCoap: 5683,
  gatewayCoaps: 5684,
  workflow: 3800,
  postgrest: 3850,
  s3: 9000,
  issuer: 8180,
} as const;

export const devSecrets = {
  gatewayApiKey: 'dev-gateway-key',
  webhookToken: 'dev-webhook-token',
} as const;

/** Reads an integer port from the environment, falling back to the local default. */
export function envPort(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const port = Number(raw);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`${name} must be a TCP/UDP port`);
  return port;
}
