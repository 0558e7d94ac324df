// `npm run bench:delivery-sql`: where PostgreSQL's time goes in the delivery record's batch function (design
// §3.8), standalone: the embedded PostgreSQL the tests use, 100,000 registry rows, batches of 2,000 rows shaped as
// the recorder sends them during a reload's fan-out (desired + sent + acknowledged for every device), desired
// only, acknowledged only, and registrations (a relation each, from a replica the rows do not list yet). Prints
// µs per row of each function the database has (`delivery_record` with its JSON batch, and 0011's
// `delivery_record_arrays` with parallel arrays when present), WAL bytes per row, the parts of the
// statement timed alone (parsing, checks, registry join, sort), the cost of each index, and the plan of the
// statement inside the function (auto_explain). Not a pass/fail test.
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { createDb, migrateToLatest } from '@platform/service-kit';
import { gatewayMigrations, type DeliveryRow, type GatewayDatabase } from '@platform/device-gateway';
import { startPostgres } from '@platform/testkit';
import { benchDeviceId as deviceId, seedBenchRegistry } from './lib/bench-registry.js';

const N = Number(process.env.BENCH_DEVICES ?? 100_000);
const CHUNK = Number(process.env.BENCH_CHUNK ?? 2000);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const REPLICA = '0123456789abcdef';

type Shape = 'fanout' | 'desired' | 'acked' | 'registered';
/** A row as the recorder sends it (delivery_record's batch element). */
type Row = DeliveryRow;

let clock = Date.now() * 1000;
const hex16 = (v: number): string => v.toString(16).padStart(16, '0').slice(-16);

/** One chunk's rows, in the recorder's key order; `version` a µs clock reading, `content` its digest. */
function rows(shape: Shape, from: number, to: number, version: number, content: string): Row[] {
  const now = Date.now();
  const out: Row[] = [];
  for (let i = from; i < to; i++) {
    const d = deviceId(i);
    if (shape === 'desired') out.push({ d, dv: version, ds: 'registry', dc: content, da: now });
    else if (shape === 'acked') out.push({ d, av: version, ac: content, aa: now, at: 'plain', h: now });
    else if (shape === 'registered')
      out.push({ d, sv: version, sc: content, sa: now, st: 'plain', sk: false, h: now, r: 1 });
    else
      out.push({
        d,
        dv: version,
        ds: 'registry',
        dc: content,
        da: now,
        sv: version,
        sc: content,
        sa: now,
        st: 'plain',
        sk: true,
        av: version,
        ac: content,
        aa: now,
        at: 'plain',
        h: now,
      });
  }
  return out;
}

/** Postgres array text of `values` (numbers, booleans, plain words; NULL for undefined). */
function arr(values: readonly (string | number | boolean | undefined)[]): string {
  return `{${values.map((v) => (v === undefined ? 'NULL' : typeof v === 'string' ? `"${v}"` : String(v))).join(',')}}`;
}

/** What 0011's delivery_record_arrays takes: the parts present in the chunk, as parallel arrays. */
function arrays(rs: Row[]): unknown[] {
  const col = (k: keyof Row): string | null =>
    rs.some((r) => r[k] !== undefined) ? arr(rs.map((r) => r[k])) : null;
  return [
    arr(rs.map((r) => r.d)),
    col('dv'),
    col('ds'),
    col('dc'),
    col('da'),
    col('sv'),
    col('sc'),
    col('sa'),
    col('st'),
    col('sk'),
    col('av'),
    col('ac'),
    col('aa'),
    col('at'),
    col('h'),
    col('r'),
  ];
}

const RECORDSET = `json_to_recordset($1::json) AS b(
    d text, s uuid, dv bigint, ds text, dc text, da double precision,
    sv bigint, sc text, sa double precision, st text, sk boolean,
    av bigint, ac text, aa double precision, at text, h double precision, r integer)`;
const CHECKS = `coalesce(b.dv, 0) BETWEEN 0 AND (c.now_ms + 86400000) * 1000
    AND coalesce(b.sv, 0) BETWEEN 0 AND (c.now_ms + 86400000) * 1000
    AND coalesce(b.av, 0) BETWEEN 0 AND (c.now_ms + 86400000) * 1000
    AND coalesce(b.da, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000
    AND coalesce(b.sa, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000
    AND coalesce(b.aa, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000
    AND coalesce(b.h, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000`;
const REGEX = `(b.dc IS NULL OR b.dc ~ '^[0-9a-f]{16}$')
    AND (b.sc IS NULL OR b.sc ~ '^[0-9a-f]{16}$')
    AND (b.ac IS NULL OR b.ac ~ '^[0-9a-f]{16}$')`;
