// Third cold review of issue 42 (principals, tokens, site scopes, the audit and the sealed cursors on /api), after
// review-42 and review-42b. Each test named `HOLE` fails against the code as reviewed (92eee63) and passes once the
// hole is closed; every other test is an attack that held. Found: an audit row still queued when its site changes
// company is stamped with the new company (0037's trigger runs at the write, not at the change); a rollout on a site
// handed to another company shows the new company the old one's keys in its events; a genuine token whose `sub`
// the audit's principal column cannot hold changes a device unaudited (and its rollout is refused blaming /plan);
// AuditQueue.requireRoom and add are apart, so concurrent changes admitted at the bound lose their rows; a sealed
// cursor has 16 spellings. Held: cross-list and bit-flipped cursors, a foreign cursor under a scope, the login
// against 0037's trigger. Real parts: a real PostgreSQL with the platform's migrations and the demo seeds (plus
// sites and devices of this file's own), the test kit's issuer (real RS256 tokens and its JWKS), a named key file;
// the queue's race is shown on the real AuditQueue against a database address nothing listens on (a database that
// takes no rows, as in a failover).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { demoCompanies, demoSites } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';
import { OPERATIONS_CLIENT, type Issuer, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely } from 'kysely';
import request from 'supertest';
import type { GatewayApp } from '../src/app.js';
import { AuditQueue } from '../src/audit/queue.js';
import { auditRows } from '../src/audit/writer.js';
import { Principal } from '../src/auth/principal.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { startPeopleGateway, type PeopleGateway } from './support/people-gateway.js';

jest.setTimeout(120_000);

const ANON = 'review42c-anonymous-key-0123456789';
const ACME_OPS = 'review42c-acme-ops-key-0123456789';
const HQ = demoSites.acmeHq.id;
const ACME = demoCompanies.acme.id;
const BOREALIS = demoCompanies.borealis.id;
/** HQ devices of this file. */
const EXTRA = ['review42c-hq-01', 'review42c-hq-02'] as const;
/** A portal site of Acme's that is handed to Borealis while a row of Acme's waits in the audit queue. */
const DEPOT = '5e000000-0000-4000-8000-0000000042c1';
const DEPOT_DEVICE = 'review42c-depot-01';
/** Another site of Acme's, handed to Borealis while an Acme rollout is on it. */
const YARD = '5e000000-0000-4000-8000-0000000042c2';
const YARD_DEVICE = 'review42c-yard-01';

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let reader: Kysely<GatewayDatabase>;
let issuer: Issuer;
let app: GatewayApp;
let olga: string;
let oscar: string;

const bearer = (token: string) => ({ Authorization: `Bearer ${token}` });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const plan = { first_wave_count: 1, growth_factor: 2, success_share: 0.5, abort_share: 0.5, deadline_s: 60 };

let gw: PeopleGateway;

beforeAll(async () => {
  gw = await startPeopleGateway({
    name: 'review42c',
    keyLines: [ANON, `name=acme-ops role=operator companies=${ACME} key=${ACME_OPS}`],
    env: { DB_STATEMENT_TIMEOUT_MS: '1500', DB_QUERY_TIMEOUT_MS: '3000' },
    seed: async (o) => {
      await sql`INSERT INTO enterprise.sites (id, company_id, name, timezone)
        VALUES (${DEPOT}::uuid, ${ACME}::uuid, 'Acme depot (review 42c)', 'America/Chicago'),
          (${YARD}::uuid, ${ACME}::uuid, 'Acme yard (review 42c)', 'America/Chicago')`.execute(o);
      await o
        .insertInto('device_gateway.device_registry')
        .values([
          ...EXTRA.map((id) => ({
            device_id: id,
            site_id: HQ,
            name: id,
            model: 'aq-sense-2',
            desired_settings: '{}',
          })),
          {
            device_id: DEPOT_DEVICE,
            site_id: DEPOT,
            name: 'depot',
            model: 'aq-sense-2',
            desired_settings: '{}',
          },
          {
            device_id: YARD_DEVICE,
            site_id: YARD,
            name: 'yard',
            model: 'aq-sense-2',
            desired_settings: '{}',
          },
        ])
        .execute();
    },
  });
  ({ database, owner, reader, issuer, app } = gw);
  app.registry.refreshSitesEvery(200);
  olga = await issuer.opsToken('olga');
  oscar = await issuer.opsToken('oscar');
});

afterAll(async () => {
  await app.audit.flush();
  await gw.close();
});

interface AuditItem {
  id: string;
  principal: string;
  request_id: string | null;
  device_id: string | null;
  rollout_id: string | null;
  site_ids: string[];
}

