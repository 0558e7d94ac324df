// Idempotency-Key for upload intents: a phone on a bad network retries POST /sites/{id}/media/upload-intents,
// and each retry created another pending media item. With a key, the first use creates the item and records
// the key; a retry with the same key and body gets the first answer again, with another body a conflict.
//
// What a key row holds: the media item it created and the instant its upload URL was signed. The answer is
// rebuilt from those (the item's key, type, size and checksum, signed again at that instant with the same
// lifetime): SigV4 is deterministic, so the replayed URL is byte for byte the first one, and no upload URL,
// a credential, is ever stored in the database.
//
// Racing first uses: the key is inserted in the same transaction as the item. The second insert of the
// same (caller, key) waits for the first transaction; if it committed, the second finds a conflict, rolls
// back its own item and replays the first answer; so one key makes one item.
//
// Self-contained SQL: no helper of an earlier migration is imported, so this file reads as what it does.
import { sql } from 'kysely';
import type { Kysely, Migration } from 'kysely';
import { withGeneratedSql } from '@platform/service-kit';

const TENANT_CHECK = `company_id = (SELECT COALESCE(NULLIF(pg_catalog.current_setting('enterprise.company_hint', true), '')::pg_catalog.uuid, enterprise_api.authorized_company_id()))
    AND site_id = ANY ((SELECT CASE WHEN pg_catalog.current_setting('enterprise.company_hint', true) OPERATOR(pg_catalog.=) '00000000-0000-0000-0000-000000000000' THEN '{}'::pg_catalog.uuid[]
      ELSE enterprise_api.authorized_site_ids() END)::uuid[])`;

const UP_SQL = `
CREATE TABLE enterprise.upload_intent_idempotency_keys (
  caller_sub text NOT NULL,
  idempotency_key text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
  site_id uuid NOT NULL,
  company_id uuid NOT NULL,
  media_id uuid NOT NULL REFERENCES enterprise.media_items (id) ON DELETE CASCADE,
  request_fingerprint text NOT NULL,
  signed_at timestamptz NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (caller_sub, idempotency_key),
  FOREIGN KEY (site_id, company_id) REFERENCES enterprise.sites (id, company_id)
);
CREATE INDEX upload_intent_idempotency_keys_created_idx ON enterprise.upload_intent_idempotency_keys (created_at);
CREATE INDEX upload_intent_idempotency_keys_media_idx ON enterprise.upload_intent_idempotency_keys (media_id);
COMMENT ON TABLE enterprise.upload_intent_idempotency_keys IS 'Idempotency-Key replay store for upload intents: a retried intent with the same key from the same caller gets the first answer, rebuilt from the media item it created.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.caller_sub IS 'JWT "sub" of the caller; keys are scoped per caller.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.idempotency_key IS 'Value of the Idempotency-Key header.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.site_id IS 'Site of the intent.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.company_id IS 'Tenant; always the site''s company.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.media_id IS 'The pending media item the first use created.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.request_fingerprint IS 'Hash of the site and the request body; the same key with another request is a conflict.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.signed_at IS 'When the first answer''s upload URL was signed; a replay signs again at this instant, which gives the same URL.';
COMMENT ON COLUMN enterprise.upload_intent_idempotency_keys.created_at IS 'When the key was first used; entries older than the replay window may be deleted.';

CREATE TRIGGER upload_intent_idempotency_keys_company BEFORE INSERT OR UPDATE OF site_id, company_id
  ON enterprise.upload_intent_idempotency_keys
  FOR EACH ROW EXECUTE FUNCTION enterprise.set_company_from_site();

ALTER TABLE enterprise.upload_intent_idempotency_keys ENABLE ROW LEVEL SECURITY, FORCE ROW LEVEL SECURITY;
REVOKE ALL ON enterprise.upload_intent_idempotency_keys FROM PUBLIC;
GRANT SELECT, DELETE ON enterprise.upload_intent_idempotency_keys TO enterprise_api_role;
GRANT INSERT (caller_sub, idempotency_key, site_id, media_id, request_fingerprint, signed_at, created_at)
  ON enterprise.upload_intent_idempotency_keys TO enterprise_api_role;
CREATE POLICY api_own_upload_intent_keys ON enterprise.upload_intent_idempotency_keys FOR ALL TO enterprise_api_role
  USING (caller_sub = (SELECT enterprise_api.request_sub()) AND ${TENANT_CHECK})
  WITH CHECK (caller_sub = (SELECT enterprise_api.request_sub()) AND ${TENANT_CHECK});
`;

const DOWN_SQL = `DROP TABLE enterprise.upload_intent_idempotency_keys;`;

export const uploadIntentKeysMigration: Migration = withGeneratedSql(UP_SQL + DOWN_SQL, {
  async up(db: Kysely<unknown>): Promise<void> {
    await sql.raw(UP_SQL).execute(db);
  },
  async down(db: Kysely<unknown>): Promise<void> {
    await sql.raw(DOWN_SQL).execute(db);
  },
});