const NOW = `CROSS JOIN LATERAL (SELECT (extract(epoch FROM now()) * 1000)::double precision AS now_ms) c`;
/** The parts of 0009's statement alone, each a count over one chunk. */
const PARTS: [string, string][] = [
  ['json_to_recordset alone', `SELECT count(*) FROM ${RECORDSET}`],
  ['+ bounds (numbers)', `SELECT count(*) FROM ${RECORDSET} ${NOW} WHERE ${CHECKS}`],
  ['+ bounds + regex', `SELECT count(*) FROM ${RECORDSET} ${NOW} WHERE ${CHECKS} AND ${REGEX}`],
  [
    '+ registry join',
    `SELECT count(reg.site_id) FROM ${RECORDSET} JOIN device_gateway.device_registry reg ON reg.device_id = b.d ${NOW} WHERE ${CHECKS} AND ${REGEX}`,
  ],
  [
    '+ ORDER BY b.d',
    `SELECT count(*) FROM (SELECT b.*, reg.site_id FROM ${RECORDSET} JOIN device_gateway.device_registry reg ON reg.device_id = b.d ${NOW} WHERE ${CHECKS} AND ${REGEX} ORDER BY b.d OFFSET 0) x`,
  ],
  [
    '0010: bounds as parameters, content check',
    `SELECT count(*) FROM ${RECORDSET} WHERE ${CHECKS.replaceAll('c.now_ms + 86400000', '$2::double precision')} AND ${REGEX.replace(/b\.(.c) ~ '\^\[0-9a-f\]\{16\}\$'/g, (_m, k: string) => `(octet_length(b.${k}) = 16 AND b.${k} ~ '^[0-9a-f]+$')`)}`,
  ],
  [
    'unnest of 16 text arrays (not used)',
    `SELECT count(*) FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::double precision[], $6::bigint[], $7::text[], $8::double precision[], $9::text[], $10::boolean[], $11::bigint[], $12::text[], $13::double precision[], $14::text[], $15::double precision[], $16::integer[]) AS b(d, dv, ds, dc, da, sv, sc, sa, st, sk, av, ac, aa, at, h, r)`,
  ],
];

