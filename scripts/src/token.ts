// `npm run token -- <alice|bob|carol|dave>`: prints a development access token for a seeded demo user,
// signed with the local stack's development issuer keys (.data/dev-issuer-keys.json, created on first use).
import { demoUsers, openDevSigner } from '@platform/testkit';
import type { DemoUser } from '@platform/testkit';
import { dataDir, envPort, localPorts } from './lib/local.js';

const user = process.argv[2];
if (user === undefined || !(user in demoUsers)) {
  console.error(`usage: npm run token -- <${Object.keys(demoUsers).join('|')}>`);
  process.exit(2);
}
const port = envPort(process.env, 'LOCAL_ISSUER_PORT', localPorts.issuer);
const signer = await openDevSigner({
  keyStore: `${dataDir}/dev-issuer-keys.json`,
  issuerUrl: `http://127.0.0.1:${port}/realms/platform`,
});
// One hour: long enough to try the APIs by hand, short enough not to linger.
console.log(await signer.demoToken(user as DemoUser, {}, { expiresInS: 3600 }));
