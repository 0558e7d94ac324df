// Every migration set's schema, as a freshly migrated database has it, equals the snapshot checked in beside
// it: a migration that changes a table, a grant or a policy without `npm run schema:snapshot` fails here, and
// the committed diff of schema.sql shows the change in readable form.
import { readFile } from 'node:fs/promises';
import { createTestDatabase, schemaSnapshot } from '@platform/testkit';
import { snapshotTargets } from '../src/lib/schema-snapshots.js';

describe.each(snapshotTargets.map((t) => [t.migrations.name, t] as const))(
  'schema of %s',
  (_name, target) => {
    it('equals the checked-in snapshot (run `npm run schema:snapshot` after changing a migration)', async () => {
      const database = await createTestDatabase({ migrations: [target.migrations] });
      try {
        const actual = await schemaSnapshot(database.url, target);
        expect(actual).toBe(await readFile(target.file, 'utf8'));
      } finally {
        await database.drop();
      }
    });
  },
);
