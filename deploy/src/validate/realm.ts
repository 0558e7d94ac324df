// The Keycloak realm import (deploy/keycloak/platform-realm.json): what the services and tests rely on.
import type { Problem } from './problems.js';
import { isRecord } from './yaml.js';

export interface RealmExpectations {
  realm: string;
  clientId: string;
  /** role claim value PostgREST switches to (design §4.1). */
  roleClaim: string;
  /** username → `sub` (Keycloak user id) that the enterprise seed's access map is keyed by. */
  users: Record<string, string>;
  /** The fleet operations client whose tokens the device gateway accepts (design §3.1). */
  operations: OperationsClientExpectations;
}

export interface OperationsClientExpectations {
  clientId: string;
  /** Its client roles, which the gateway reads from `resource_access.<clientId>.roles`. */
  roles: readonly string[];
  /** User attributes mapped to claims of the same name, arrays of uuids (the fleet scope). */
  scopeClaims: readonly string[];
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const USER_PROFILE = 'org.keycloak.userprofile.UserProfileProvider';

function asList(v: unknown): Record<string, unknown>[] {
  return Array.isArray(v) ? v.filter(isRecord) : [];
}

export function validateRealm(
  text: string,
  expect: RealmExpectations,
  file = 'platform-realm.json',
): Problem[] {
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file, message });
  };
  let realm: unknown;
  try {
    realm = JSON.parse(text);
  } catch (err) {
    add(`not JSON: ${(err as Error).message}`);
    return problems;
  }
  if (!isRecord(realm)) {
    add('not a JSON object');
    return problems;
  }
  if (realm.realm !== expect.realm) add(`realm must be "${expect.realm}"`);
  if (realm.enabled !== true) add('realm must be enabled');

  const client = asList(realm.clients).find((c) => c.clientId === expect.clientId);
  if (client === undefined) add(`client ${expect.clientId} is missing`);
  else {
    if (client.publicClient !== true) add(`${expect.clientId} must be a public client`);
    if (client.standardFlowEnabled !== true) add(`${expect.clientId} must enable the standard flow`);
    if (client.directAccessGrantsEnabled !== true)
      add(`${expect.clientId} must enable direct access grants (dev tokens)`);
    if (client.implicitFlowEnabled === true) add(`${expect.clientId} must not enable the implicit flow`);
    if (client.enabled === false) add(`${expect.clientId} is disabled`);
    const mappers = asList(client.protocolMappers);
    const role = mappers.find((m) => m.protocolMapper === 'oidc-hardcoded-claim-mapper');
    const roleConfig = isRecord(role?.config) ? role.config : {};
    if (role === undefined) add('no hardcoded-claim mapper for the role claim');
    else {
      if (roleConfig['claim.name'] !== 'role') add('the hardcoded-claim mapper must set claim "role"');
      if (roleConfig['claim.value'] !== expect.roleClaim)
        add(`the role claim value must be ${expect.roleClaim}`);
      if (roleConfig['access.token.claim'] !== 'true') add('the role claim must be in the access token');
      if (roleConfig['jsonType.label'] !== 'String') add('the role claim must be a String');
    }
    const aud = mappers.find((m) => m.protocolMapper === 'oidc-audience-mapper');
    const audConfig = isRecord(aud?.config) ? aud.config : {};
    if (aud === undefined) add('no audience mapper (PostgREST jwt-aud needs aud to contain the client id)');
    else {
      if (audConfig['included.client.audience'] !== expect.clientId)
        add(`the audience mapper must include ${expect.clientId}`);
      if (audConfig['access.token.claim'] !== 'true') add('the audience must be in the access token');
    }
  }

  validateOperationsClient(realm, expect.operations, add);

  const users = asList(realm.users);
  for (const [username, sub] of Object.entries(expect.users)) {
    const user = users.find((u) => u.username === username);
    if (user === undefined) add(`demo user ${username} is missing`);
    else {
      if (user.id !== sub)
        add(`user ${username} must have id ${sub} (its token sub, the seed's access map key)`);
      if (user.enabled !== true) add(`user ${username} must be enabled`);
      if (!asList(user.credentials).some((c) => c.type === 'password'))
        add(`user ${username} has no password`);
    }
  }
  return problems;
}

