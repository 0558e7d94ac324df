import { sql, type Kysely, type Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const LOGIN = 'device_gateway_login';

/**
 * Replicas (design §3.6): what the replica bus needs in the database, and exactly the rights the gateway's login gets for it.
 *
 * - `bus_overrides`: the last override message per device (retained message), so a replica that was not
 *   listening when it went by (started later, or its LISTEN connection broke) still learns it. It is not
 *   the registry: reload never reads it, and `desired_settings` stays untouched.
 * - The login gets no INSERT/UPDATE/DELETE on it. It may only EXECUTE two SECURITY DEFINER functions, which
 *   do the one write each message needs (last-writer-wins upsert, or dropping retained messages of devices
 *   that left the registry) and the `pg_notify` in the same transaction, plus SELECT to resynchronise.
 * - LISTEN and NOTIFY themselves need no grant: PostgreSQL has no privilege for them (any session of the
 *   database may use any channel), which is why receivers validate every message.
 * - Functions have a fixed search_path (pg_catalog) and fully qualified names, so the login cannot
 *   redirect them with objects of its own; EXECUTE is revoked from PUBLIC.
 */
/**
 * `device_gateway.bus_publish_overrides(text[])`. `checkRegistry` (migration 0003): a message about a device
 * that is not enabled in the registry is neither retained nor sent, and its slot in the result is NULL
 * (false still means "a newer override won"), so a replica whose registry is a reload behind answers 404
 * rather than "updated", and a replica's write-back after its resync cannot put back the override of a
 * device that left the registry in the meantime.
 */
function publishOverridesFunction(create: 'CREATE' | 'CREATE OR REPLACE', checkRegistry: boolean): string {
  const registryCheck = checkRegistry
    ? `
          IF NOT EXISTS (
            SELECT 1 FROM device_gateway.device_registry r WHERE r.device_id = m->>'d' AND r.enabled
          ) THEN
            written := written || NULL::boolean;
            CONTINUE;
          END IF;`
    : '';
  return `
      ${create} FUNCTION device_gateway.bus_publish_overrides(p_payloads text[]) RETURNS boolean[]
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
      DECLARE
        p text;
        m jsonb;
        written boolean[] := '{}';
      BEGIN
        -- Several messages per call: under load the bus commits a batch in one transaction (group commit).
        FOREACH p IN ARRAY p_payloads LOOP
          m := p::jsonb;
          IF m->>'k' IS DISTINCT FROM 'override' OR jsonb_typeof(m->'s') IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'not an override message' USING ERRCODE = '22023';
          END IF;${registryCheck}
          INSERT INTO device_gateway.bus_overrides AS b (device_id, version, origin, settings)
          VALUES (m->>'d', (m->>'v')::bigint, m->>'o', m->'s')
          ON CONFLICT (device_id) DO UPDATE
            SET version = excluded.version, origin = excluded.origin, settings = excluded.settings,
                published_at = now()
            WHERE (excluded.version, excluded.origin) > (b.version, b.origin);
          -- Only a message that won is sent; NOTIFY is delivered when this transaction commits.
          IF FOUND THEN
            PERFORM pg_catalog.pg_notify('device_gateway_bus', p);
          END IF;
          written := written || FOUND;
        END LOOP;
        RETURN written;
      END $$`;
}

export const clusterBusMigration: Migration = withGeneratedSql(publishOverridesFunction('CREATE', false), {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql`
      CREATE TABLE device_gateway.bus_overrides (
        device_id text PRIMARY KEY CHECK (device_id ~ '^[A-Za-z0-9._:-]{1,128}$'),
        -- The accepting replica's hybrid-logical-clock stamp (µs); with origin, the last-writer-wins key.
        version bigint NOT NULL CHECK (version > 0),
        origin text COLLATE "C" NOT NULL CHECK (origin ~ '^[A-Za-z0-9._:-]{1,64}$'),
        settings jsonb NOT NULL CHECK (jsonb_typeof(settings) = 'object'),
        published_at timestamptz NOT NULL DEFAULT now()
      )`.execute(db);
    await sql.raw(publishOverridesFunction('CREATE', false)).execute(db);
    await sql`
      CREATE FUNCTION device_gateway.bus_publish_reload(p_payload text) RETURNS void
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
      BEGIN
        IF (p_payload::jsonb)->>'k' IS DISTINCT FROM 'reload' THEN
          RAISE EXCEPTION 'not a reload message' USING ERRCODE = '22023';
        END IF;
        -- A device that left the registry (deleted or disabled) loses its override, as in one process.
        DELETE FROM device_gateway.bus_overrides b
        WHERE NOT EXISTS (
          SELECT 1 FROM device_gateway.device_registry r WHERE r.device_id = b.device_id AND r.enabled
        );
        PERFORM pg_catalog.pg_notify('device_gateway_bus', p_payload);
      END $$`.execute(db);
    for (const fn of ['bus_publish_overrides(text[])', 'bus_publish_reload(text)']) {
      await sql.raw(`REVOKE ALL ON FUNCTION device_gateway.${fn} FROM PUBLIC`).execute(db);
      await sql.raw(`GRANT EXECUTE ON FUNCTION device_gateway.${fn} TO ${LOGIN}`).execute(db);
    }
    await sql.raw(`GRANT SELECT ON device_gateway.bus_overrides TO ${LOGIN}`).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql`DROP FUNCTION device_gateway.bus_publish_reload(text)`.execute(db);
    await sql`DROP FUNCTION device_gateway.bus_publish_overrides(text[])`.execute(db);
    await sql`DROP TABLE device_gateway.bus_overrides`.execute(db);
  },
});

