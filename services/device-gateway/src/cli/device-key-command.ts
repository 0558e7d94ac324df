// `npm run device-key -- issue|revoke|list …`: the operator command for device keys (design §3.5).
// Kept apart from its entry point (device-key.ts) so the argument handling and messages are one function of
// (arguments, environment, output streams) → exit code.
import { parseArgs } from 'node:util';
import { createDb, errorMessage, isConnectionError, redactString, sqlState } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import { audit } from '../audit/writer.js';
import { COMMAND_OPERATOR_PATTERN, commandPrincipal, type Principal } from '../auth/principal.js';
import {
  CredentialCommandError,
  deviceExists,
  issueCredential,
  listCredentials,
  MAX_VALID_DAYS,
  revokeDevice,
  revokeIdentity,
  type CredentialListing,
  type IssuedCredential,
  type IssueOptions,
  type RevokeResult,
} from '../db/credential-repository.js';
import type { GatewayDatabase } from '../db/tables.js';
import type { DeviceKeyConfig } from '../config.js';

/** Exit codes: 0 done, 1 refused or failed (unknown device, database error), 2 wrong usage. */
export const EXIT_OK = 0;
export const EXIT_FAILED = 1;
export const EXIT_USAGE = 2;

/**
 * The owner URL of `npm start`'s embedded PostgreSQL on its default port (LOCAL_POSTGRES_PORT, 5433), as the
 * stack's banner prints it after "PostgreSQL". Named when DATABASE_URL is missing, since the local stack is
 * where a developer meets this command first; a development default (its password is `postgres`), never a
 * deployment's. scripts/test/stack.test.ts checks it against the banner.
 */
export const LOCAL_STACK_DATABASE_URL = 'postgres://postgres:postgres@127.0.0.1:5433/platform';

/** Validity of an issued key when `--valid-days` is not given, in days. */
export const DEFAULT_VALID_DAYS = 365;

export const USAGE = `usage:
  npm run device-key -- issue <device_id> [--valid-days N | --no-expiry] [--identity NAME] [--by NAME] [--json]
  npm run device-key -- revoke <identity> [--by NAME]
  npm run device-key -- revoke --device <device_id> [--by NAME]
  npm run device-key -- list [device_id] [--json]

DATABASE_URL: a login that may write device_gateway.device_credentials (the owner that runs migrations).
issue prints the new key once; it cannot be read back. --valid-days defaults to ${DEFAULT_VALID_DAYS} (1..${MAX_VALID_DAYS}).
Every issue and revoke is audited (GET /api/audit) as command:<NAME>: --by, else the OS user (under sudo, SUDO_USER);
NAME is 1-100 of A-Z a-z 0-9 . _ @ -.
Changes reach a running gateway at its next registry reload (POST /api/reload-registry).`;

export interface CommandIo {
  out: (text: string) => void;
  err: (text: string) => void;
}

class UsageError extends Error {}

/** Characters a POSIX shell takes literally; anything else is single-quoted in the printed examples. */
function shellWord(value: string): string {
  return /^[A-Za-z0-9._:@%+=/-]+$/.test(value) ? value : `'${value.replaceAll("'", `'\\''`)}'`;
}

function iso(date: Date | null): string {
  return date === null ? '-' : date.toISOString();
}

function parseValidDays(text: string): number {
  if (!/^[0-9]+$/.test(text)) throw new UsageError('--valid-days takes a whole number of days');
  const days = Number(text);
  if (days < 1 || days > MAX_VALID_DAYS)
    throw new UsageError(
      `--valid-days must be 1..${MAX_VALID_DAYS} (use --no-expiry for a key that never expires)`,
    );
  return days;
}

function printIssued(io: CommandIo, issued: IssuedCredential, json: boolean): void {
  const hex = Buffer.from(issued.keyText, 'utf8').toString('hex');
  if (json) {
    io.out(
      JSON.stringify({
        identity: issued.identity,
        key: issued.keyText,
        key_hex: hex,
        device_id: issued.deviceId,
        not_before: issued.notBefore.toISOString(),
        not_after: issued.notAfter === null ? null : issued.notAfter.toISOString(),
      }),
    );
    return;
  }
  const id = shellWord(issued.identity);
  io.out(
    [
      `Key issued for device ${issued.deviceId}. It is shown only now: store it on the device.`,
      `  identity    ${issued.identity}`,
      `  key         ${issued.keyText}`,
      `  key (hex)   ${hex}`,
      `  valid from  ${iso(issued.notBefore)}`,
      `  valid until ${issued.notAfter === null ? 'no expiry' : iso(issued.notAfter)}`,
      '',
      'The key is the text above (its bytes are the PSK); tools that take hex get the hex line:',
      `  coap-client-openssl -u ${id} -k ${issued.keyText} coaps://GATEWAY/devices/${issued.deviceId}/settings`,
      `  openssl s_client -dtls1_2 -connect GATEWAY:5684 -psk_identity ${id} -psk ${hex} -cipher PSK-AES128-CCM8`,
      'A running gateway accepts it after its next registry reload (POST /api/reload-registry).',
    ].join('\n'),
  );
}

