import { demoUserSubs } from '@platform/enterprise-db';
import { OPERATIONS_CLIENT, opsUsers } from '@platform/testkit';
import { checkRealmFile, realmExpectations, validateRealm } from '../src/validate/index.js';
import { breakText, readRepoFile, repoRoot } from './helpers.js';

const realm = readRepoFile('deploy/keycloak/platform-realm.json');
const messages = (text: string): string[] => validateRealm(text, realmExpectations).map((p) => p.message);

describe('Keycloak realm platform', () => {
  it('has the client, the role and audience mappers and the demo users the tests rely on', () => {
    expect(checkRealmFile(repoRoot)).toEqual([]);
    const parsed = JSON.parse(realm) as { users: { username: string; id: string }[] };
    const opsSubs = Object.fromEntries(Object.values(opsUsers).map((u) => [u.username, u.sub]));
    expect(Object.fromEntries(parsed.users.map((u) => [u.username, u.id]))).toEqual({
      ...demoUserSubs,
      ...opsSubs,
    });
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

  describe('the fleet operations client (design §3.1)', () => {
    interface Realm {
      clients: Record<string, unknown>[];
      users: Record<string, unknown>[];
      roles: { client: Record<string, { name: string }[]> };
      components: Record<string, { config: Record<string, string[]> }[]>;
    }
    type Mapper = { protocolMapper: string; config: Record<string, string> };
    /** `realm` changed by `edit` (on its parsed form), as text. */
    const edited = (edit: (r: Realm, client: Record<string, unknown>) => void): string => {
      const r = JSON.parse(realm) as Realm;
      edit(
        r,
        r.clients.find((c) => c.clientId === OPERATIONS_CLIENT)!,
      );
      return JSON.stringify(r);
    };
    const mappersOf = (client: Record<string, unknown>) => client.protocolMappers as Mapper[];
    const profileOf = (r: Realm) => {
      const component = r.components['org.keycloak.userprofile.UserProfileProvider']![0]!;
      return {
        profile: JSON.parse(component.config['kc.user.profile.config']![0]!) as {
          attributes: { name: string; permissions: { edit: string[] } }[];
        },
        save: (p: unknown) => (component.config['kc.user.profile.config'] = [JSON.stringify(p)]),
      };
    };

    it("declares olga, oscar and vera as the test kit's operations users: role and scope", () => {
      const users = (JSON.parse(realm) as Realm).users;
      for (const ops of Object.values(opsUsers)) {
        const user = users.find((u) => u.username === ops.username)!;
        expect(user.id).toBe(ops.sub);
        expect(user.clientRoles).toEqual({ [OPERATIONS_CLIENT]: [ops.role] });
        const attributes = user.attributes as Record<string, string[] | undefined>;
        expect(attributes.fleet_sites ?? null).toEqual(ops.sites);
        expect(attributes.fleet_companies ?? null).toEqual(ops.companies);
      }
      // The portal's users get no fleet role.
      for (const name of Object.keys(demoUserSubs))
        expect(users.find((u) => u.username === name)!.clientRoles).toBeUndefined();
    });

    it.each<[string, (r: Realm, client: Record<string, unknown>) => void, RegExp]>([
      [
        'no PKCE',
        (_r, c) => delete (c.attributes as Record<string, string>)['pkce.code.challenge.method'],
        /PKCE with S256/,
      ],
      ['the password grant', (_r, c) => (c.directAccessGrantsEnabled = true), /RFC 9700 §2.4/],
      ['a confidential client', (_r, c) => (c.publicClient = false), /must be a public client/],
      ['the full scope', (_r, c) => (c.fullScopeAllowed = true), /full scope/],
      ['a wildcard redirect', (_r, c) => (c.redirectUris = ['http://localhost:3100/*']), /no wildcard/],
      [
        'roles written elsewhere',
        (_r, c) => {
          mappersOf(c).find((m) => m.protocolMapper === 'oidc-usermodel-client-role-mapper')!.config[
            'claim.name'
          ] = 'roles';
        },
        /resource_access\.platform-operations\.roles/,
      ],
      [
        'fleet_sites not mapped',
        (_r, c) =>
          (c.protocolMappers = mappersOf(c).filter((m) => m.config['user.attribute'] !== 'fleet_sites')),
        /writing fleet_sites/,
      ],
      [
        'fleet_companies as one string',
        (_r, c) => {
          mappersOf(c).find((m) => m.config['user.attribute'] === 'fleet_companies')!.config.multivalued =
            'false';
        },
        /writing fleet_companies/,
      ],
      [
        'no admin role',
        (r) => (r.roles.client[OPERATIONS_CLIENT] = [{ name: 'viewer' }, { name: 'operator' }]),
        /no client role admin/,
      ],
      [
        'a scope its user may edit',
        (r) => {
          const { profile, save } = profileOf(r);
          profile.attributes.find((a) => a.name === 'fleet_sites')!.permissions.edit = ['admin', 'user'];
          save(profile);
        },
        /fleet_sites multivalued and editable by admins only/,
      ],
      [
        'a scope the user profile does not declare',
        (r) => {
          const { profile, save } = profileOf(r);
          save({ ...profile, attributes: profile.attributes.filter((a) => a.name !== 'fleet_companies') });
        },
        /does not declare fleet_companies/,
      ],
      [
        'a user scoped to a site that is no uuid',
        (r) => {
          const oscar = r.users.find((u) => u.username === 'oscar')!;
          (oscar.attributes as Record<string, string[]>).fleet_sites = ['acme-hq'];
        },
        /user oscar: fleet_sites must be a list of lower-case uuids/,
      ],
      [
        'a user with a role the client does not have',
        (r) => (r.users.find((u) => u.username === 'vera')!.clientRoles = { [OPERATIONS_CLIENT]: ['owner'] }),
        /user vera: roles of platform-operations/,
      ],
      [
        'the client itself',
        (r) => (r.clients = r.clients.filter((c) => c.clientId !== OPERATIONS_CLIENT)),
        /client platform-operations is missing/,
      ],
    ])('fails on a broken copy: %s', (_name, edit, expected) => {
      expect(messages(edited(edit)).join('\n')).toMatch(expected);
    });
  });
});
