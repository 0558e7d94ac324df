import { sql, type Kysely, type Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

/**
 * 0005: the delivery record (design §3.8), one row per device, shared by every replica and kept across restarts:
 * what the device should have (desired), what was last sent to it, what it last acknowledged, when it was last
 * heard from, and which replicas it observes now.
 *
 * - Versions come from each replica's clock (design §3.6): two replicas that load the same registry row give it
 *   different versions. So "the device has what it should" is decided by content, not by version number: each
 *   `*_content` is a 64-bit hash (16 hex digits) of the document's content key (everything a device sees but the
 *   version), and each part keeps the version and time of its newest event (the highest version wins; replicas'
 *   versions are ordered by the hybrid logical clock).
 * - `desired_at` is when the desired content was first recorded: it does not move when another replica records
 *   the same content under its own version. The fleet list pages by it, oldest first.
 * - `observed_by` lists the replicas (bus origins) on which the device holds a relation to its settings. A
 *   replica that stops cleanly removes itself; the rows of one that died are cleaned by `delivery_reap`, which
 *   keeps only replicas whose bus session is up (the rule of bus_join, migration 0003).
 * - Times arrive as milliseconds since the epoch (numbers: cheaper to encode than ISO text, 100,000 rows a batch).
 * - Indexes: every write of a device's row is a non-HOT update (its state or desired_at changes), so each index
 *   costs every write. The list needs an order by (desired_at, device_id), with and without a site; the
 *   filters that matter to on-call (pending, stale, unobserved) get partial indexes over the rows that are not
 *   acknowledged, so the common write (a device acknowledging) touches neither of them. `acknowledged` is
 *   listed by walking the order index with a filter; reaping scans the rows that list a replica.
 * - `state` is derived in the row, so the list filters on an index: acknowledged (the device acknowledged the
 *   desired content), unobserved (not acknowledged, and no relation anywhere), pending (the desired content was
 *   sent and not acknowledged: a NON notification stays here, "sent, unconfirmed"), stale (observed, and the
 *   desired content has not been sent: the device holds an older one).
 * - The gateway's login writes only through the SECURITY DEFINER functions below, like the bus (0002), in
 *   batches (design §3.8: one call per flush, never one per event). A device that leaves the registry takes its
 *   row with it (ON DELETE CASCADE); rows of devices not in the registry are never written.
 */
const DELIVERY_UP = `
CREATE TABLE device_gateway.device_delivery (
  device_id text PRIMARY KEY REFERENCES device_gateway.device_registry (device_id) ON DELETE CASCADE,
  site_id uuid,
  desired_version bigint,
  desired_source text CHECK (desired_source IN ('registry', 'override')),
  desired_content text,
  desired_at timestamptz NOT NULL,
  sent_version bigint,
  sent_content text,
  sent_at timestamptz,
  sent_by text,
  sent_transport text CHECK (sent_transport IN ('plain', 'dtls')),
  sent_confirmable boolean,
  acked_version bigint,
  acked_content text,
  acked_at timestamptz,
  acked_by text,
  acked_transport text CHECK (acked_transport IN ('plain', 'dtls')),
  heard_at timestamptz,
  observed_by text[] NOT NULL DEFAULT '{}',
  state text NOT NULL GENERATED ALWAYS AS (
    CASE
      WHEN acked_content IS NOT NULL AND acked_content = desired_content THEN 'acknowledged'
      WHEN cardinality(observed_by) = 0 THEN 'unobserved'
      WHEN sent_content IS NOT NULL AND sent_content = desired_content THEN 'pending'
      ELSE 'stale'
    END
  ) STORED,
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX device_delivery_page_idx ON device_gateway.device_delivery (desired_at, device_id);

CREATE INDEX device_delivery_site_idx ON device_gateway.device_delivery (site_id, desired_at, device_id);

CREATE INDEX device_delivery_open_idx ON device_gateway.device_delivery (state, desired_at, device_id)
  WHERE state <> 'acknowledged';

CREATE INDEX device_delivery_site_open_idx
  ON device_gateway.device_delivery (site_id, state, desired_at, device_id)
  WHERE state <> 'acknowledged';

CREATE FUNCTION device_gateway.delivery_record(p_replica text, p_batch json) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
  written integer;
BEGIN
  IF p_replica !~ '^[0-9a-f]{16}$' OR json_typeof(p_batch) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'invalid delivery batch' USING ERRCODE = '22023';
  END IF;
  -- json, not jsonb: read once, front to back, json_to_recordset costs about half of jsonb's conversion.
  -- One row per device in a batch (the recorder merges events per device); a device not in the registry is
  -- skipped. NULL fields mean "no news": each part moves only to a higher version.
  INSERT INTO device_gateway.device_delivery AS t (
    device_id, site_id, desired_version, desired_source, desired_content, desired_at,
    sent_version, sent_content, sent_at, sent_by, sent_transport, sent_confirmable,
    acked_version, acked_content, acked_at, acked_by, acked_transport, heard_at, observed_by)
  SELECT b.d, reg.site_id, b.dv, b.ds, b.dc, coalesce(to_timestamp(b.da / 1000.0), now()),
         b.sv, b.sc, to_timestamp(b.sa / 1000.0), CASE WHEN b.sv IS NULL THEN NULL ELSE p_replica END, b.st, b.sk,
         b.av, b.ac, to_timestamp(b.aa / 1000.0), CASE WHEN b.av IS NULL THEN NULL ELSE p_replica END, b.at,
         to_timestamp(b.h / 1000.0),
         CASE WHEN b.r > 0 THEN ARRAY[p_replica] ELSE '{}'::text[] END
  FROM json_to_recordset(p_batch) AS b(
    d text, s uuid, dv bigint, ds text, dc text, da double precision,
    sv bigint, sc text, sa double precision, st text, sk boolean,
    av bigint, ac text, aa double precision, at text, h double precision, r integer)
  JOIN device_gateway.device_registry reg ON reg.device_id = b.d
  -- What the replicas send, bounded, so no caller (the login is the only one) can make a row lie for good: a
  -- version is a µs clock reading (design §3.6) within a day of now, a content is 16 hex digits, a time is
  -- within [2020, now + 1 day]. A row outside them is skipped, not written (the batch goes on).
  CROSS JOIN LATERAL (SELECT (extract(epoch FROM now()) * 1000)::double precision AS now_ms) c
  WHERE coalesce(b.dv, 0) BETWEEN 0 AND (c.now_ms + 86400000) * 1000
    AND coalesce(b.sv, 0) BETWEEN 0 AND (c.now_ms + 86400000) * 1000
    AND coalesce(b.av, 0) BETWEEN 0 AND (c.now_ms + 86400000) * 1000
    AND (b.dc IS NULL OR b.dc ~ '^[0-9a-f]{16}$')
    AND (b.sc IS NULL OR b.sc ~ '^[0-9a-f]{16}$')
    AND (b.ac IS NULL OR b.ac ~ '^[0-9a-f]{16}$')
    AND coalesce(b.da, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000
    AND coalesce(b.sa, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000
    AND coalesce(b.aa, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000
    AND coalesce(b.h, 1600000000000) BETWEEN 1577836800000 AND c.now_ms + 86400000
  ON CONFLICT (device_id) DO UPDATE SET
    site_id = excluded.site_id,
    desired_at = CASE
      WHEN excluded.desired_version IS NULL OR excluded.desired_version <= coalesce(t.desired_version, -1)
        OR excluded.desired_content IS NOT DISTINCT FROM t.desired_content THEN t.desired_at
      ELSE excluded.desired_at END,
    desired_version = CASE WHEN excluded.desired_version > coalesce(t.desired_version, -1)
      THEN excluded.desired_version ELSE t.desired_version END,
    desired_source = CASE WHEN excluded.desired_version > coalesce(t.desired_version, -1)
      THEN excluded.desired_source ELSE t.desired_source END,
    desired_content = CASE WHEN excluded.desired_version > coalesce(t.desired_version, -1)
      THEN excluded.desired_content ELSE t.desired_content END,
    sent_version = CASE WHEN excluded.sent_version >= coalesce(t.sent_version, -1)
      THEN excluded.sent_version ELSE t.sent_version END,
    sent_content = CASE WHEN excluded.sent_version >= coalesce(t.sent_version, -1)
      THEN excluded.sent_content ELSE t.sent_content END,
    sent_at = CASE WHEN excluded.sent_version >= coalesce(t.sent_version, -1)
      THEN excluded.sent_at ELSE t.sent_at END,
    sent_by = CASE WHEN excluded.sent_version >= coalesce(t.sent_version, -1)
      THEN excluded.sent_by ELSE t.sent_by END,
    sent_transport = CASE WHEN excluded.sent_version >= coalesce(t.sent_version, -1)
      THEN excluded.sent_transport ELSE t.sent_transport END,
    sent_confirmable = CASE WHEN excluded.sent_version >= coalesce(t.sent_version, -1)
      THEN excluded.sent_confirmable ELSE t.sent_confirmable END,
    acked_version = CASE WHEN excluded.acked_version >= coalesce(t.acked_version, -1)
      THEN excluded.acked_version ELSE t.acked_version END,
    acked_content = CASE WHEN excluded.acked_version >= coalesce(t.acked_version, -1)
      THEN excluded.acked_content ELSE t.acked_content END,
    acked_at = CASE WHEN excluded.acked_version >= coalesce(t.acked_version, -1)
      THEN excluded.acked_at ELSE t.acked_at END,
    acked_by = CASE WHEN excluded.acked_version >= coalesce(t.acked_version, -1)
      THEN excluded.acked_by ELSE t.acked_by END,
    acked_transport = CASE WHEN excluded.acked_version >= coalesce(t.acked_version, -1)
      THEN excluded.acked_transport ELSE t.acked_transport END,
    heard_at = greatest(excluded.heard_at, t.heard_at),
    updated_at = now();
  GET DIAGNOSTICS written = ROW_COUNT;
  -- Relations: r is this replica's count of relations to the device's settings (absent: unchanged). Most
  -- batches have none (a fan-out changes no relation): the path test skips reading the batch a second time.
  IF strpos(p_batch::text, '"r":') = 0 THEN
    RETURN written;
  END IF;
  UPDATE device_gateway.device_delivery t
  SET observed_by = CASE WHEN b.r > 0 THEN array_append(t.observed_by, p_replica)
                         ELSE array_remove(t.observed_by, p_replica) END
  FROM json_to_recordset(p_batch) AS b(d text, r integer)
  WHERE b.r IS NOT NULL AND t.device_id = b.d
    AND (b.r > 0) IS DISTINCT FROM (p_replica = ANY (t.observed_by));
  RETURN written;
END $$;

-- Replicas whose bus session is up (the rule of bus_join, migration 0003: sessions of this login named
-- 'device-gateway-bus <origin>'), plus the caller's own id when given (a replica without the bus); every other
-- replica is removed from observed_by. Run by every replica now and then, and with NULL by a replica that
-- stops, after its bus session ended. No caller can remove a replica whose bus session is up.
CREATE FUNCTION device_gateway.delivery_reap(p_self text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
  alive text[];
  reaped integer;
BEGIN
  SELECT coalesce(array_agg(DISTINCT split_part(a.application_name, ' ', 2)), '{}') INTO alive
  FROM pg_catalog.pg_stat_activity a
  WHERE a.datname = pg_catalog.current_database()
    AND a.usename = session_user
    AND a.application_name LIKE 'device-gateway-bus %';
  IF p_self IS NOT NULL THEN
    alive := array_append(alive, p_self);
  END IF;
  UPDATE device_gateway.device_delivery t
  SET observed_by = ARRAY(SELECT o FROM unnest(t.observed_by) o WHERE o = ANY (alive))
  WHERE cardinality(t.observed_by) > 0 AND NOT (t.observed_by <@ alive);
  GET DIAGNOSTICS reaped = ROW_COUNT;
  RETURN reaped;
END $$;

REVOKE ALL ON FUNCTION device_gateway.delivery_record(text, json) FROM PUBLIC;

GRANT EXECUTE ON FUNCTION device_gateway.delivery_record(text, json) TO device_gateway_login;

REVOKE ALL ON FUNCTION device_gateway.delivery_reap(text) FROM PUBLIC;

GRANT EXECUTE ON FUNCTION device_gateway.delivery_reap(text) TO device_gateway_login;

GRANT SELECT ON device_gateway.device_delivery TO device_gateway_login;

-- The device view's answers between replicas (design §3.8). A request goes over NOTIFY (a device id), but an
-- answer holds what only the gateway may know (PSK identities, peer addresses), and any session of the database
-- may LISTEN: so answers are kept here, readable by the login alone, and the NOTIFY says only which query and
-- replica. Kept a minute.
CREATE TABLE device_gateway.inspect_answers (
  query_id uuid NOT NULL,
  replica text NOT NULL CHECK (replica ~ '^[0-9a-f]{16}$'),
  answer json NOT NULL CHECK (octet_length(answer::text) <= 65536),
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (query_id, replica)
);

CREATE FUNCTION device_gateway.inspect_answer(p_query uuid, p_replica text, p_answer json) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
  DELETE FROM device_gateway.inspect_answers WHERE created_at < now() - interval '1 minute';
  INSERT INTO device_gateway.inspect_answers (query_id, replica, answer) VALUES (p_query, p_replica, p_answer)
  ON CONFLICT DO NOTHING;
  PERFORM pg_catalog.pg_notify('device_gateway_inspect',
    pg_catalog.json_build_object('k', 'a', 'q', p_query, 'o', p_replica)::text);
END $$;

REVOKE ALL ON FUNCTION device_gateway.inspect_answer(uuid, text, json) FROM PUBLIC;

GRANT EXECUTE ON FUNCTION device_gateway.inspect_answer(uuid, text, json) TO device_gateway_login;

GRANT SELECT ON device_gateway.inspect_answers TO device_gateway_login;
`;

const DELIVERY_DOWN = `
DROP FUNCTION device_gateway.inspect_answer(uuid, text, json);

DROP TABLE device_gateway.inspect_answers;

DROP FUNCTION device_gateway.delivery_reap(text);

DROP FUNCTION device_gateway.delivery_record(text, json);

DROP TABLE device_gateway.device_delivery;
`;

export const deliveryMigration: Migration = withGeneratedSql(DELIVERY_UP + DELIVERY_DOWN, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DELIVERY_UP).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DELIVERY_DOWN).execute(db);
  },
});