async function main(): Promise<void> {
  const log: string[] = [];
  const server = await startPostgres({ onLog: (line) => log.push(line) });
  const owner = createDb<GatewayDatabase>(server.url, { max: 2 });
  await migrateToLatest(owner, [gatewayMigrations]);
  await seedBenchRegistry(owner, N);
  await owner.destroy();
  const c = new pg.Client({ connectionString: server.url });
  await c.connect();
  const { rows: fns } = await c.query<{ sig: string }>(
    `SELECT p.oid::regprocedure::text AS sig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'device_gateway' AND p.proname LIKE 'delivery_record%'`,
  );
  const hasArrays = fns.some((f) => f.sig.startsWith('device_gateway.delivery_record_arrays'));
  console.log(
    `bench:delivery-sql — ${N} registry rows, chunks of ${CHUNK}; functions: ${fns.map((f) => f.sig).join(', ')}`,
  );

  const call = async (fn: 'json' | 'arrays', rs: Row[], replica = REPLICA): Promise<void> => {
    if (fn === 'json')
      await c.query('SELECT device_gateway.delivery_record($1, $2::json)', [replica, JSON.stringify(rs)]);
    else
      await c.query(
        'SELECT device_gateway.delivery_record_arrays($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)',
        [replica, ...arrays(rs)],
      );
  };
  const wal = async (): Promise<string> =>
    (await c.query<{ l: string }>('SELECT pg_current_wal_insert_lsn()::text AS l')).rows[0]!.l;
  const walBytes = async (from: string): Promise<number> =>
    Number(
      (
        await c.query<{ b: string }>('SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)::bigint AS b', [
          from,
        ])
      ).rows[0]!.b,
    );

  /** Updates and HOT updates of the table so far (this session's statistics flushed first). */
  const updates = async (): Promise<{ upd: number; hot: number }> => {
    await c.query('SELECT pg_stat_force_next_flush()');
    await c.query('SELECT pg_stat_clear_snapshot()');
    const { rows: u } = await c.query<{ upd: string; hot: string }>(
      `SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_user_tables
       WHERE relid = 'device_gateway.device_delivery'::regclass`,
    );
    return { upd: Number(u[0]!.upd), hot: Number(u[0]!.hot) };
  };
  /** One pass over every device with `shape`: µs per row (client-side, the call's round trip) and WAL per row. */
  const build = (shape: Shape, version: number): Row[][] => {
    const chunks: Row[][] = [];
    for (let i = 0; i < N; i += CHUNK)
      chunks.push(rows(shape, i, Math.min(N, i + CHUNK), version, hex16(version)));
    return chunks;
  };
  const pass = async (
    fn: 'json' | 'arrays',
    shape: Shape,
    version: number,
    chunks = build(shape, version),
    replica = REPLICA,
  ): Promise<{ us: number; wal: number; hot: number }> => {
    const before = await updates();
    const lsn = await wal();
    const started = performance.now();
    for (const ch of chunks) await call(fn, ch, replica);
    const ms = performance.now() - started;
    const w = (await walBytes(lsn)) / N;
    const after = await updates();
    // The share of the pass's updates that were HOT (no new index entries), in %.
    const hot = after.upd > before.upd ? (100 * (after.hot - before.hot)) / (after.upd - before.upd) : 0;
    return { us: (1000 * ms) / N, wal: w, hot };
  };

  // Every device registered (a row with sent-unconfirmed and a relation), as a fan-out finds them.
  // BENCH_FILLFACTOR: the table's fillfactor before its rows are written (0012 sets 60; 100 is the default's).
  if (process.env.BENCH_FILLFACTOR)
    await c.query(
      `ALTER TABLE device_gateway.device_delivery SET (fillfactor = ${Number(process.env.BENCH_FILLFACTOR)})`,
    );
  await pass('json', 'registered', (clock += 1_000_000));
  await c.query('VACUUM ANALYZE device_gateway.device_delivery');
  const fnsToRun: ('json' | 'arrays')[] = hasArrays ? ['json', 'arrays', 'arrays', 'json'] : ['json', 'json'];
  // A round, as a reload makes them: a fan-out (desired, sent and acknowledged in one row: every device goes
  // from stale to acknowledged), then a desired change alone (acknowledged → stale), then its acknowledgements
  // alone (stale → acknowledged, same content), then the same acknowledgements again (a retried chunk: no change).
  console.log('\n-- whole function, µs per row (WAL bytes per row); ABBA when both exist');
  for (let round = 0; round < ROUNDS; round++)
    for (const fn of fnsToRun) {
      const out: string[] = [];
      const fan = await pass(fn, 'fanout', (clock += 1_000_000));
      out.push(`fanout ${fan.us.toFixed(1)} (${fan.wal.toFixed(0)} B, HOT ${fan.hot.toFixed(0)} %)`);
      const v = (clock += 1_000_000);
      const acks = build('acked', v);
      for (const [name, shape] of [
        ['desired', 'desired'],
        ['acked', 'acked'],
        ['acked again', 'acked'],
      ] as const) {
        const r = await pass(fn, shape, v, shape === 'acked' ? acks : undefined);
        out.push(`${name} ${r.us.toFixed(1)} (${r.wal.toFixed(0)} B, HOT ${r.hot.toFixed(0)} %)`);
      }
      // Registrations on a replica the rows do not list yet (a replica that restarted: each row gains it in
      // observed_by; 0010 does that in a second statement, 0011 in the upsert), then that replica reaped.
      const other = hex16(clock);
      const reg = await pass(fn, 'registered', (clock += 1_000_000), undefined, other);
      out.push(`registered ${reg.us.toFixed(1)} (${reg.wal.toFixed(0)} B, HOT ${reg.hot.toFixed(0)} %)`);
      // The reap of a replica every row names (a replica that died): each row's observed_by shrinks.
      const reapStarted = performance.now();
      const reapBefore = await updates();
      await c.query('SELECT device_gateway.delivery_reap($1)', [REPLICA]);
      const reapAfter = await updates();
      out.push(
        `reap ${((1000 * (performance.now() - reapStarted)) / N).toFixed(1)} (HOT ${((100 * (reapAfter.hot - reapBefore.hot)) / Math.max(1, reapAfter.upd - reapBefore.upd)).toFixed(0)} %)`,
      );
      console.log(`  ${fn.padEnd(6)} ${out.join('   ')}`);
    }
  const { rows: size } = await c.query<{ t: string; i: string; ff: string | null }>(
    `SELECT pg_size_pretty(pg_table_size('device_gateway.device_delivery')) AS t,
            pg_size_pretty(pg_indexes_size('device_gateway.device_delivery')) AS i,
            (SELECT array_to_string(reloptions, ',') FROM pg_class
             WHERE oid = 'device_gateway.device_delivery'::regclass) AS ff`,
  );
  console.log(
    `  table ${size[0]!.t}, indexes ${size[0]!.i} (${size[0]!.ff ?? 'fillfactor 100'}; no VACUUM since the first pass)`,
  );

  // The parts of the statement, one fan-out chunk, best of 20.
  console.log('\n-- parts of the statement (one fan-out chunk), µs per row, best of 20');
  const chunk = rows('fanout', 0, CHUNK, (clock += 1_000_000), hex16(clock));
  const json = JSON.stringify(chunk);
  const arrs = arrays(chunk);
  for (const [name, text] of PARTS) {
    const params = text.includes('unnest')
      ? arrs
      : text.includes('$2')
        ? [json, Date.now() + 86_400_000]
        : [json];
    let best = Infinity;
    for (let k = 0; k < 20; k++) {
      const t = performance.now();
      await c.query(text, params);
      best = Math.min(best, performance.now() - t);
    }
    console.log(`  ${name.padEnd(40)} ${((1000 * best) / CHUNK).toFixed(2)}`);
  }
  let best = Infinity;
  for (let k = 0; k < 20; k++) {
    const t = performance.now();
    await c.query('SELECT 1');
    best = Math.min(best, performance.now() - t);
  }
  console.log(`  ${'(round trip of SELECT 1, per chunk, ms)'.padEnd(40)} ${best.toFixed(2)}`);

  // Each index's share: a fan-out chunk and an ack-only chunk written with and without it, in a transaction
  // rolled back (DROP INDEX inside it), alternated, best of 7.
  console.log(
    '\n-- index maintenance: µs per row of one chunk with the index dropped, against all kept (rolled back)',
  );
  const { rows: idx } = await c.query<{ i: string }>(
    `SELECT indexrelid::regclass::text AS i FROM pg_index WHERE indrelid = 'device_gateway.device_delivery'::regclass AND NOT indisprimary`,
  );
  for (const shape of ['fanout', 'acked'] as const) {
    const timed = async (drop: string | null): Promise<number> => {
      let b = Infinity;
      for (let k = 0; k < 7; k++) {
        const v = (clock += 1_000_000);
        const rs = rows(shape, 20_000, 20_000 + CHUNK, v, hex16(v));
        await c.query('BEGIN');
        // Acknowledgements of a desired change (stale → acknowledged), or a fan-out's new version.
        if (shape === 'acked') await call('json', rows('desired', 20_000, 20_000 + CHUNK, v, hex16(v)));
        if (drop !== null) await c.query(`DROP INDEX ${drop}`);
        const t = performance.now();
        await call('json', rs);
        b = Math.min(b, performance.now() - t);
        await c.query('ROLLBACK');
      }
      return (1000 * b) / CHUNK;
    };
    const all = await timed(null);
    const parts = [];
    for (const { i } of idx)
      parts.push(
        `${i.replace('device_gateway.device_delivery_', '')} −${(all - (await timed(i))).toFixed(1)}`,
      );
    const { rows: allIdx } = await c.query<{ i: string }>(
      `SELECT string_agg(indexrelid::regclass::text, ', ') AS i FROM pg_index WHERE indrelid = 'device_gateway.device_delivery'::regclass AND NOT indisprimary`,
    );
    await c.query('BEGIN');
    for (const { i } of idx) await c.query(`DROP INDEX ${i}`);
    const v = (clock += 1_000_000);
    const rs = rows(shape, 20_000, 20_000 + CHUNK, v, hex16(v));
    if (shape === 'acked') await call('json', rows('desired', 20_000, 20_000 + CHUNK, v, hex16(v)));
    await call('json', rows(shape, 90_000, 90_001, v, hex16(v)));
    const t = performance.now();
    await call('json', rs);
    const none = (1000 * (performance.now() - t)) / CHUNK;
    await c.query('ROLLBACK');
    console.log(
      `  ${shape}: all ${all.toFixed(1)}; without ${parts.join(', ')}; without all four ${none.toFixed(1)} (${allIdx[0]?.i ?? ''})`,
    );
  }

  // The statement's plan inside the function (auto_explain of nested statements), one fan-out chunk.
  console.log('\n-- plan of the statement inside the function (auto_explain, one fan-out chunk)');
  for (const fn of hasArrays ? (['json', 'arrays'] as const) : (['json'] as const)) {
    await c.query(`LOAD 'auto_explain'`);
    await c.query(
      `SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on;
       SET auto_explain.log_wal = on; SET auto_explain.log_timing = on; SET auto_explain.log_nested_statements = on;
       SET client_min_messages = log; SET auto_explain.log_level = notice`,
    );
    const notices: string[] = [];
    const onNotice = (n: { message?: string }): void => void notices.push(n.message ?? '');
    c.on('notice', onNotice);
    await call(fn, rows('fanout', 40_000, 40_000 + CHUNK, (clock += 1_000_000), hex16(clock)));
    c.off('notice', onNotice);
    await c.query('SET auto_explain.log_min_duration = -1');
    const plan =
      notices.find((n) => n.includes('INSERT INTO device_gateway.device_delivery')) ?? notices.join('\n');
    console.log(
      `  [${fn}]\n` +
        plan.replace(/Query Text:[\s\S]*?(?=\n\S*(Insert|Update|Result|Function))/, 'Query Text: …'),
    );
  }
  await c.end();
  await server.destroy();
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
