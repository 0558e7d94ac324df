import { execFile } from 'node:child_process';
import { userInfo } from 'node:os';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import request from 'supertest';
import type { AuditDatabase } from '../src/audit/table.js';
import { runDeviceKey } from '../src/cli/device-key-command.js';
import { deviceKeyConfig } from '../src/config.js';
import { API_KEYS, loginUrl, startGateway, type GatewayFixture } from './support/gateway.js';

// The command as `npm run device-key` runs it: the compiled entry point in a process of its own.
const cliJs = fileURLToPath(new URL('../dist/cli/device-key.js', import.meta.url));

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** The command in a process of its own, as `npm run device-key` runs it. */
function deviceKeyProcess(args: string[], env: Record<string, string | undefined>): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      process.execPath,
      [cliJs, ...args],
      // Only what the command needs: nothing of this process's environment leaks in (DATABASE_URL above all).
      { env: { PATH: process.env.PATH, ...env }, timeout: 30_000 },
      (err, stdout, stderr) => {
        if (err !== null && typeof err.code !== 'number') {
          reject(new Error(`device-key did not run: ${err.message}`));
          return;
        }
        resolve({ code: err === null ? 0 : (err.code as number), stdout, stderr });
      },
    );
    child.stdin?.end();
  });
}

/**
 * The command in this process: what the entry point runs (cli/device-key.ts is runDeviceKey with the
 * environment's configuration and the process's streams), without a Node start per call (about a second each on
 * a loaded machine; this file made 83). The process itself is run by the first test and the configuration test.
 */
async function deviceKey(args: string[], env: Record<string, string | undefined>): Promise<Run> {
  let stdout = '';
  let stderr = '';
  const code = await runDeviceKey(args, deviceKeyConfig({ PATH: process.env.PATH, ...env }), {
    out: (text) => (stdout += `${text}\n`),
    err: (text) => (stderr += `${text}\n`),
  });
  return { code, stdout, stderr };
}

/** The `key` and `identity` lines of `issue`'s text output. */
function issuedFrom(stdout: string): { identity: string; key: string; hex: string } {
  const field = (name: string): string => {
    const match = new RegExp(`^  ${name.replace(/[()]/g, '\\$&')}\\s+(\\S+)$`, 'm').exec(stdout);
    if (match === null) throw new Error(`no ${name} line in: ${stdout}`);
    return match[1]!;
  };
  return { identity: field('identity'), key: field('key'), hex: field('key (hex)') };
}

