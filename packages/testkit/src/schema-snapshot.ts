// A normalised, readable text of what migrations built: every object of the given schemas with its
// definition, owner, grants, row-level security and policies, and the given roles with their memberships.
// Checked in beside the migrations and compared by a test, it makes every schema change a readable diff.
// (pg_dump --schema-only would serve, but no pg_dump matching the embedded PostgreSQL 18 is on these
// machines; the catalog functions below are the ones pg_dump itself prints definitions with.)
import pg from 'pg';

export interface SchemaSnapshotOptions {
  /** Schemas whose objects are listed. */
  schemas: readonly string[];
  /** Roles listed with their attributes and memberships (roles are cluster-wide, so named explicitly). */
  roles: readonly string[];
}

/** The role running the migrations varies (a superuser in tests, an owner login in production). */
const MIGRATOR = '<migrator>';

/** `$3` for the migrating role itself, else the role's name. */
const roleName = (oid: string): string =>
  `CASE WHEN ${oid} = (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN $3::text ELSE ${oid}::regrole::text END`;

/** An ACL as sorted `grantee:privilege` items (`*` grantable), grantors left out; `-` for the default. */
const acl = (expr: string): string =>
  `(SELECT coalesce(string_agg(i, ',' ORDER BY i), '-') FROM (
     SELECT CASE WHEN x.grantee = 0 THEN 'PUBLIC' ELSE ${roleName('x.grantee')} END || ':' || x.privilege_type
            || CASE WHEN x.is_grantable THEN '*' ELSE '' END AS i
     FROM aclexplode(${expr}) x) items)`;

/** Section title and query; each query yields one `line` per object. */
const QUERIES: ReadonlyArray<readonly [string, string]> = [
  [
    'roles',
    `SELECT r.rolname || ' ' || concat_ws(' ',
         CASE WHEN r.rolcanlogin THEN 'LOGIN' ELSE 'NOLOGIN' END,
         CASE WHEN r.rolinherit THEN 'INHERIT' ELSE 'NOINHERIT' END,
         CASE WHEN r.rolsuper THEN 'SUPERUSER' END, CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END,
         CASE WHEN r.rolcreatedb THEN 'CREATEDB' END, CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END) AS line
     FROM pg_roles r WHERE r.rolname = ANY ($2)`,
  ],
  [
    'role memberships',
    `SELECT g.rolname || ' TO ' || m.rolname || ' WITH INHERIT ' || a.inherit_option || ', SET ' || a.set_option
            || ', ADMIN ' || a.admin_option AS line
     FROM pg_auth_members a JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member
     WHERE g.rolname = ANY ($2) AND m.rolname = ANY ($2)`,
  ],
  [
    'schemas',
    `SELECT n.nspname || ' OWNER ' || ${roleName('n.nspowner')} || ' ACL ' || ${acl('n.nspacl')} ||
            ' COMMENT ' || coalesce(obj_description(n.oid, 'pg_namespace'), '-') AS line
     FROM pg_namespace n WHERE n.nspname = ANY ($1)`,
  ],
  [
    'tables and views',
    `SELECT c.relkind::text || ' ' || c.oid::regclass::text
            || ' RLS ' || c.relrowsecurity || ' FORCE ' || c.relforcerowsecurity
            || ' OWNER ' || ${roleName('c.relowner')}
            || ' OPTIONS ' || coalesce(c.reloptions::text, '-') || ' ACL ' || ${acl('c.relacl')}
            || ' COMMENT ' || coalesce(obj_description(c.oid, 'pg_class'), '-') AS line
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = ANY ($1) AND c.relkind IN ('r', 'p', 'v', 'm', 'f')`,
  ],
  [
    'columns',
    `SELECT c.oid::regclass::text || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
            || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
            || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
            || CASE WHEN a.attgenerated::text <> '' THEN ' GENERATED ' || pg_get_expr(d.adbin, d.adrelid)
                    WHEN d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid) ELSE '' END
            || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
                    THEN ' COLLATE ' || a.attcollation::regcollation::text ELSE '' END
            || CASE WHEN a.attacl IS NOT NULL THEN ' ACL ' || ${acl('a.attacl')} ELSE '' END
            || ' COMMENT ' || coalesce(col_description(c.oid, a.attnum), '-') AS line
     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
     JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE n.nspname = ANY ($1) AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0 AND NOT a.attisdropped`,
  ],
  [
    'constraints',
    `SELECT co.conrelid::regclass::text || ' ' || co.conname || ' ' || pg_get_constraintdef(co.oid) AS line
     FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace
     WHERE n.nspname = ANY ($1) AND co.conrelid <> 0`,
  ],
  [
    'indexes',
    `SELECT pg_get_indexdef(i.indexrelid) AS line
     FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = ANY ($1)`,
  ],
  [
    'triggers',
    `SELECT pg_get_triggerdef(t.oid) AS line
     FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = ANY ($1) AND NOT t.tgisinternal`,
  ],
  [
    'row-level security policies',
    `SELECT p.schemaname || '.' || p.tablename || ' ' || p.policyname || ' ' || p.permissive || ' ' || p.cmd
            || ' TO ' || array_to_string(p.roles, ',')
            || ' USING ' || coalesce(p.qual, '-') || ' WITH CHECK ' || coalesce(p.with_check, '-') AS line
     FROM pg_policies p WHERE p.schemaname = ANY ($1)`,
  ],
  [
    'view definitions',
    `SELECT c.oid::regclass::text || ' AS' || E'\\n' || pg_get_viewdef(c.oid) AS line
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname = ANY ($1) AND c.relkind IN ('v', 'm')`,
  ],
  [
    'functions',
    `SELECT pg_get_functiondef(p.oid) || 'OWNER ' || ${roleName('p.proowner')}
            || ' ACL ' || ${acl('p.proacl')}
            || ' COMMENT ' || coalesce(obj_description(p.oid, 'pg_proc'), '-') AS line
     FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ANY ($1)`,
  ],
];

/**
 * The snapshot text of the database at `url`. The migrating role's name is replaced by `<migrator>`, so
 * the text is the same whichever role ran the migrations.
 */
export async function schemaSnapshot(url: string, options: SchemaSnapshotOptions): Promise<string> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const sections: string[] = [];
    for (const [title, query] of QUERIES) {
      // Every query gets the three parameters typed, whichever it uses.
      const { rows } = await client.query<{ line: string | null }>(
        `SELECT line FROM (${query}) q WHERE $1::text[] IS NOT NULL AND $2::text[] IS NOT NULL AND $3::text IS NOT NULL`,
        [options.schemas, options.roles, MIGRATOR],
      );
      const lines = rows.map((r) => r.line ?? '').sort();
      // Multi-line definitions (functions, views, policies) get a blank line between them.
      const separator = lines.some((l) => l.trimEnd().includes('\n')) ? '\n\n' : '\n';
      sections.push(`-- ${title} (${lines.length})\n${lines.map((l) => l.trimEnd()).join(separator)}\n`);
    }
    return `-- Generated by \`npm run schema:snapshot\` from a freshly migrated database; do not edit.\n\n${sections.join('\n')}`;
  } finally {
    await client.end();
  }
}
