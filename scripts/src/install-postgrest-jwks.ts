// `npm run postgrest:jwks [-- --wait 120 --interval 300]`: fetches the identity provider's JWKS
// (Keycloak: {OIDC_ISSUER_URL}/protocol/openid-connect/certs) and installs it, with the expected
// issuer and client, into enterprise.postgrest_settings; running PostgREST instances reload it
// (NOTIFY pgrst). PostgREST cannot fetch a JWKS URL itself (PostgREST issue #4137).
//   DATABASE_URL      the migration (owner) URL
//   OIDC_ISSUER_URL   default http://localhost:8180/realms/platform
//   OIDC_CLIENT_ID    default platform-enterprise-web
// --wait S      keep retrying for up to S seconds while the issuer is not reachable (compose start order)
// --interval S  stay running and re-install every S seconds (keys rotate in Keycloak); 0 = once
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { fetchJwks, installPostgrestAuth } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';

const { values } = parseArgs({
  options: { wait: { type: 'string', default: '0' }, interval: { type: 'string', default: '0' } },
});
const waitS = Number(values.wait);
const intervalS = Number(values.interval);
const databaseUrl = process.env.DATABASE_URL;
const issuer = process.env.OIDC_ISSUER_URL ?? 'http://localhost:8180/realms/platform';
const clientId = process.env.OIDC_CLIENT_ID ?? 'platform-enterprise-web';

async function installOnce(): Promise<void> {
  const deadline = Date.now() + waitS * 1000;
  for (;;) {
    try {
      const jwks = await fetchJwks(issuer);
      const db = createDb<unknown>(databaseUrl!, { max: 1, applicationName: 'postgrest-jwks-installer' });
      try {
        const changed = await installPostgrestAuth(db, { issuer, clientId, jwks });
        const kids = jwks.keys.map((k) => k.kid ?? '(no kid)').join(', ');
        console.log(
          `${changed ? 'installed' : 'unchanged'}: ${jwks.keys.length} key(s) [${kids}] for ${issuer}, client ${clientId}`,
        );
      } finally {
        await db.destroy();
      }
      return;
    } catch (err) {
      if (Date.now() >= deadline) throw err;
      console.error(`waiting for ${issuer}: ${err instanceof Error ? err.message : String(err)}`);
      await sleep(2000);
    }
  }
}

try {
  if (databaseUrl === undefined || databaseUrl === '') throw new Error('DATABASE_URL is required');
  if (!Number.isFinite(waitS) || waitS < 0 || !Number.isFinite(intervalS) || intervalS < 0) {
    throw new Error('--wait and --interval take seconds (>= 0)');
  }
  await installOnce();
  while (intervalS > 0) {
    await sleep(intervalS * 1000);
    try {
      await installOnce();
    } catch (err) {
      // Keep the installed keys and try again next round; PostgREST keeps serving meanwhile.
      console.error(`refresh failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
} catch (err) {
  console.error(`postgrest:jwks failed: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
