// What the review-39 attacks share: the logins that attack (a login with CONNECT only, the workflow's, PostgREST's
// authenticator as the anonymous role), the gateway's own login, and the waits and probes the tests measure with.
import { API_LOGIN, AUTHENTICATOR, PORTAL_ANON, devRolePasswords } from '@platform/enterprise-db';
import { createDb, migrateToLatest, type MigrationSet } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type pg from 'pg';
import { RawCoapClient, json } from './coap-client.js';
import { API_KEYS, loginUrl } from './gateway.js';
import { STRANGER_PASSWORD, type PlatformDatabase } from './platform-database.js';
import type { Replica } from './replicas.js';

export interface Attacker {
  name: string;
  connect: () => Promise<pg.Client>;
}

/** The stranger (created with `stranger: true`), the workflow's login and PostgREST's anonymous role, in turn. */
export function attackersOf(platform: () => PlatformDatabase): Attacker[] {
  return [
    { name: 'a login with CONNECT only', connect: () => connectStranger(platform()) },
    {
      name: "the workflow's login",
      connect: () => platform().connectAs(API_LOGIN, devRolePasswords.enterpriseApi),
    },
    {
      name: 'PostgREST’s authenticator as the anonymous role',
      connect: async () => {
        const c = await platform().connectAs(AUTHENTICATOR, devRolePasswords.authenticator);
        await c.query(`SET ROLE ${PORTAL_ANON}`);
        return c;
      },
    },
  ];
}

export const connectStranger = (platform: PlatformDatabase): Promise<pg.Client> =>
  platform.connectAs(platform.stranger, STRANGER_PASSWORD);

export const connectGatewayLogin = (platform: PlatformDatabase): Promise<pg.Client> =>
  platform.connectAs('device_gateway_login', new URL(loginUrl(platform.database.url)).password);

/** The settings document a fresh observer of `device` gets from `r` now. */
export async function documentServedBy(r: Replica, device: string): Promise<Record<string, unknown>> {
  const client = await RawCoapClient.observeSettings(r.coapPort, device);
  try {
    const first = client.inbox.find((x) => x.packet.code === '2.05')!;
    return json(first.packet);
  } finally {
    await client.close();
  }
}

/** The settings a fresh observer of `device` gets from `r` now. */
export async function servedBy(r: Replica, device: string): Promise<Record<string, unknown>> {
  return (await documentServedBy(r, device)).settings as Record<string, unknown>;
}

/** Polls `check` every 25 ms until it holds; fails naming `what` after `timeoutMs`. */
export async function until(check: () => Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** Resolves to `work`'s outcome, or 'pending' when it has not settled within `ms`. */
export async function within<T>(work: Promise<T>, ms: number): Promise<T | 'pending'> {
  let timer: NodeJS.Timeout | undefined;
  const result = await Promise.race([
    work,
    new Promise<'pending'>((r) => (timer = setTimeout(() => r('pending'), ms))),
  ]);
  clearTimeout(timer);
  return result;
}

/** `work`'s outcome, or `late` once `ms` have passed (the timer is cleared either way). */
export async function withinOr<T>(work: Promise<T>, ms: number, late: T): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([work, new Promise<T>((res) => (timer = setTimeout(() => res(late), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Whether `user` may log in to the platform's database with `password` now: `in`, or `refused: <why>`. */
export function loginOutcome(platform: PlatformDatabase, user: string, password: string): Promise<string> {
  return platform.connectAs(user, password).then(
    async (c) => {
      await c.end();
      return 'in';
    },
    (err: Error) => `refused: ${err.message}`,
  );
}

/** The migration Job's own handle (deploy/src/platform-database.ts: createDb(ownerUrl, { applicationName, max: 1 })). */
export const migrationJobDb = (platform: PlatformDatabase): Kysely<unknown> =>
  createDb<unknown>(platform.database.url, {
    applicationName: 'platform-migrate',
    max: 1,
    logger: { warn: () => undefined },
  });

/**
 * A run of the migrations on `db` (migrationJobDb) as the Job makes it, told as `finished in <n> ms` or
 * `failed in <n> ms: <message>`; never rejects, so a test can race it against a deadline (withinOr) and await it.
 */
export function jobRun(db: Kysely<unknown>, sets: readonly MigrationSet[]): Promise<string> {
  const t0 = Date.now();
  return migrateToLatest(db, sets).then(
    () => `finished in ${Date.now() - t0} ms`,
    (err: Error) => `failed in ${Date.now() - t0} ms: ${err.message}`,
  );
}

/** A POST with the first API key and a deadline: `status` 0 when no answer came within `ms`. */
export async function postWithin(
  r: Replica,
  path: string,
  body: unknown,
  ms: number,
): Promise<{ status: number; body: Record<string, unknown>; ms: number }> {
  const t0 = Date.now();
  try {
    const res = await fetch(`${r.url}${path}`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${API_KEYS[0]!}`, 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(ms),
    });
    const text = await res.text();
    return {
      status: res.status,
      body: text === '' ? {} : (JSON.parse(text) as Record<string, unknown>),
      ms: Date.now() - t0,
    };
  } catch {
    return { status: 0, body: {}, ms: Date.now() - t0 };
  }
}
