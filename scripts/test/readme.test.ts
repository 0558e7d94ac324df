// What the README tells a newcomer to paste must work: its demo ids and calls are the ones the banner
// prints (computed from the seed's code in lib/demo-examples.ts, since work item and media ids are derived
// hashes), and a freshly seeded database has them in the states the README promises. The PostgREST
// version it names is the one docker-compose.yml pins, and its command table lists every script.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { demoSites, enterpriseMigrations, seedEnterprise } from '@platform/enterprise-db';
import type { EnterpriseDatabase } from '@platform/enterprise-db';
import { createDb } from '@platform/service-kit';
import { createTestDatabase } from '@platform/testkit';
import type { TestDatabase } from '@platform/testkit';
import { demoCalls, demoExamples } from '../src/lib/demo-examples.js';
import { localPorts } from '../src/lib/local.js';

const repoRoot = fileURLToPath(new URL('../../', import.meta.url));
const readme = readFileSync(`${repoRoot}README.md`, 'utf8');

describe('README', () => {
  let database: TestDatabase;

  beforeAll(async () => {
    database = await createTestDatabase({ migrations: [enterpriseMigrations] });
    const db = createDb<EnterpriseDatabase>(database.url, { max: 1 });
    try {
      await seedEnterprise(db);
    } finally {
      await db.destroy();
    }
  });

  afterAll(async () => {
    await database?.drop();
  });

  it("shows the banner's demo calls against the default ports, as they are", () => {
    const calls = demoCalls(`http://127.0.0.1:${localPorts.workflow}`);
    for (const line of [calls.token, calls.download, calls.decide]) expect(readme).toContain(`\n${line}\n`);
    for (const id of [demoExamples.site.id, demoExamples.proposedWorkItemId, demoExamples.readyMediaId])
      expect(readme).toContain(`\`${id}\``);
    expect(readme).toContain('`npm run -s token -- alice` prints the bare token');
  });

  it('names ids the seed has: the site, a proposed work item there, a media item ready there', async () => {
    const db = createDb<EnterpriseDatabase>(database.url, { max: 1 });
    try {
      const site = await db
        .selectFrom('enterprise.sites')
        .select(['id', 'name'])
        .where('id', '=', demoExamples.site.id)
        .executeTakeFirst();
      expect(site).toEqual({ id: demoSites.acmeHq.id, name: demoExamples.site.name });
      const item = await db
        .selectFrom('enterprise.work_items')
        .select(['site_id', 'state'])
        .where('id', '=', demoExamples.proposedWorkItemId)
        .executeTakeFirst();
      expect(item).toEqual({ site_id: demoExamples.site.id, state: 'proposed' });
      const media = await db
        .selectFrom('enterprise.media_items')
        .select(['site_id', 'status'])
        .where('id', '=', demoExamples.readyMediaId)
        .executeTakeFirst();
      expect(media).toEqual({ site_id: demoExamples.site.id, status: 'available' });
    } finally {
      await db.destroy();
    }
  });

  it('names the PostgREST version docker-compose.yml pins', () => {
    const pinned = /image:\s*(postgrest\/postgrest:\S+)/.exec(
      readFileSync(`${repoRoot}docker-compose.yml`, 'utf8'),
    )?.[1];
    expect(pinned).toBeDefined();
    for (const mention of readme.match(/postgrest\/postgrest:\S+?(?=[`\s])/g) ?? [])
      expect(mention).toBe(pinned);
    expect(readme).toContain(`--env-file .data/postgrest.env ${pinned!}`);
  });
});