describe('npm run device-key (a real process against a real PostgreSQL)', () => {
  let gw: GatewayFixture;
  let env: Record<string, string>;
  const DEVICE = 'acme-hq-hvac-01';

  beforeAll(async () => {
    gw = await startGateway();
    env = { DATABASE_URL: gw.database.url };
  });

  afterAll(async () => {
    await gw.close();
  });

  it('issue prints identity and key once; after a reload the gateway accepts that key', async () => {
    const run = await deviceKeyProcess(['issue', DEVICE, '--valid-days', '30'], env);
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    const { identity, key, hex } = issuedFrom(run.stdout);
    expect(key).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(hex).toBe(Buffer.from(key, 'utf8').toString('hex'));
    expect(identity).not.toBe(DEVICE);
    expect(run.stdout).toContain(`-psk ${hex}`);

    expect(gw.app.registry.credentials.lookupPsk(identity)).toBeUndefined();
    await gw.app.service.reload();
    const credential = gw.app.registry.credentials.lookupPsk(identity);
    expect(credential?.deviceId).toBe(DEVICE);
    expect(credential?.key.equals(Buffer.from(key, 'utf8'))).toBe(true);
    const stored = await gw.owner
      .selectFrom('device_gateway.device_credentials')
      .select(['not_before', 'not_after'])
      .where('psk_identity', '=', identity)
      .executeTakeFirstOrThrow();
    const days = (stored.not_after!.getTime() - stored.not_before.getTime()) / 86_400_000;
    expect(days).toBeCloseTo(30, 5);
  });

  it('revoke makes the key invalid at the next reload; revoking again changes nothing', async () => {
    const issued = issuedFrom((await deviceKey(['issue', DEVICE], env)).stdout);
    await gw.app.service.reload();
    expect(gw.app.registry.credentials.lookupPsk(issued.identity)?.deviceId).toBe(DEVICE);

    const revoke = await deviceKey(['revoke', issued.identity], env);
    expect(revoke.code).toBe(0);
    expect(revoke.stdout).toContain(`revoked ${issued.identity}`);
    await gw.app.service.reload();
    expect(gw.app.registry.credentials.lookupPsk(issued.identity)).toBeUndefined();

    const again = await deviceKey(['revoke', issued.identity], env);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('already revoked');
  });

  it('revoke --device revokes every key of the device', async () => {
    const device = 'acme-hq-lobby-sensor-03';
    const a = issuedFrom((await deviceKey(['issue', device], env)).stdout);
    const b = issuedFrom((await deviceKey(['issue', device, '--no-expiry'], env)).stdout);
    const run = await deviceKey(['revoke', '--device', device], env);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain(`revoked ${a.identity}`);
    expect(run.stdout).toContain(`revoked ${b.identity}`);
    await gw.app.service.reload();
    expect(gw.app.registry.credentials.lookupPsk(a.identity)).toBeUndefined();
    expect(gw.app.registry.credentials.lookupPsk(b.identity)).toBeUndefined();
  });

  it('list shows identities and status, never key material', async () => {
    const issued = issuedFrom(
      (await deviceKey(['issue', DEVICE, '--identity', 'listed-identity-1'], env)).stdout,
    );
    expect(issued.identity).toBe('listed-identity-1');
    await deviceKey(['revoke', 'listed-identity-1'], env);
    const second = issuedFrom((await deviceKey(['issue', DEVICE], env)).stdout);
    for (const args of [['list'], ['list', DEVICE], ['list', DEVICE, '--json']]) {
      const run = await deviceKey(args, env);
      expect(run.code).toBe(0);
      expect(run.stdout).toContain('listed-identity-1');
      expect(run.stdout).toContain(second.identity);
      for (const form of [issued.key, issued.hex, second.key, second.hex])
        expect(run.stdout).not.toContain(form);
    }
    const rows = JSON.parse((await deviceKey(['list', DEVICE, '--json'], env)).stdout) as {
      identity: string;
      status: string;
    }[];
    expect(rows.find((r) => r.identity === 'listed-identity-1')?.status).toBe('revoked');
    expect(rows.find((r) => r.identity === second.identity)?.status).toBe('valid');
    expect(Object.keys(rows[0]!).sort()).toEqual(
      ['created_at', 'device_id', 'identity', 'not_after', 'not_before', 'revoked_at', 'status'].sort(),
    );
  });

  it('50 issues give 50 distinct identities and keys', async () => {
    const issued: { identity: string; key: string }[] = [];
    // Five processes at a time: the machine is shared.
    for (let round = 0; round < 10; round++) {
      const runs = await Promise.all(
        Array.from({ length: 5 }, () => deviceKey(['issue', DEVICE, '--json'], env)),
      );
      for (const run of runs) {
        expect(run.code).toBe(0);
        issued.push(JSON.parse(run.stdout) as { identity: string; key: string });
      }
    }
    expect(new Set(issued.map((i) => i.identity)).size).toBe(50);
    expect(new Set(issued.map((i) => i.key)).size).toBe(50);
    await gw.app.service.reload();
    for (const { identity, key } of issued)
      expect(gw.app.registry.credentials.lookupPsk(identity)?.key.toString('utf8')).toBe(key);
  });

  it.each([
    [['issue', 'no-such-device'], 1, /device no-such-device is not in the registry/],
    [['list', 'no-such-device'], 1, /device no-such-device is not in the registry/],
    [['revoke', 'no-such-identity'], 1, /no key has the identity no-such-identity/],
    [['revoke', '--device', 'no-such-device'], 1, /device no-such-device is not in the registry/],
    [['issue', DEVICE, '--identity', DEVICE], 1, /must differ from the device id/],
    [['issue', DEVICE, '--identity', 'has space'], 1, /printable ASCII/],
    [['issue', DEVICE, '--valid-days', '0'], 2, /--valid-days must be 1\.\.3650/],
    [['issue', DEVICE, '--valid-days', '1.5'], 2, /whole number/],
    [['issue', DEVICE, '--valid-days', '3', '--no-expiry'], 2, /exclude each other/],
    [['issue'], 2, /exactly one device id/],
    [['issue', DEVICE, '--bogus'], 2, /Unknown option '--bogus'/],
    [['rotate', DEVICE], 2, /unknown command "rotate"/],
    [['issue', DEVICE, '--by', 'has space'], 2, /--by takes a name/],
    [['revoke', '--device', DEVICE, '--by', ''], 2, /--by takes a name/],
    [[], 2, /no command given/],
  ])('%j exits %i with a clear message and no stack', async (args, code, message) => {
    const run = await deviceKey(args, env);
    expect(run.code).toBe(code);
    expect(run.stderr).toMatch(message);
    expect(run.stderr).not.toMatch(/\bat .*\.(js|ts):\d+/);
    expect(run.stdout).toBe('');
  });

  it('an identity already in use is refused', async () => {
    expect((await deviceKey(['issue', DEVICE, '--identity', 'taken-identity'], env)).code).toBe(0);
    const run = await deviceKey(['issue', DEVICE, '--identity', 'taken-identity'], env);
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/already in use/);
  });

  it("the gateway's read-only login cannot issue keys; the message says which login to use", async () => {
    const run = await deviceKey(['issue', DEVICE], { DATABASE_URL: loginUrl(gw.database.url) });
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/permission denied.*owner login/);
    expect(run.stdout).toBe('');
  });

  it('no DATABASE_URL, or an unreachable database, is a clear failure without the password', async () => {
    const missing = await deviceKeyProcess(['list', 'acme-hq-hvac-01'], {});
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/DATABASE_URL must be set/);
    // It names the URL the local stack's banner prints, ready to paste with the same arguments.
    expect(missing.stderr).toContain(
      'DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5433/platform npm run device-key -- list acme-hq-hvac-01',
    );
    const down = await deviceKeyProcess(['list'], {
      DATABASE_URL: 'postgres://someone:s3cret-pw@127.0.0.1:1/nowhere',
    });
    expect(down.code).toBe(1);
    expect(down.stderr).toMatch(/cannot reach the database/);
    expect(down.stderr).not.toContain('s3cret-pw');
  });

  describe('the audit of device keys (design §3.1, issue 42 §4)', () => {
    const AUDITED = 'acme-wh-freezer-02';
    /** The device-key rows of one device, oldest first. */
    const rowsOf = (deviceId: string) =>
      gw.owner
        .withTables<AuditDatabase>()
        .selectFrom('device_gateway.audit_events')
        .select(['principal', 'principal_kind', 'principal_name', 'role', 'action', 'site_ids', 'detail'])
        .where('device_id', '=', deviceId)
        .where('action', 'like', 'device_key.%')
        .orderBy('id')
        .execute();
    const siteOf = async (deviceId: string) =>
      (
        await gw.owner
          .selectFrom('device_gateway.device_registry')
          .select('site_id')
          .where('device_id', '=', deviceId)
          .executeTakeFirstOrThrow()
      ).site_id;

    it('issue and revoke write one row each, naming --by, the device, its site and the identities', async () => {
      const site = await siteOf(AUDITED);
      const before = (await rowsOf(AUDITED)).length;
      const issued = issuedFrom((await deviceKey(['issue', AUDITED, '--by', 'ops.ticket-42'], env)).stdout);
      expect((await deviceKey(['revoke', issued.identity, '--by', 'ops.ticket-42'], env)).code).toBe(0);
      // Revoked before: nothing changes, nothing is audited.
      expect((await deviceKey(['revoke', issued.identity, '--by', 'ops.ticket-42'], env)).code).toBe(0);
      const rows = (await rowsOf(AUDITED)).slice(before);
      const osUser = userInfo().username;
      const common = {
        principal: 'command:ops.ticket-42',
        principal_kind: 'command',
        principal_name: 'ops.ticket-42',
        role: 'admin',
        site_ids: [site],
      };
      expect(rows).toEqual([
        {
          ...common,
          action: 'device_key.issued',
          detail: { count: 1, identities: [issued.identity], os_user: osUser },
        },
        {
          ...common,
          action: 'device_key.revoked',
          detail: { count: 1, identities: [issued.identity], os_user: osUser },
        },
      ]);
      // The key never reaches the audit, in any form.
      const text = JSON.stringify(rows);
      expect(text).not.toContain(issued.key);
      expect(text).not.toContain(issued.hex);
      // GET /api/audit finds them by the command's principal.
      const listed = await request(gw.app.http)
        .get('/api/audit')
        .query({ principal: 'command:ops.ticket-42', device_id: AUDITED })
        .set('Authorization', `Bearer ${API_KEYS[0]}`);
      expect(listed.status).toBe(200);
      expect((listed.body as { items: { action: string }[] }).items.map((i) => i.action)).toEqual([
        'device_key.revoked',
        'device_key.issued',
      ]);
    });

    it('without --by the OS user is the principal; revoke --device is one row with every identity', async () => {
      const osUser = userInfo().username;
      const before = (await rowsOf(AUDITED)).length;
      const a = issuedFrom((await deviceKey(['issue', AUDITED], env)).stdout);
      const b = issuedFrom((await deviceKey(['issue', AUDITED], env)).stdout);
      expect((await deviceKey(['revoke', '--device', AUDITED], env)).code).toBe(0);
      const rows = (await rowsOf(AUDITED)).slice(before);
      expect(rows.map((r) => [r.principal, r.action])).toEqual([
        [`command:${osUser}`, 'device_key.issued'],
        [`command:${osUser}`, 'device_key.issued'],
        [`command:${osUser}`, 'device_key.revoked'],
      ]);
      // The OS user is the principal: it is not repeated in the detail.
      expect(rows[2]!.detail).toEqual({ count: 2, identities: [a.identity, b.identity].sort() });
    });

    it('under sudo the user who ran sudo (SUDO_USER) is the principal', async () => {
      const before = (await rowsOf(AUDITED)).length;
      expect((await deviceKey(['issue', AUDITED], { ...env, SUDO_USER: 'olga' })).code).toBe(0);
      const rows = (await rowsOf(AUDITED)).slice(before);
      expect(rows.map((r) => r.principal)).toEqual(['command:olga']);
    });

    it('a refused change writes no row; a row that cannot be written undoes the change', async () => {
      const before = (await rowsOf(AUDITED)).length;
      expect((await deviceKey(['issue', AUDITED, '--by', 'bad name'], env)).code).toBe(2);
      expect((await deviceKey(['issue', AUDITED, '--identity', AUDITED], env)).code).toBe(1);
      expect(await rowsOf(AUDITED)).toHaveLength(before);

      const keysBefore = await gw.owner
        .selectFrom('device_gateway.device_credentials')
        .select((eb) => eb.fn.countAll<string>().as('n'))
        .where('device_id', '=', AUDITED)
        .executeTakeFirstOrThrow();
      // The database refuses this principal's audit rows (a trigger of this test only): the key must not stay.
      await sql
        .raw(
          `CREATE FUNCTION device_gateway.refuse_test_audit() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.principal = 'command:audit-refused' THEN RAISE EXCEPTION 'audit refused by the test'; END IF;
             RETURN NEW;
           END $$;
           CREATE TRIGGER refuse_test_audit BEFORE INSERT ON device_gateway.audit_events
           FOR EACH ROW EXECUTE FUNCTION device_gateway.refuse_test_audit();`,
        )
        .execute(gw.owner);
      try {
        const run = await deviceKey(['issue', AUDITED, '--by', 'audit-refused'], env);
        expect(run.code).toBe(1);
        expect(run.stdout).toBe('');
        const issued = await deviceKey(['issue', AUDITED, '--by', 'someone-else', '--json'], env);
        const { identity } = JSON.parse(issued.stdout) as { identity: string };
        const revoke = await deviceKey(['revoke', identity, '--by', 'audit-refused'], env);
        expect(revoke.code).toBe(1);
        const listed = JSON.parse((await deviceKey(['list', AUDITED, '--json'], env)).stdout) as {
          identity: string;
          status: string;
        }[];
        expect(listed.find((r) => r.identity === identity)?.status).toBe('valid');
        const keysAfter = await gw.owner
          .selectFrom('device_gateway.device_credentials')
          .select((eb) => eb.fn.countAll<string>().as('n'))
          .where('device_id', '=', AUDITED)
          .executeTakeFirstOrThrow();
        expect(Number(keysAfter.n)).toBe(Number(keysBefore.n) + 1);
      } finally {
        await sql
          .raw(
            `DROP TRIGGER refuse_test_audit ON device_gateway.audit_events;
             DROP FUNCTION device_gateway.refuse_test_audit();`,
          )
          .execute(gw.owner);
      }
    });
  });
});
