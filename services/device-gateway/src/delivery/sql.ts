// The delivery record's SQL (migrations 0005 and 0011, design §3.8): the batch writer, one device's row, the
// fleet list.
import { errorMessage, type Logger } from '@platform/service-kit';
import { sql, type Kysely, type RawBuilder } from 'kysely';
import { notifyChannel } from '../cluster/channels.js';
import { INSPECT_CHANNEL } from '../cluster/messages.js';
import type { DeliveryState, DeviceDeliveryTable, GatewayDatabase } from '../db/tables.js';
import type { InspectStore } from '../cluster/inspect.js';
import type { DeliveryWriter } from './recorder.js';

/** Rows a call of the reap updates at most (0013): about a chunk's worth, tens of ms. */
export const REAP_BATCH = 2000;

export function deliveryWriter(db: Kysely<GatewayDatabase>): DeliveryWriter {
  return {
    // One chunk, one call of 0011's function; each call takes a connection of the pool, so the recorder's
    // writers (GATEWAY_DELIVERY_WRITERS) run on as many connections at once.
    async record(replica, batch) {
      const [d, dv, ds, dc, da, sv, sc, sa, st, sk, av, ac, aa, at, h, r] = batch.columns;
      await sql`SELECT device_gateway.delivery_record_arrays(${replica}, ${d}::text[], ${dv}::bigint[],
        ${ds}::text[], ${dc}::text[], ${da}::double precision[], ${sv}::bigint[], ${sc}::text[],
        ${sa}::double precision[], ${st}::text[], ${sk}::boolean[], ${av}::bigint[], ${ac}::text[],
        ${aa}::double precision[], ${at}::text[], ${h}::double precision[], ${r}::integer[])`.execute(db);
    },
    // 0014: how old this replica's oldest unwritten event is, on the database's clock. The lag is read once the
    // connection is ours, so a wait for the pool does not make the stored progress later than what is written.
    async report(replica, lagMs, validMs) {
      await db.connection().execute(async (conn) => {
        await sql`SELECT device_gateway.delivery_report(${replica}, ${lagMs()}::integer, ${validMs}::integer)`.execute(
          conn,
        );
      });
    },
    // 0013's reap, a batch of at most REAP_BATCH rows a call, each call its own transaction, in device order
    // from where the previous one stopped: a chunk of the writers' waits for one batch, not for the whole reap
    // (100,000 rows after a replica with a fleet observed died).
    async reap(self) {
      let after: string | null = null;
      let total = 0;
      for (;;) {
        const { rows }: { rows: { reaped: number; last_device: string | null }[] } = await sql<{
          reaped: number;
          last_device: string | null;
        }>`SELECT reaped, last_device FROM device_gateway.delivery_reap(${self}, ${after}, ${REAP_BATCH}::integer)`.execute(
          db,
        );
        const n = rows[0]?.reaped ?? 0;
        total += n;
        if (n < REAP_BATCH || rows[0]?.last_device == null) return total;
        after = rows[0].last_device;
      }
    },
  };
}

export type DeliveryRecordRow = DeviceDeliveryTable;

/**
 * One device's row. `deadlineMs`: the read waits no longer than that, for a lock included (the device view's
 * deadline; a cold review had a view wait the whole statement timeout, 4 s, behind a migration's lock), and
 * gives its connection back then: the statement timeout and lock timeout are set for its own transaction.
 */
export async function readDelivery(
  db: Kysely<GatewayDatabase>,
  deviceId: string,
  deadlineMs?: number,
): Promise<DeliveryRecordRow | undefined> {
  const read = (q: Kysely<GatewayDatabase>) =>
    q
      .selectFrom('device_gateway.device_delivery')
      .selectAll()
      .where('device_id', '=', deviceId)
      .executeTakeFirst();
  if (deadlineMs === undefined) return read(db);
  return db.transaction().execute(async (trx) => {
    const ms = String(Math.max(1, Math.round(deadlineMs)));
    await sql`SELECT set_config('statement_timeout', ${ms}, true), set_config('lock_timeout', ${ms}, true)`.execute(
      trx,
    );
    return read(trx);
  });
}

/** Where the next page starts: after this (desired_at in µs since the epoch, device_id). */
export interface DeliveryCursor {
  atMicros: string;
  deviceId: string;
}

export interface DeliveryListQuery {
  siteId?: string;
  /** The caller's site scope as a condition on the site column (Principal.siteCondition); absent: every site. */
  siteScope?: (column: RawBuilder<unknown>) => RawBuilder<boolean>;
  /** The states to list (any of them); none: every state. */
  states?: readonly DeliveryState[];
  /** Only devices acknowledged at least this many seconds ago, of those in state `acknowledged`. */
  acknowledgedForS?: number;
  limit: number;
  after?: DeliveryCursor;
}

export interface DeliveryListRow extends DeliveryRecordRow {
  name: string;
  model: string;
  /** desired_at in µs since the epoch, exactly (the cursor). */
  at_micros: string;
}

/**
 * One page of the fleet list: devices of the registry (enabled) with their delivery record, oldest desired
 * change first, then by device id; `limit + 1` rows, so the caller knows whether a next page exists. With no
 * state or one, the page walks one of migration 0023's indexes (or 0005's page and site indexes) in order and
 * stops. With several states each state's walk is its own part, stopped at the page's size, and the parts are
 * merged in order (a Merge Append of at most one page per state; the test checks the plans).
 */