function printRevoked(io: CommandIo, result: RevokeResult, what: string): void {
  for (const identity of result.revoked) io.out(`revoked ${identity}`);
  for (const identity of result.alreadyRevoked) io.out(`${identity} was already revoked`);
  if (result.revoked.length === 0 && result.alreadyRevoked.length === 0)
    io.out(`${what} has no key to revoke`);
  if (result.revoked.length > 0)
    io.out(
      'A running gateway refuses it and ends its sessions at its next registry reload (POST /api/reload-registry).',
    );
}

function printList(io: CommandIo, rows: CredentialListing[], json: boolean): void {
  if (json) {
    io.out(
      JSON.stringify(
        rows.map((r) => ({
          identity: r.identity,
          device_id: r.deviceId,
          status: r.status,
          not_before: r.notBefore.toISOString(),
          not_after: r.notAfter === null ? null : r.notAfter.toISOString(),
          revoked_at: r.revokedAt === null ? null : r.revokedAt.toISOString(),
          created_at: r.createdAt.toISOString(),
        })),
      ),
    );
    return;
  }
  const header = ['IDENTITY', 'DEVICE', 'STATUS', 'NOT_BEFORE', 'NOT_AFTER', 'REVOKED_AT'];
  const table = [
    header,
    ...rows.map((r) => [
      r.identity,
      r.deviceId,
      r.status,
      iso(r.notBefore),
      iso(r.notAfter),
      iso(r.revokedAt),
    ]),
  ];
  const widths = header.map((_, i) => Math.max(...table.map((row) => row[i]!.length)));
  io.out(
    table
      .map((row) =>
        row
          .map((cell, i) => cell.padEnd(widths[i]!))
          .join('  ')
          .trimEnd(),
      )
      .join('\n'),
  );
}

/**
 * Who the audit names for a change (design §3.1): `--by` if given (the person or ticket the operator acts for),
 * else the OS user. The OS user is kept in the row's detail when `--by` names someone else, since anyone with
 * the owner login can write any `--by`.
 */
function operatorOf(
  by: string | undefined,
  osUser: string | undefined,
): { principal: Principal; osUser?: string } {
  if (by !== undefined) {
    if (!COMMAND_OPERATOR_PATTERN.test(by))
      throw new UsageError('--by takes a name of 1-100 characters of A-Z a-z 0-9 . _ @ -');
    return {
      principal: commandPrincipal(by),
      ...(osUser === undefined || osUser === by ? {} : { osUser }),
    };
  }
  if (osUser === undefined || !COMMAND_OPERATOR_PATTERN.test(osUser))
    throw new UsageError(
      'the OS user cannot name who made this change in the audit: give --by NAME (1-100 of A-Z a-z 0-9 . _ @ -)',
    );
  return { principal: commandPrincipal(osUser) };
}

/**
 * Issues a device key with its audit row (`device_key.issued`, issue 42 §4): both commit together, or neither
 * does. The command's `issue`, and the local stack's development key (scripts' dev-device-key).
 */
export async function issueAudited(
  db: Kysely<GatewayDatabase>,
  deviceId: string,
  options: IssueOptions,
  operator: { principal: Principal; osUser?: string },
): Promise<IssuedCredential> {
  return db.transaction().execute(async (trx) => {
    const created = await issueCredential(trx, deviceId, options);
    await auditKeys(trx, operator, 'issued', { ...created, identities: [created.identity] });
    return created;
  });
}

/** The row of a key change (`device_key.issued|revoked`), in the change's transaction. */
function auditKeys(
  trx: Kysely<GatewayDatabase>,
  operator: { principal: Principal; osUser?: string },
  change: 'issued' | 'revoked',
  what: { deviceId: string; siteId: string | undefined; identities: readonly string[] },
): Promise<void> {
  return audit.deviceKeyChanged(
    trx,
    { principal: operator.principal },
    {
      deviceId: what.deviceId,
      siteId: what.siteId,
      change,
      identities: what.identities,
      ...(operator.osUser === undefined ? {} : { osUser: operator.osUser }),
    },
  );
}

