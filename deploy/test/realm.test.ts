import { demoUserSubs } from '@platform/enterprise-db';
import { checkRealmFile, realmExpectations, validateRealm } from '../src/validate/index.js';
import { breakText, readRepoFile, repoRoot } from './helpers.js';

const realm = readRepoFile('deploy/keycloak/platform-realm.json');
const messages = (text: string): string[] => validateRealm(text, realmExpectations).map((p) => p.message);

describe('Keycloak realm platform', () => {
  it('has the client, the role and audience mappers and the demo users the tests rely on', () => {
    expect(checkRealmFile(repoRoot)).toEqual([]);
    const parsed = JSON.parse(realm) as { users: { username: string; id: string }[] };
    expect(Object.fromEntries(parsed.users.map((u) => [u.username, u.id]))).toEqual(demoUserSubs);
  });

  it.each([
    [
      'the role claim value',
      '"claim.value": "enterprise_portal_role"',
      '"claim.value": "enterprise_portal"',
      /role claim value must be enterprise_portal_role/,
    ],
    ['the role claim name', '"claim.name": "role"', '"claim.name": "roles"', /must set claim "role"/],
    [
      'the audience mapper',
      '"protocolMapper": "oidc-audience-mapper"',
      '"protocolMapper": "oidc-usermodel-attribute-mapper"',
      /no audience mapper/,
    ],
    ['a demo user id', demoUserSubs.bob, '0b0a11ce-0000-4000-8000-000000000000', /user bob must have id/],
    [
      'the client id',
      '"clientId": "platform-enterprise-web"',
      '"clientId": "platform-web"',
      /client platform-enterprise-web is missing/,
    ],
    [
      'direct access grants',
      '"directAccessGrantsEnabled": true',
      '"directAccessGrantsEnabled": false',
      /direct access grants/,
    ],
    ['JSON syntax', /\}\s*$/, '', /not JSON/],
  ])('fails on a broken copy: %s', (_name, from, to, expected) => {
    expect(messages(breakText(realm, from, to)).join('\n')).toMatch(expected);
  });
});
