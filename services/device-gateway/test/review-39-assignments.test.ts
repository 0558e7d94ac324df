// Issue 39 §2 (first item) and issue 41 (defects 2 and 3): a replica's reads of rollout assignments and the list
// of rollouts, in sequence order.
// - A replica that starts while a rollback commits read the rollback's removals on a later page of its first read
//   and skipped them (a first read skipped every removal, on every page), so it served the rolled-back settings
//   until it restarted. Reproduced with 60,000 assignments, as the issue did.
// - The reads ordered by `seq` as the output column, which is `seq::text`: text order (9 8 7 63 62 ...). A start
//   with more than 20,000 assignment rows (the page size) then lost rows between pages, and `GET /api/rollouts`
//   was not newest first and its pages lost rollouts.
import { createDb, createLogger } from '@platform/service-kit';
import { createTestDatabase, type TestDatabase } from '@platform/testkit';
import { sql, type Kysely, type KyselyPlugin } from 'kysely';
import { gatewayMigrations } from '../src/db/migrations.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { AssignmentSync } from '../src/rollout/assignments.js';
import { listRollouts } from '../src/rollout/sql.js';
import { device, newState } from './support/harness.js';
import { loginUrl } from './support/gateway.js';
import { validateDesiredSettings } from '@platform/contracts';

const ROLLOUT = 'c3900000-0000-4000-8000-000000000001';
const logger = createLogger({ service: 'review-39-assignments', level: 'error' });

let database: TestDatabase;
let owner: Kysely<GatewayDatabase>;
let login: Kysely<GatewayDatabase>;

beforeAll(async () => {
  database = await createTestDatabase({ migrations: [gatewayMigrations] });
  const quiet = { warn: () => undefined };
  owner = createDb<GatewayDatabase>(database.url, { max: 2, logger: quiet });
  login = createDb<GatewayDatabase>(loginUrl(database.url), { max: 2, logger: quiet });
});

afterAll(async () => {
  await login.destroy();
  await owner.destroy();
  await database.drop();
});

beforeEach(async () => {
  await sql`TRUNCATE device_gateway.rollout_assignments`.execute(owner);
});

/** `n` assignments of ROLLOUT's settings, to devices a39-0 … a39-(n-1), each under its own seq, in order. */
async function assign(n: number): Promise<void> {
  await sql`
    INSERT INTO device_gateway.rollout_assignments (device_id, rollout_id, settings, seq)
    SELECT 'a39-' || i, ${ROLLOUT}::uuid, '{"reporting_interval_s": 300}'::jsonb,
           nextval('device_gateway.rollout_assignment_seq')
    FROM generate_series(0, ${n - 1}::int) i ORDER BY i`.execute(owner);
}

/** A replica's state with devices a39-0 … a39-(n-1) in its registry (reporting_interval_s 60). */
function replica(n: number) {
  const state = newState();
  state.replaceRegistry(Array.from({ length: n }, (_, i) => device(`a39-${i}`)));
  return state;
}

describe('issue 41: a start reads every assignment, whatever their number', () => {
  it('20,563 assignment rows are 20,563 assignments after a start (pages in seq order)', async () => {
    const n = 20_563;
    await assign(n);
    const state = replica(n);
    const sync = new AssignmentSync({
      db: login,
      state,
      validateSettings: validateDesiredSettings,
      logger,
    });
    await sync.sync();
    sync.stop();
    let held = 0;
    for (let i = 0; i < n; i++) if (state.assignmentOf(`a39-${i}`)?.rolloutId === ROLLOUT) held++;
    // Before: 20,508 of 20,563 (the run: 20,506), the pages cut in text order.
    expect(held).toBe(n);
  }, 60_000);
});

describe('issue 39: a replica that starts while a rollback commits', () => {
  it('applies the removals its first read finds on a later page (60,000 assignments)', async () => {
    const n = 60_000;
    await assign(n);
    const state = replica(n);
    // The rollback commits while the replica's first read is between its first and second page: the devices of
    // the first page (read with their assignment) get NULL settings under new seqs, which a later page reads.
    let reads = 0;
    const rollbackBetweenPages: KyselyPlugin = {
      transformQuery: (args) => args.node,
      transformResult: async (args) => {
        if (++reads === 1) {
          await sql`
            UPDATE device_gateway.rollout_assignments
            SET settings = NULL, rollout_id = '00000000-0000-0000-0000-000000000000',
                seq = nextval('device_gateway.rollout_assignment_seq')
            WHERE device_id IN (SELECT 'a39-' || i FROM generate_series(0, 99) i)`.execute(owner);
        }
        return args.result;
      },
    };
    const sync = new AssignmentSync({
      db: login.withPlugin(rollbackBetweenPages),
      state,
      validateSettings: validateDesiredSettings,
      logger,
    });
    await sync.sync();
    sync.stop();
    expect(reads).toBeGreaterThan(1);
    // Before: every one of the 100 still held the rolled-back assignment and served its settings.
    for (let i = 0; i < 100; i++) {
      expect(state.assignmentOf(`a39-${i}`)).toBeUndefined();
      expect(state.settingsDocument(`a39-${i}`)?.body).toMatchObject({
        source: 'registry',
        settings: { reporting_interval_s: 60 },
      });
    }
    expect(state.assignmentOf('a39-100')?.rolloutId).toBe(ROLLOUT);
    expect(state.assignmentOf(`a39-${n - 1}`)?.rolloutId).toBe(ROLLOUT);
  }, 120_000);
});

describe('issue 41: GET /api/rollouts lists newest first and its pages lose nothing', () => {
  it('63 rollouts: newest first by their number, and pages of 3 list all 63 once', async () => {
    await sql`
      INSERT INTO device_gateway.rollouts (state, selector, settings, content, first_wave_count, growth_factor,
        success_share, abort_share, deadline_s, targets, waves)
      SELECT CASE WHEN i % 7 = 0 THEN 'active' ELSE 'completed' END, '{"models": ["m"]}', '{}',
             '0123456789abcdef', 1, 2, 1, 1, 60, 1, 1
      FROM generate_series(1, 63) i ORDER BY i`.execute(owner);
    const first = await listRollouts(login, { limit: 10 });
    const seqs = first.map((r) => Number(r.seq));
    // Before: 9 8 7 63 62 61 60 6 59 58 (text order).
    expect(seqs.slice(0, 10)).toEqual([63, 62, 61, 60, 59, 58, 57, 56, 55, 54]);
    const seen: number[] = [];
    let before: string | undefined;
    for (;;) {
      const page = await listRollouts(login, {
        limit: 3,
        ...(before === undefined ? {} : { beforeSeq: before }),
      });
      const shown = page.slice(0, 3);
      seen.push(...shown.map((r) => Number(r.seq)));
      if (page.length <= 3) break;
      before = shown.at(-1)!.seq;
    }
    // Before: 9 of 63.
    expect(seen).toEqual(Array.from({ length: 63 }, (_, i) => 63 - i));
    const active = await listRollouts(login, { limit: 100, state: 'active' });
    expect(active.map((r) => Number(r.seq))).toEqual([63, 56, 49, 42, 35, 28, 21, 14, 7]);
  });
});