async function run(
  db: Kysely<GatewayDatabase>,
  argv: readonly string[],
  config: DeviceKeyConfig,
  io: CommandIo,
): Promise<number> {
  const { values, positionals } = parseArgs({
    args: [...argv],
    allowPositionals: true,
    strict: true,
    options: {
      'valid-days': { type: 'string' },
      'no-expiry': { type: 'boolean' },
      identity: { type: 'string' },
      device: { type: 'string' },
      by: { type: 'string' },
      json: { type: 'boolean' },
    },
  });
  const [command, ...rest] = positionals;
  const json = values.json === true;
  switch (command) {
    case 'issue': {
      if (rest.length !== 1 || values.device !== undefined)
        throw new UsageError('issue takes exactly one device id');
      if (values['valid-days'] !== undefined && values['no-expiry'] === true)
        throw new UsageError('--valid-days and --no-expiry exclude each other');
      const validDays =
        values['no-expiry'] === true
          ? undefined
          : values['valid-days'] === undefined
            ? DEFAULT_VALID_DAYS
            : parseValidDays(values['valid-days']);
      const issued = await issueAudited(
        db,
        rest[0]!,
        { validDays, identity: values.identity },
        operatorOf(values.by, config.osUser),
      );
      printIssued(io, issued, json);
      if (!issued.deviceEnabled)
        io.err(`note: device ${issued.deviceId} is disabled; its keys work only once it is enabled again`);
      return EXIT_OK;
    }
    case 'revoke': {
      if (values.identity !== undefined || values['valid-days'] !== undefined || values['no-expiry'] === true)
        throw new UsageError('revoke takes an identity or --device <device_id>');
      const device = values.device;
      if (device !== undefined && rest.length !== 0)
        throw new UsageError('revoke takes an identity or --device <device_id>, not both');
      if (device === undefined && rest.length !== 1)
        throw new UsageError('revoke takes exactly one identity (or --device <device_id>)');
      const operator = operatorOf(values.by, config.osUser);
      const result = await db.transaction().execute(async (trx) => {
        const revoked =
          device === undefined ? await revokeIdentity(trx, rest[0]!) : await revokeDevice(trx, device);
        // Only a change is audited: a key revoked before, or a device without keys, changes nothing.
        if (revoked.revoked.length > 0)
          await auditKeys(trx, operator, 'revoked', { ...revoked, identities: revoked.revoked });
        return revoked;
      });
      printRevoked(io, result, device === undefined ? rest[0]! : `device ${device}`);
      return EXIT_OK;
    }
    case 'list': {
      if (rest.length > 1 || values.device !== undefined || values.identity !== undefined)
        throw new UsageError('list takes at most one device id');
      const deviceId = rest[0];
      if (deviceId !== undefined && !(await deviceExists(db, deviceId)))
        throw new CredentialCommandError('unknown_device', `device ${deviceId} is not in the registry`);
      printList(io, await listCredentials(db, deviceId), json);
      return EXIT_OK;
    }
    case undefined:
      throw new UsageError('no command given');
    default:
      throw new UsageError(`unknown command ${JSON.stringify(command)}`);
  }
}

/**
 * What went wrong, for an operator: never a stack, a driver's `detail` (which can hold a failing row, key
 * bytes included) or a password (messages pass through the redaction of service-kit).
 */
function describeFailure(err: unknown): string {
  if (err instanceof CredentialCommandError) return err.message;
  const state = sqlState(err);
  if (state === '42501')
    return 'permission denied: the login in DATABASE_URL may not change device keys (use the owner login that runs `npm run migrate`)';
  if (state === '42P01' || state === '3F000')
    return "the gateway's tables (device keys, audit) do not exist in this database: run `npm run migrate` first";
  const message = errorMessage(err);
  if (isConnectionError(err)) return `cannot reach the database: ${redactString(message)}`;
  return `failed: ${redactString(message)}`;
}

/** Runs one command; returns the process exit code. The database comes from `config` (deviceKeyConfig). */
export async function runDeviceKey(
  argv: readonly string[],
  config: DeviceKeyConfig,
  io: CommandIo,
): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.out(USAGE);
    return EXIT_OK;
  }
  const url = config.databaseUrl;
  if (url === undefined || url === '') {
    // The arguments shown again only when a shell takes them as they are (device ids and identities are).
    const again = argv.length > 0 && argv.every((a) => /^[\w.:@/=+-]+$/.test(a)) ? argv.join(' ') : 'list';
    io.err(
      [
        'device-key: DATABASE_URL must be set to an owner login of the platform database (the one `npm run migrate` uses).',
        'With the local stack (npm start) it is the URL its banner prints after "PostgreSQL"; on the default port:',
        `  DATABASE_URL=${LOCAL_STACK_DATABASE_URL} npm run device-key -- ${again}`,
      ].join('\n'),
    );
    return EXIT_USAGE;
  }
  const db = createDb<GatewayDatabase>(url, {
    max: 1,
    applicationName: 'device-key',
    connectionTimeoutMs: 10_000,
    // Failures are reported once, below; the pool's own connection warnings would repeat them.
    logger: { warn: () => undefined },
  });
  try {
    return await run(db, argv, config, io);
  } catch (err) {
    if (
      err instanceof UsageError ||
      // node:util's parseArgs throws TypeErrors with an ERR_PARSE_ARGS_* code (by code, not by class: a
      // TypeError of another realm, as under a test runner's VM, is no instance of this one's).
      (typeof err === 'object' &&
        err !== null &&
        'code' in err &&
        typeof err.code === 'string' &&
        err.code.startsWith('ERR_PARSE_ARGS'))
    ) {
      const { message } = err as { message?: unknown };
      io.err(`device-key: ${typeof message === 'string' ? message : errorMessage(err)}\n${USAGE}`);
      return EXIT_USAGE;
    }
    io.err(`device-key: ${describeFailure(err)}`);
    return EXIT_FAILED;
  } finally {
    await db.destroy();
  }
}
