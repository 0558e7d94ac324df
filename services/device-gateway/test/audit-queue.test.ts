// The audit queue when the database does not take rows (design §3.1, audit/queue.ts): rows wait and are written once
// it does, changes are refused while the queue is full, and a stopping process logs what it could not write. Real
// PostgreSQL with the gateway's migrations; the table is held by the owner as a migration or a VACUUM FULL would.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createDb, type Logger } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import { AuditQueue } from '../src/audit/queue.js';
import { auditRows, type AuditOrigin } from '../src/audit/writer.js';
import { ANONYMOUS_KEY } from '../src/auth/principal.js';
import { gatewayLoginUrl, gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';

jest.setTimeout(60_000);

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let login: Kysely<GatewayDatabase>;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: { warn: () => undefined } });
  // A short statement timeout: a write behind the held table fails in 1 s, as the service's would in its own.
  login = createDb<GatewayDatabase>(gatewayLoginUrl(database.url), {
    max: 2,
    statementTimeoutMs: 1000,
    logger: { warn: () => undefined },
  });
});

afterAll(async () => {
  await login.destroy();
  await owner.destroy();
  await database.drop();
});

interface Line {
  level: 'warn' | 'error';
  message: string;
  meta: Record<string, unknown>;
}

function logs(): { lines: Line[]; logger: Pick<Logger, 'warn' | 'error'> } {
  const lines: Line[] = [];
  const at = (level: Line['level']) =>
    ((message: string, meta: object = {}) => {
      lines.push({ level, message, meta: meta as Record<string, unknown> });
    }) as unknown as Logger['warn'];
  return { lines, logger: { warn: at('warn'), error: at('error') } };
}

const origin = (requestId: string): AuditOrigin => ({ principal: ANONYMOUS_KEY, requestId });
const row = (requestId: string) =>
  auditRows.overrideCleared(origin(requestId), {
    deviceId: 'acme-hq-hvac-01',
    siteId: '5e000000-0000-4000-8000-000000000a01',
  });

async function rowsWith(prefix: string): Promise<number> {
  const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM device_gateway.audit_events
    WHERE request_id LIKE ${`${prefix}%`}`.execute(owner);
  return rows[0]!.n;
}

/** Holds the audit table (ACCESS EXCLUSIVE) until the returned function is called. */
async function holdTable(): Promise<() => Promise<void>> {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let locked!: () => void;
  const isLocked = new Promise<void>((r) => (locked = r));
  const held = owner.transaction().execute(async (trx) => {
    await sql`LOCK TABLE device_gateway.audit_events IN ACCESS EXCLUSIVE MODE`.execute(trx);
    locked();
    await released;
  });
  await isLocked;
  return async () => {
    release();
    await held;
  };
}

describe('AuditQueue while the database does not take rows', () => {
  it('keeps them, refuses changes once 20,000 wait, and writes every one when the table is free again', async () => {
    const { lines, logger } = logs();
    const queue = new AuditQueue(login, logger);
    const release = await holdTable();
    try {
      for (let i = 0; i < 20_000; i++) queue.add(row(`full-${i}`));
      // Until the first write failed (its 1 s statement timeout): then the rows wait, nothing is dropped.
      const until = Date.now() + 20_000;
      while (
        !lines.some((l) => l.message === 'audit rows not written yet; trying again') &&
        Date.now() < until
      )
        await new Promise((r) => setTimeout(r, 50));
      expect(queue.waiting).toBe(20_000);
      expect(() => queue.requireRoom()).toThrow(
        expect.objectContaining({ status: 503, code: 'backend_unavailable' }),
      );
      expect(lines.some((l) => l.message === 'audit rows not written yet; trying again')).toBe(true);
    } finally {
      await release();
    }
    await queue.flush();
    expect(queue.waiting).toBe(0);
    expect(await rowsWith('full-')).toBe(20_000);
    expect(() => queue.requireRoom()).not.toThrow();
    expect(lines.filter((l) => l.level === 'error')).toEqual([]);
  });

  it('a batch too slow for the statement timeout is split until it fits, and every row comes', async () => {
    // Each row costs 3 ms (a trigger of this test): 600 rows in one INSERT outlast the 1 s statement timeout every
    // time; a queue that tried the same batch again would never write them.
    await sql
      .raw(
        `CREATE FUNCTION device_gateway.slow_test_audit() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
           SET search_path = pg_catalog AS $$ BEGIN PERFORM pg_sleep(0.003); RETURN NEW; END $$;
         CREATE TRIGGER slow_test_audit BEFORE INSERT ON device_gateway.audit_events
         FOR EACH ROW EXECUTE FUNCTION device_gateway.slow_test_audit();`,
      )
      .execute(owner);
    try {
      const { lines, logger } = logs();
      const queue = new AuditQueue(login, logger);
      for (let i = 0; i < 600; i++) queue.add(row(`slow-${i}`));
      await queue.flush();
      expect(await rowsWith('slow-')).toBe(600);
      expect(lines.some((l) => l.message === 'audit rows not written yet; trying again')).toBe(true);
    } finally {
      await sql
        .raw(
          `DROP TRIGGER slow_test_audit ON device_gateway.audit_events;
           DROP FUNCTION device_gateway.slow_test_audit();`,
        )
        .execute(owner);
    }
  });

  it('at shutdown (final) tries once and logs what is left, whole', async () => {
    const { lines, logger } = logs();
    const queue = new AuditQueue(login, logger);
    const release = await holdTable();
    try {
      queue.add(row('final-1'));
      queue.add(row('final-2'));
      await queue.flush({ final: true });
    } finally {
      await release();
    }
    const lost = lines.filter((l) => l.message === 'audit rows not written before the process stopped');
    expect(lost).toHaveLength(1);
    expect((lost[0]!.meta.lost as { request_id: string }[]).map((r) => r.request_id)).toEqual([
      'final-1',
      'final-2',
    ]);
    expect(await rowsWith('final-')).toBe(0);
  });
});