const rowsOf = (requestId: string, ms?: number): Promise<number> => gw.auditRowsOf(requestId, 1, ms);

const notify = (token: string, deviceId: string, requestId: string, interval?: number): Promise<number> =>
  gw.notify(token, deviceId, requestId, interval);

describe('the company an audit row keeps', () => {
  it("HOLE: a row still queued when its site is handed to another company is stamped with the new company, and Borealis reads Acme's change", async () => {
    expect(await notify(ACME_OPS, DEPOT_DEVICE, 'r42c-depot-warm', 91)).toBe(200);
    expect(await rowsOf('r42c-depot-warm')).toBe(1);
    // The owner holds the audit table a little longer than one statement may wait (a VACUUM FULL, a migration, a
    // failover): the notify is answered 200, and its row waits in the queue (audit/queue.ts keeps it, review 42b).
    const locker = createDb<GatewayDatabase>(database.url, { max: 1, logger: { warn: () => undefined } });
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    const held = locker.transaction().execute(async (trx) => {
      await sql`LOCK TABLE device_gateway.audit_events IN ACCESS EXCLUSIVE MODE`.execute(trx);
      await released;
    });
    await sleep(200);
    try {
      // Acme's key changes the depot's device while the depot is Acme's.
      expect(await notify(ACME_OPS, DEPOT_DEVICE, 'r42c-depot-acme', 92)).toBe(200);
      // Meanwhile the portal hands the depot to Borealis (the building was sold).
      await sql`UPDATE enterprise.sites SET company_id = ${BOREALIS}::uuid WHERE id = ${DEPOT}::uuid`.execute(
        owner,
      );
      await sleep(2500); // past the login's statement timeout (1.5 s): the first INSERT fails and is retried
    } finally {
      release();
      await held;
      await locker.destroy();
    }
    expect(await rowsOf('r42c-depot-acme')).toBe(1);
    const { rows } = await sql<{
      site_companies: string[];
    }>`SELECT site_companies FROM device_gateway.audit_events
      WHERE request_id = 'r42c-depot-acme'`.execute(owner);
    await sleep(600); // the catalogue's refresh (200 ms here) has seen the handover
    // A Borealis operator (vera, made operator) reads the depot's history: the change Acme made before the handover
    // must not be hers (migration 0037's rule), yet the trigger stamped it with the company at the write.
    const borealisOperator = await issuer.opsToken('vera', {
      resource_access: { [OPERATIONS_CLIENT]: { roles: ['operator'] } },
    });
    const res = await request(app.http)
      .get(`/api/audit?limit=100&device_id=${DEPOT_DEVICE}`)
      .set(bearer(borealisOperator));
    expect(res.status).toBe(200);
    const items = (res.body as { items: AuditItem[] }).items;
    // Control: the row written before the handover (stamped Acme) is not hers.
    expect(items.map((r) => r.request_id)).not.toContain('r42c-depot-warm');
    expect({
      stamped: rows[0]!.site_companies,
      seenByBorealis: items.filter((r) => r.request_id === 'r42c-depot-acme').map((r) => r.principal),
    }).toEqual({ stamped: [`${DEPOT}/${ACME}`], seenByBorealis: [] });
  });
});

describe('a rollout on a site handed to another company', () => {
  // Rollouts keep their sites' companies at creation (migration 0041), as audit rows do; it.failing until then.
  it("HOLE (low): Borealis reads the rollout Acme ran on the yard before the handover, with Acme's key named in its events", async () => {
    const created = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(ACME_OPS))
      .send({ selector: { site_ids: [YARD] }, settings: { reporting_interval_s: 111 }, plan });
    expect(created.status).toBe(201);
    const id = (created.body as { rollout_id: string }).rollout_id;
    const cancelled = await request(app.http).post(`/api/rollouts/${id}/cancel`).set(bearer(ACME_OPS));
    expect(cancelled.status).toBe(200);
    // The portal hands the yard to Borealis; the catalogue's refresh (200 ms here) sees it.
    await sql`UPDATE enterprise.sites SET company_id = ${BOREALIS}::uuid WHERE id = ${YARD}::uuid`.execute(
      owner,
    );
    await sleep(800);
    const borealisOperator = await issuer.opsToken('vera', {
      resource_access: { [OPERATIONS_CLIENT]: { roles: ['operator'] } },
    });
    // The audit keeps Acme's rows from her (migration 0037) - the control of this attack.
    const audit = await request(app.http).get('/api/audit?limit=100').set(bearer(borealisOperator));
    const yardRows = (audit.body as { items: AuditItem[] }).items.filter((r) => r.site_ids.includes(YARD));
    expect(JSON.stringify(yardRows)).not.toContain('acme-ops');
    // The rollout itself does not: its events name Acme's key (and its list shows her Acme's rollout).
    const detail = await request(app.http).get(`/api/rollouts/${id}`).set(bearer(borealisOperator));
    const actors =
      detail.status === 200
        ? (detail.body as { events: { actor: string }[] }).events.map((e) => e.actor)
        : [];
    expect({ status: detail.status, acmeActors: actors.filter((a) => a.includes('acme-ops')) }).toEqual({
      status: detail.status,
      acmeActors: [],
    });
  });
});