/** The config of the realm's user profile (Keycloak 24+: declarative, a JSON text in a component), or undefined. */
function userProfile(realm: Record<string, unknown>): Record<string, unknown> | undefined {
  const components = isRecord(realm.components) ? realm.components : {};
  const config = asList(components[USER_PROFILE])[0]?.config;
  const text = isRecord(config) ? config['kc.user.profile.config'] : undefined;
  const first: unknown = Array.isArray(text) ? text[0] : undefined;
  if (typeof first !== 'string') return undefined;
  try {
    const parsed: unknown = JSON.parse(first);
    return isRecord(parsed) ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The fleet operations client (design §3.1, issue 42 §5): a public client for a browser console (authorization
 * code with PKCE S256 only, exact redirect URIs: RFC 9700 §2.1, §4.1.3; no password grant: §2.4), its roles, and
 * mappers that write the role and the scope exactly where the device gateway reads them. The scope attributes
 * must be declared in the user profile as editable by admins only: a user who could clear their own
 * `fleet_sites` would widen their scope to the whole fleet.
 */
function validateOperationsClient(
  realm: Record<string, unknown>,
  expect: OperationsClientExpectations,
  add: (message: string) => void,
): void {
  const id = expect.clientId;
  const client = asList(realm.clients).find((c) => c.clientId === id);
  if (client === undefined) {
    add(`client ${id} is missing`);
    return;
  }
  if (client.enabled === false) add(`${id} is disabled`);
  if (client.publicClient !== true) add(`${id} must be a public client (a browser console holds no secret)`);
  if (client.standardFlowEnabled !== true) add(`${id} must enable the standard flow (authorization code)`);
  if (client.implicitFlowEnabled === true) add(`${id} must not enable the implicit flow`);
  if (client.directAccessGrantsEnabled !== false)
    add(`${id} must not enable direct access grants (the password grant, RFC 9700 §2.4)`);
  if (client.fullScopeAllowed !== false)
    add(`${id} must not allow the full scope (its tokens carry its own roles only)`);
  const attributes = isRecord(client.attributes) ? client.attributes : {};
  if (attributes['pkce.code.challenge.method'] !== 'S256') add(`${id} must require PKCE with S256`);
  const redirects: unknown[] = Array.isArray(client.redirectUris) ? client.redirectUris : [];
  if (redirects.length === 0) add(`${id} needs its redirect URIs`);
  for (const uri of redirects)
    if (typeof uri !== 'string' || uri.includes('*') || !/^https?:\/\/[^/]+\/./.test(uri))
      add(`${id}: redirect URI ${JSON.stringify(uri)} must be an exact URL with a path (no wildcard)`);

  const mappers = asList(client.protocolMappers);
  const configOf = (m: Record<string, unknown> | undefined) => (isRecord(m?.config) ? m.config : {});
  const aud = mappers.find((m) => m.protocolMapper === 'oidc-audience-mapper');
  if (configOf(aud)['included.client.audience'] !== id || configOf(aud)['access.token.claim'] !== 'true')
    add(`${id} needs an audience mapper putting ${id} into the access token's aud`);
  const roles = configOf(mappers.find((m) => m.protocolMapper === 'oidc-usermodel-client-role-mapper'));
  if (
    roles['usermodel.clientRoleMapping.clientId'] !== id ||
    roles['claim.name'] !== 'resource_access.${client_id}.roles' ||
    roles.multivalued !== 'true' ||
    roles['access.token.claim'] !== 'true'
  )
    add(`${id} needs a client-role mapper writing its roles to resource_access.${id}.roles (multivalued)`);
  for (const claim of expect.scopeClaims) {
    const mapper = configOf(
      mappers.find(
        (m) =>
          m.protocolMapper === 'oidc-usermodel-attribute-mapper' && configOf(m)['user.attribute'] === claim,
      ),
    );
    if (
      mapper['claim.name'] !== claim ||
      mapper.multivalued !== 'true' ||
      mapper['jsonType.label'] !== 'String' ||
      mapper['access.token.claim'] !== 'true'
    )
      add(
        `${id} needs a user-attribute mapper writing ${claim} to the access token's ${claim} (multivalued strings)`,
      );
  }

  const realmRoles = isRecord(realm.roles) && isRecord(realm.roles.client) ? realm.roles.client : {};
  const defined = asList(realmRoles[id]).map((r) => r.name);
  for (const role of expect.roles) if (!defined.includes(role)) add(`${id} has no client role ${role}`);

  const profile = userProfile(realm);
  const declared = asList(profile?.attributes);
  for (const claim of expect.scopeClaims) {
    const attribute = declared.find((a) => a.name === claim);
    const permissions = isRecord(attribute?.permissions) ? attribute.permissions : {};
    const edit: unknown[] = Array.isArray(permissions.edit) ? permissions.edit : [];
    if (attribute === undefined) add(`the user profile does not declare ${claim}`);
    else if (attribute.multivalued !== true || edit.length !== 1 || edit[0] !== 'admin')
      add(`the user profile must declare ${claim} multivalued and editable by admins only`);
  }

  for (const user of asList(realm.users)) {
    const clientRoles = isRecord(user.clientRoles) ? user.clientRoles[id] : undefined;
    if (clientRoles === undefined) continue;
    const name = String(user.username);
    if (!Array.isArray(clientRoles) || !clientRoles.every((r) => expect.roles.includes(r as string)))
      add(`user ${name}: roles of ${id} must be among ${expect.roles.join(', ')}`);
    const attrs = isRecord(user.attributes) ? user.attributes : {};
    for (const claim of expect.scopeClaims) {
      const values = attrs[claim];
      if (values === undefined) continue;
      if (
        !Array.isArray(values) ||
        values.length === 0 ||
        !values.every((v) => typeof v === 'string' && UUID.test(v))
      )
        add(`user ${name}: ${claim} must be a list of lower-case uuids`);
    }
  }
}
