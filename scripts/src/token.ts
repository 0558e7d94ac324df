// `npm run token -- <alice|bob|carol|dave>`: prints a development access token for a seeded demo user (the portal's
// client); `npm run token -- <olga|oscar|vera>` one for a demo operations user (the operations client, which the
// device gateway's /api accepts: design §3.1). Signed with the local stack's development issuer keys
// (.data/dev-issuer-keys.json, created on first use).
import { demoUsers, openDevSigner, opsUsers } from '@platform/testkit';
import type { DemoUser, OpsUser } from '@platform/testkit';
import { dataDir, envPort, localPorts } from './lib/local.js';

const user = process.argv[2];
if (user === undefined || !(user in demoUsers || user in opsUsers)) {
  console.error(
    `usage: npm run token -- <${[...Object.keys(demoUsers), ...Object.keys(opsUsers)].join('|')}>`,
  );
  process.exit(2);
}
const port = envPort(process.env, 'LOCAL_ISSUER_PORT', localPorts.issuer);
const signer = await openDevSigner({
  keyStore: `${dataDir}/dev-issuer-keys.json`,
  issuerUrl: `http://127.0.0.1:${port}/realms/platform`,
});
// One hour: long enough to try the APIs by hand, short enough not to linger.
console.log(
  user in opsUsers
    ? await signer.opsToken(user as OpsUser, {}, { expiresInS: 3600 })
    : await signer.demoToken(user as DemoUser, {}, { expiresInS: 3600 }),
);