export function listDeliveryQuery(db: Kysely<GatewayDatabase>, q: DeliveryListQuery) {
  const states = q.states ?? [];
  const part = (state: DeliveryState | undefined) => {
    let query = db
      .selectFrom('device_gateway.device_delivery as d')
      .innerJoin('device_gateway.device_registry as r', 'r.device_id', 'd.device_id')
      .selectAll('d')
      .select(['r.name', 'r.model'])
      .select(sql<string>`(extract(epoch FROM d.desired_at) * 1000000)::bigint::text`.as('at_micros'))
      .where('r.enabled', '=', true);
    if (q.siteId !== undefined) query = query.where('d.site_id', '=', q.siteId);
    if (q.siteScope !== undefined) query = query.where(q.siteScope(sql.ref('d.site_id')));
    if (state !== undefined) query = query.where('d.state', '=', state);
    if (q.acknowledgedForS !== undefined && (state === undefined || state === 'acknowledged')) {
      const since = sql`now() - ${q.acknowledgedForS}::integer * interval '1 second'`;
      query =
        state === undefined
          ? query.where(sql<boolean>`(d.state <> 'acknowledged' OR d.acked_at <= ${since})`)
          : query.where(sql<boolean>`d.acked_at <= ${since}`);
    }
    if (q.after !== undefined) {
      const at = sql`(timestamptz 'epoch' + ${q.after.atMicros}::bigint * interval '1 microsecond')`;
      query = query.where(sql<boolean>`(d.desired_at, d.device_id) > (${at}, ${q.after.deviceId})`);
    }
    return query
      .orderBy('d.desired_at')
      .orderBy('d.device_id')
      .limit(q.limit + 1);
  };
  if (states.length <= 1) return part(states[0]);
  const parts = states.map((state) => sql`(${part(state)})`);
  return db
    .selectFrom(sql<DeliveryListRow>`(${sql.join(parts, sql` UNION ALL `)})`.as('u'))
    .selectAll()
    .orderBy('u.desired_at')
    .orderBy('u.device_id')
    .limit(q.limit + 1);
}

export async function listDelivery(
  db: Kysely<GatewayDatabase>,
  q: DeliveryListQuery,
): Promise<DeliveryListRow[]> {
  return listDeliveryQuery(db, q).execute();
}

/**
 * The device view's exchange between replicas (cluster/inspect.ts; migration 0005's inspect_answers). The
 * request's and the answer's notices are sent after their row's commit, in a statement of their own (migration
 * 0021): PostgreSQL's NOTIFY queue is the whole cluster's, another database's session can fill it, and a NOTIFY
 * then fails at its commit. A notice that cannot be sent is logged (`logger`), not thrown: the asker reads the
 * answers stored by its deadline anyway, and the view answers with the parts it has.
 */
export function inspectStore(db: Kysely<GatewayDatabase>, logger?: Pick<Logger, 'warn'>): InspectStore {
  // The payloads 0016's and 0017's functions built in their transaction, built the same way.
  const notice = async (kind: 'q' | 'a', query: string, replica: string): Promise<void> => {
    try {
      await notifyChannel(
        db,
        INSPECT_CHANNEL,
        sql<string>`pg_catalog.json_build_object('k', ${kind}::text, 'q', ${query}::uuid, 'o', ${replica}::text)::text`,
      );
    } catch (err) {
      logger?.warn('device view: notice not sent', { kind, error: errorMessage(err) });
    }
  };
  return {
    async publishRequest(query: string, deviceId: string, origin: string): Promise<void> {
      await sql`SELECT device_gateway.inspect_ask(${query}::uuid, ${deviceId}, ${origin})`.execute(db);
      await notice('q', query, origin);
    },
    async queryDevice(query: string, origin: string): Promise<string | undefined> {
      const { rows } = await sql<{ device_id: string }>`
        SELECT device_id FROM device_gateway.inspect_queries
        WHERE query_id = ${query}::uuid AND origin = ${origin}`.execute(db);
      return rows[0]?.device_id;
    },
    async writeAnswer(query: string, replica: string, answer: string): Promise<void> {
      await sql`SELECT device_gateway.inspect_answer(${query}::uuid, ${replica}, ${answer}::json)`.execute(
        db,
      );
      await notice('a', query, replica);
    },
    // Only the replicas asked: at most one row each (the key is query and replica), of at most 16 KiB (0016).
    // Any session of the login can store answers under a query id it heard; before, all of them were read
    // and parsed (a cold review: 1,200 forged rows, +700 MB for one view).
    async readAnswers(
      query: string,
      replicas: readonly string[],
    ): Promise<{ replica: string; answer: unknown }[]> {
      const { rows } = await sql<{ replica: string; answer: unknown }>`
        SELECT replica, answer FROM device_gateway.inspect_answers
        WHERE query_id = ${query}::uuid AND replica = ANY(${replicas}::text[])`.execute(db);
      return rows;
    },
    /** bus_join's rule (migration 0003): sessions of this login named `device-gateway-bus <origin>`. */
    async liveReplicas(): Promise<string[]> {
      const { rows } = await sql<{ origin: string }>`
        SELECT DISTINCT split_part(application_name, ' ', 2) AS origin FROM pg_catalog.pg_stat_activity
        WHERE datname = current_database() AND usename = current_user
          AND application_name LIKE 'device-gateway-bus %'`.execute(db);
      return rows.map((r) => r.origin);
    },
    async loginPids(): Promise<number[]> {
      const { rows } = await sql<{ pid: number }>`
        SELECT pid FROM pg_catalog.pg_stat_activity WHERE usename = current_user`.execute(db);
      return rows.map((r) => r.pid);
    },
  };
}
