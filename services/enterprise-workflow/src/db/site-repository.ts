// Sites as the caller sees them through RLS.
import type { Executor } from './database.js';

/** True when the site exists and the caller may act on it (RLS hides every other site). */
export async function siteIsVisible(db: Executor, siteId: string): Promise<boolean> {
  const row = await db
    .selectFrom('enterprise.sites')
    .select('id')
    .where('id', '=', siteId)
    .executeTakeFirst();
  return row !== undefined;
}