describe('a genuine token whose subject the audit cannot hold', () => {
  const longSub = `review42c-${'s'.repeat(390)}`;

  it('HOLE: a notify by a token whose sub is 400 characters is answered 200 and never audited (the row breaks the principal CHECK and is dropped)', async () => {
    const token = await issuer.opsToken('olga', { sub: longSub });
    const status = await notify(token, EXTRA[0], 'r42c-long-sub-1', 93);
    // Either the token is refused (its change could never be audited), or the change it made is recorded.
    const audited = status === 200 ? (await rowsOf('r42c-long-sub-1', 3000)) === 1 : true;
    expect({ status, audited }).toEqual({ status, audited: true });
  });

  it("HOLE (low): the same token creating a rollout is refused with 400 blaming a valid /plan (the audit row's CHECK is read as the plan's)", async () => {
    const token = await issuer.opsToken('olga', { sub: longSub });
    const res = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(token))
      .send({
        selector: { site_ids: [HQ], device_ids: [EXTRA[1]] },
        settings: { reporting_interval_s: 95 },
        plan,
      });
    const { rows } = await sql<{ n: number }>`SELECT count(*)::int AS n FROM device_gateway.rollouts
      WHERE selector->'device_ids' ? ${EXTRA[1]}`.execute(owner);
    // Held: no rollout exists without its audit row (the row is in the creation's transaction).
    expect(rows[0]!.n).toBe(res.status === 201 ? 1 : 0);
    // The same plan is accepted from olga's own token (the control): the refusal is not the plan's.
    const control = await request(app.http)
      .post('/api/rollouts')
      .set(bearer(olga))
      .send({
        selector: { site_ids: [HQ], device_ids: [EXTRA[1]] },
        settings: { reporting_interval_s: 95 },
        plan,
      });
    expect(control.status).toBe(201);
    const id = (control.body as { rollout_id: string }).rollout_id;
    expect((await request(app.http).post(`/api/rollouts/${id}/cancel`).set(bearer(olga))).status).toBe(200);
    const errors = (res.body as { errors?: { path: string }[] }).errors ?? [];
    expect(errors.map((e) => e.path)).not.toContain('/plan');
  });
});

describe('the audit queue at its bound', () => {
  it('HOLE: changes admitted by requireRoom while the queue is one short of full lose their rows (check and add are apart)', async () => {
    // A database that takes no rows (nothing listens there): the queue keeps what it holds and tries again.
    const gone = createDb<GatewayDatabase>('postgres://nobody:nothing@127.0.0.1:9/none', {
      max: 1,
      logger: { warn: () => undefined },
    });
    const logged: string[] = [];
    const queue = new AuditQueue(gone, {
      error: (message: string) => void logged.push(message),
      warn: () => undefined,
    } as never);
    const origin = {
      principal: new Principal({ kind: 'api_key', id: 'key:r42c', name: 'r42c', role: 'operator' }),
      requestId: 'r42c-queue',
      sourceAddress: '127.0.0.1',
    };
    const row = () => auditRows.overrideCleared(origin, { deviceId: EXTRA[0], siteId: HQ });
    try {
      for (let i = 0; i < 19_999; i++) queue.add(row());
      // Two notifies arrive together: the route checks the room before the change (routes.ts) and queues the row
      // once the answer goes out (auditWhenAnswered), after `await service.notifySettings` - so both pass the check.
      let admitted = 0;
      for (let i = 0; i < 2; i++) {
        try {
          queue.requireRoom();
          admitted++;
        } catch {
          // refused with 503: that change is not made, and needs no row
        }
      }
      for (let i = 0; i < admitted; i++) queue.add(row());
      // Every admitted change keeps its row (or the second is refused before it is made).
      expect(queue.waiting).toBe(19_999 + admitted);
    } finally {
      await queue.flush({ final: true });
      await gone.destroy();
    }
  });
});