/**
 * The override stays memory only (design §3.6): the database carries the message, not the state. The retained
 * table is how a replica that was not listening learns the overrides the live replicas hold, so it must not
 * outlive them: an override lasts as long as at least one replica is up (a rolling restart keeps it, as the
 * device moving between replicas requires), and a gateway that stops altogether forgets it, as one process does.
 *
 * `bus_join()` runs once per process on its LISTEN connection, before the first resync. When no other replica
 * of this database is up, what the table holds belongs to a gateway that no longer exists: it is deleted, and
 * the highest version it held is returned so the joiner's clock starts above it. "Up" is a session of the
 * same login named `device-gateway-bus <origin>` without the ` joining` suffix a process carries until its
 * first resync: replicas starting together after a full stop do not count each other and clear the table
 * (the advisory lock makes them take turns; the later one finds it empty), while a replica that holds
 * overrides counts from its first resync on, reconnects included, as does one of the previous release.
 * Only sessions of the gateway's own login count (`session_user` is the caller inside SECURITY DEFINER),
 * so no other role can keep a stale table alive by choosing a name.
 */
export const clusterLifetimeMigration: Migration = withGeneratedSql(
  publishOverridesFunction('CREATE OR REPLACE', true) + publishOverridesFunction('CREATE OR REPLACE', false),
  {
    async up(db: Kysely<unknown>): Promise<void> {
      await sql`
      CREATE FUNCTION device_gateway.bus_join(OUT cleared integer, OUT top_version bigint)
      LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
      BEGIN
        cleared := 0;
        PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('device_gateway.bus_join'));
        IF EXISTS (
          SELECT 1 FROM pg_catalog.pg_stat_activity a
          WHERE a.datname = pg_catalog.current_database()
            AND a.pid <> pg_catalog.pg_backend_pid()
            AND a.usename = session_user
            AND a.application_name LIKE 'device-gateway-bus %'
            AND a.application_name NOT LIKE '% joining'
        ) THEN
          RETURN;
        END IF;
        SELECT pg_catalog.max(b.version) INTO top_version FROM device_gateway.bus_overrides b;
        DELETE FROM device_gateway.bus_overrides;
        GET DIAGNOSTICS cleared = ROW_COUNT;
      END $$`.execute(db);
      await sql.raw(`REVOKE ALL ON FUNCTION device_gateway.bus_join() FROM PUBLIC`).execute(db);
      await sql.raw(`GRANT EXECUTE ON FUNCTION device_gateway.bus_join() TO ${LOGIN}`).execute(db);
      // CREATE OR REPLACE keeps the owner and the grants of migration 0002.
      await sql.raw(publishOverridesFunction('CREATE OR REPLACE', true)).execute(db);
    },
    async down(db: Kysely<unknown>): Promise<void> {
      await sql.raw(publishOverridesFunction('CREATE OR REPLACE', false)).execute(db);
      await sql`DROP FUNCTION device_gateway.bus_join()`.execute(db);
    },
  },
);
