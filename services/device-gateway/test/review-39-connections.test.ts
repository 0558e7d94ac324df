// Issue 39, the second attack on the database roles: any login of the cluster could open connections until
// max_connections and lock the gateway's login out (a starting replica never became ready). Since gateway
// migration 0022 the gateway's login may use the cluster's reserved connections, and since enterprise migration
// 0014 the enterprise side's logins have CONNECTION LIMITs; the gateway says at start when the reserve is missing.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb } from '@platform/service-kit';
import { devRolePasswords } from '@platform/enterprise-db';
import { createTestDatabase } from '@platform/testkit';
import type pg from 'pg';
import {
  connectionReserveGap,
  lockTableGap,
  preparedTransactionsGap,
  readConnectionReserve,
} from '../src/db/connection-reserve.js';
import { DEV_GATEWAY_LOGIN_PASSWORD, GATEWAY_LOGIN_ROLE, gatewayLoginUrl } from '../src/db/migrations.js';
import {
  NOBODY_PASSWORD,
  startPlatformDatabase,
  type PlatformDatabase,
} from './support/platform-database.js';

jest.setTimeout(120_000);

describe('connection slots the gateway keeps (issue 39)', () => {
  let platform: PlatformDatabase;

  beforeAll(async () => {
    // 45 slots: 3 for superusers (the default superuser_reserved_connections), 5 reserved, 37 for anyone.
    platform = await startPlatformDatabase({ nobody: true, connections: { max: 45, reserved: 5 } });
  });
  afterAll(async () => {
    await platform?.close();
  });

  /** Opens sessions as `user` on `base` until PostgreSQL refuses one (at most `most`); their count and the refusal. */
  async function openUntilRefused(
    user: string,
    password: string,
    base: string,
    most: number,
  ): Promise<{ clients: pg.Client[]; refusal: string }> {
    const clients: pg.Client[] = [];
    for (let i = 0; i < most; i++) {
      try {
        clients.push(await platform.connectAs(user, password, base));
      } catch (err) {
        return { clients, refusal: (err as Error).message };
      }
    }
    return { clients, refusal: '' };
  }

  it("a login of no standing that takes every ordinary slot does not lock the gateway's login out", async () => {
    // `nobody` has no grant at all; the cluster's `postgres` database keeps PostgreSQL's default (PUBLIC CONNECT).
    const taken = await openUntilRefused(platform.nobody, NOBODY_PASSWORD, platform.server.url, 60);
    try {
      expect(taken.clients.length).toBeGreaterThan(30);
      expect(taken.refusal).toMatch(/reserved/);
      const gateway = createDb<unknown>(gatewayLoginUrl(platform.database.url), {
        max: 3,
        logger: { warn: () => undefined },
      });
      try {
        // Three sessions of the gateway's login at once, all in reserved slots.
        const reserves = await Promise.all([1, 2, 3].map(() => readConnectionReserve(gateway)));
        for (const reserve of reserves) {
          expect(reserve).toMatchObject({ reserved: 5, member: true });
          expect(connectionReserveGap(reserve)).toBeUndefined();
          // 0031 (run as a superuser here) left PUBLIC nothing that fills the lock table.
          expect(lockTableGap(reserve)).toBeUndefined();
        }
      } finally {
        await gateway.destroy();
      }
    } finally {
      await Promise.all(taken.clients.map((c) => c.end()));
    }
  });

  it("the workflow's and PostgREST's logins stop at their connection limit", async () => {
    for (const [login, password] of [
      ['enterprise_api_login', devRolePasswords.enterpriseApi],
      ['authenticator', devRolePasswords.authenticator],
    ] as const) {
      const taken = await openUntilRefused(login, password, platform.database.url, 40);
      try {
        expect(taken.clients).toHaveLength(30);
        expect(taken.refusal).toMatch(/too many connections for role/);
      } finally {
        await Promise.all(taken.clients.map((c) => c.end()));
      }
    }
  });

  it('says what is missing where the cluster keeps no reserve', async () => {
    // The suite's shared cluster runs with PostgreSQL's default, reserved_connections = 0.
    const database = await createTestDatabase();
    const db = createDb<unknown>(database.url, { max: 1 });
    try {
      const reserve = await readConnectionReserve(db);
      expect(reserve.reserved).toBe(0);
      expect(reserve.openToPublic).toEqual(expect.arrayContaining(['postgres', database.name]));
      expect(connectionReserveGap(reserve)).toBe('reserved_connections is 0');
      // This cluster's databases give PUBLIC CONNECT only (=c), not TEMP, so TEMP is not named here.
      expect(lockTableGap(reserve)).toBe(
        'PUBLIC still has EXECUTE on nextval, EXECUTE on pg_advisory_lock, EXECUTE on pg_get_object_address, ' +
          'EXECUTE on lo_from_bytea, EXECUTE on pg_logical_emit_message',
      );
      expect(reserve.roleSettings).toEqual([]);
      expect({ prepared: reserve.preparedTransactions, gap: preparedTransactionsGap(reserve) }).toEqual({
        prepared: 0,
        gap: undefined,
      });
    } finally {
      await db.destroy();
      await database.drop();
    }
    expect(
      connectionReserveGap({
        reserved: undefined,
        member: false,
        openToPublic: [],
        lockRightsOfPublic: [],
        roleSettings: [],
        tempFileLimit: '1048576',
        preparedTransactions: 0,
      }),
    ).toBe('PostgreSQL before 16 has no reserved_connections');
    expect(
      connectionReserveGap({
        reserved: 5,
        member: false,
        openToPublic: [],
        lockRightsOfPublic: [],
        roleSettings: [],
        tempFileLimit: '1048576',
        preparedTransactions: 0,
      }),
    ).toBe('the login lacks the privileges of pg_use_reserved_connections');
    expect(GATEWAY_LOGIN_ROLE).toBe('device_gateway_login');
    expect(DEV_GATEWAY_LOGIN_PASSWORD).not.toBe('');
  });
});
