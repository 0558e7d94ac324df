// What the local stack's banner and the README give a newcomer to call the APIs with (design §5): a demo
// site, a proposed work item there and a media item ready to download, with the calls that use them.
// Work item and media ids are derived hashes (seedId), so they are computed from the seed's own code,
// never copied; scripts/test/readme.test.ts checks that the README shows these and the seed has them.
import { demoRowId, demoSites, demoWorkItemStates } from '@platform/enterprise-db';

const site = 'acmeHq' satisfies keyof typeof demoSites;
/** The first proposed demo work item (items 1-3 of each demo site are proposed). */
const proposedN = demoWorkItemStates.indexOf('proposed') + 1;
/** Demo media item 1 of each site is seeded `available` (2 is `pending_upload`): see fillSitesSql. */
const readyMediaN = 1;

export const demoExamples = {
  user: 'alice',
  site: { id: demoSites[site].id, name: demoSites[site].name },
  proposedWorkItemId: demoRowId('work_item', site, proposedN),
  readyMediaId: demoRowId('media_item', site, readyMediaN),
} as const;

/** The README's and the banner's calls to the workflow API at `workflowUrl`, one shell command each. */
export function demoCalls(workflowUrl: string): { token: string; download: string; decide: string } {
  const base = `${workflowUrl}/sites/${demoExamples.site.id}`;
  return {
    token: `TOKEN=$(npm run -s token -- ${demoExamples.user})`,
    download: `curl -H "Authorization: Bearer $TOKEN" ${base}/media/${demoExamples.readyMediaId}/download`,
    decide:
      `curl -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d '{"decision":"accept"}' ` +
      `${base}/work-items/${demoExamples.proposedWorkItemId}/decision`,
  };
}
