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
}

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
