// GET /api/audit (design §3.1, issue 42 §4): who changed what on the fleet side, newest first, paged by an opaque
// cursor, filtered by principal, device, rollout and time. A caller limited to sites reads only the rows that
// touched one of its sites, and of those rows only its sites; a row that also reached other sites shows no detail
// (a rollout's selector could name them) and no rollout id (a rollout it may not see is never named to it,
// rollout/names.ts), and a filter by rollout reads only rows within its sites. A row's site counts as the
// caller's only while it belongs to the company it belonged to when the row was written (migration 0037): a site
// handed to another company takes none of its history there.
import { auditListQuerySchema, auditListResponseSchema } from '@platform/contracts';
import { mapDbError, type RouteDefinition } from '@platform/service-kit';
import type { RequestHandler } from 'express';
import { sql, type Kysely } from 'kysely';
import type { AuditDatabase } from '../audit/table.js';
import type { GatewayDatabase } from '../db/tables.js';
import type { SiteCatalogue } from '../sites/catalogue.js';
import type { CursorSeal } from './cursor-seal.js';
import { principalOf } from './auth.js';
import { readListQuery } from './list-query.js';
import { listDoc, type DocumentedRoute } from './route-parts.js';

export interface AuditRouteDeps {
  db: Kysely<GatewayDatabase>;
  /** The platform's sites as of the last reload (company scopes are read through them). */
  sites: () => SiteCatalogue;
  /** Row ids and cursors, sealed (cursor-seal.ts): a row's number would count other sites' changes. */
  cursors: CursorSeal;
}

export function auditRoutes(
  deps: AuditRouteDeps,
  withAuth: (route: DocumentedRoute) => DocumentedRoute,
): RouteDefinition[] {
  const list: RequestHandler = async (req, res) => {
    const principal = principalOf(res);
    const { cursors } = deps;
    await cursors.ready();
    // The cursor is the last row's sealed id (cursor-seal.ts): only ids this API issued read back.
    const { limit, cursor, filters } = readListQuery(req, auditListQuerySchema, (text) =>
      cursors.open('audit', text),
    );
    const allowed = principal.siteIds(deps.sites());
    const db = deps.db.withTables<AuditDatabase>();
    let q = db
      .selectFrom('device_gateway.audit_events as a')
      .select([
        sql<string>`a.id::text`.as('id'),
        'a.at',
        'a.principal',
        'a.principal_kind',
        'a.principal_name',
        'a.role',
        'a.request_id',
        'a.source_address',
        'a.action',
        'a.device_id',
        'a.rollout_id',
        'a.site_ids',
        'a.site_companies',
        'a.detail',
      ])
      .orderBy('a.id', 'desc')
      .limit(limit + 1);
    // Each allowed site with the company it belongs to now, as rows keep them (site/company).
    const sites = deps.sites();
    const owned = allowed === null ? null : new Set(sites.companyPairs(allowed));
    if (allowed !== null)
      q = q.where(
        sql<boolean>`a.site_ids && ${allowed}::uuid[]
          AND (cardinality(a.site_companies) = 0 OR a.site_companies && ${[...owned!]}::text[])`,
      );
    if (cursor !== undefined) q = q.where(sql<boolean>`a.id < ${cursor}::bigint`);
    if (filters.principal !== undefined) q = q.where('a.principal', '=', filters.principal);
    if (filters.device_id !== undefined) q = q.where('a.device_id', '=', filters.device_id);
    if (filters.rollout_id !== undefined) {
      q = q.where('a.rollout_id', '=', filters.rollout_id);
      // Every site of the row the reader's, with the company it had then (fifth cold review: a row of a rollout
      // the reader may not see, whose site changed company, confirmed that the rollout exists).
      if (allowed !== null)
        q = q.where(
          sql<boolean>`a.site_ids <@ ${allowed}::uuid[]
            AND (cardinality(a.site_companies) = 0 OR a.site_companies <@ ${[...owned!]}::text[])`,
        );
    }
    if (filters.since !== undefined) q = q.where(sql<boolean>`a.at >= ${filters.since}::timestamptz`);
    if (filters.until !== undefined) q = q.where(sql<boolean>`a.at < ${filters.until}::timestamptz`);
    const rows = await q.execute().catch((err: unknown) => {
      throw mapDbError(err);
    });
    const page = rows.slice(0, limit);
    const seen = allowed === null ? null : new Set(allowed);
    res.json({
      items: page.map(({ site_companies: then, ...r }) => {
        const ours = (site: string) =>
          seen!.has(site) &&
          (then.length === 0 || then.some((pair) => pair.startsWith(`${site}/`) && owned!.has(pair)));
        const shown = seen === null ? r.site_ids : r.site_ids.filter(ours);
        const whole = shown.length === r.site_ids.length;
        return {
          ...r,
          id: cursors.seal('audit', r.id),
          at: r.at.toISOString(),
          site_ids: shown,
          // Where another principal acted from (an admin's or another company's address) is not a scoped reader's.
          source_address: seen === null || r.principal === principal.id ? r.source_address : null,
          rollout_id: whole ? r.rollout_id : null,
          detail: !whole ? {} : seen === null ? r.detail : withoutEventId(r.detail),
        };
      }),
      next_cursor: rows.length > limit ? cursors.seal('audit', page[page.length - 1]!.id) : null,
    });
  };

  return [
    withAuth({
      method: 'GET',
      path: '/api/audit',
      handler: list,
      doc: {
        operationId: 'listAudit',
        summary: 'Who changed what on the fleet side - the audit, newest first',
        description: `Every change (notify, override cleared, reload, rollout created/paused/resumed/cancelled/rolled back/
promoted, device keys issued/revoked, the rollout driver's own decisions) is an append-only row: when, who
(principal, key name or driver), from where, the request id, what, and the sites, device and rollout it touched.
Operators and admins; a caller limited to sites reads only rows that touched its sites (and only those sites; a row
that also touched other sites shows neither its detail nor its rollout), and the source address only of its own
changes.
`,
        ...listDoc(auditListQuerySchema, auditListResponseSchema),
        errors: ['forbidden', 'invalid_query', 'backend_unavailable'],
      },
    }),
  ];
}

/**
 * A driver row's detail without its `event_id` (the fleet-wide rollout event sequence, kept for the driver's resume):
 * for a reader limited to sites the gap between two of its rows would count other sites' rollout events (fourth cold
 * review of issue 42; the count review 42b closed for row ids and cursors).
 */
function withoutEventId(detail: Record<string, unknown>): Record<string, unknown> {
  if (!('event_id' in detail)) return detail;
  const { event_id: _sequence, ...rest } = detail;
  return rest;
}