describe('sealed ids and cursors (held)', () => {
  it("one list's cursor is refused by the other; a cursor with one bit changed is refused", async () => {
    for (let i = 0; i < 3; i++) expect(await notify(oscar, EXTRA[1], `r42c-seal-${i}`, 94 + i)).toBe(200);
    expect(await rowsOf('r42c-seal-2')).toBe(1);
    const audit = await request(app.http).get('/api/audit?limit=1').set(bearer(olga));
    const auditCursor = (audit.body as { next_cursor: string }).next_cursor;
    expect(auditCursor).toMatch(/^[A-Za-z0-9_-]{22}$/);
    for (const path of [`/api/rollouts?cursor=${auditCursor}`, `/api/overrides?cursor=${auditCursor}`]) {
      const res = await request(app.http).get(path).set(bearer(olga));
      expect(res.status).toBe(400);
    }
    const bytes = Buffer.from(auditCursor, 'base64url');
    for (const bit of [0, 63, 64, 127]) {
      const flipped = Buffer.from(bytes);
      flipped[bit >> 3]! ^= 1 << (bit & 7);
      const res = await request(app.http)
        .get(`/api/audit?cursor=${flipped.toString('base64url')}`)
        .set(bearer(olga));
      expect(res.status).toBe(400);
    }
  });

  it("HOLE (info): a cursor respelled in its last character's four unused bits is read as the issued one (16 spellings of every id)", async () => {
    const audit = await request(app.http).get('/api/audit?limit=1').set(bearer(olga));
    const issued = (audit.body as { next_cursor: string }).next_cursor;
    const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
    const respelled = issued.slice(0, 21) + alphabet[alphabet.indexOf(issued[21]!) ^ 1]!;
    expect(Buffer.from(respelled, 'base64url').equals(Buffer.from(issued, 'base64url'))).toBe(true);
    // "Only ids this API issued read back" (audit-routes.ts): this spelling was never issued.
    const res = await request(app.http).get(`/api/audit?limit=1&cursor=${respelled}`).set(bearer(olga));
    expect(res.status).toBe(400);
  });

  it("a scoped reader given an unscoped reader's cursor (positioned among other sites' rows) still reads only its sites", async () => {
    expect(await notify(olga, 'borealis-tower-chiller-01', 'r42c-tower-1', 97)).toBe(200);
    expect(await rowsOf('r42c-tower-1')).toBe(1);
    const top = await request(app.http).get('/api/audit?limit=1').set(bearer(olga));
    expect((top.body as { items: AuditItem[] }).items[0]!.request_id).toBe('r42c-tower-1');
    const cursor = (top.body as { next_cursor: string }).next_cursor;
    const res = await request(app.http).get(`/api/audit?limit=100&cursor=${cursor}`).set(bearer(oscar));
    expect(res.status).toBe(200);
    for (const r of (res.body as { items: AuditItem[] }).items) expect(r.site_ids).toEqual([HQ]);
  });
});

describe("migration 0037's trigger cannot be steered by the login (held)", () => {
  /** The SQLSTATE a statement of the login fails with, or 'ok'. */
  async function stateOf(statement: ReturnType<typeof sql.raw>): Promise<string> {
    try {
      await statement.execute(reader);
      return 'ok';
    } catch (err) {
      return (err as { code?: string }).code ?? String(err);
    }
  }

  // Since 0038 the queue stamps rows at the change, so the login may bring pairs, but only of the row's own sites.
  it('the login can neither stamp another site, nor disable the trigger, nor call its function', async () => {
    const row = `'key:r42c-forger', 'api_key', 'settings.notified', ARRAY['${HQ}']::uuid[], '{}'::jsonb`;
    expect(
      await stateOf(
        sql.raw(`INSERT INTO device_gateway.audit_events (principal, principal_kind, action, site_ids, detail,
          site_companies) VALUES (${row}, ARRAY['${demoSites.borealisTower.id}/${BOREALIS}'])`),
      ),
    ).toBe('23514');
    expect(
      await stateOf(
        sql.raw('ALTER TABLE device_gateway.audit_events DISABLE TRIGGER audit_events_site_companies'),
      ),
    ).toBe('42501');
    expect(await stateOf(sql.raw('SELECT device_gateway.audit_events_site_companies()'))).not.toBe('ok');
    // A row the login may write is stamped by the database with the site's company, whatever the session sets.
    expect(
      await stateOf(
        sql.raw(`INSERT INTO device_gateway.audit_events (principal, principal_kind, action, site_ids, detail)
          VALUES (${row})`),
      ),
    ).toBe('ok');
    const { rows } = await sql<{
      site_companies: string[];
    }>`SELECT site_companies FROM device_gateway.audit_events
      WHERE principal = 'key:r42c-forger'`.execute(owner);
    expect(rows.map((r) => r.site_companies)).toEqual([[`${HQ}/${ACME}`]]);
  });
});
