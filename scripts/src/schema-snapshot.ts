// `npm run schema:snapshot`: migrates a fresh embedded PostgreSQL with each migration set and writes the
// normalised schema text beside it (packages/enterprise-db/schema.sql, services/device-gateway/schema.sql).
// scripts/test/schema-snapshot.test.ts fails when a migration changes the schema and this was not run.
import { writeFile } from 'node:fs/promises';
import { createTestDatabase, schemaSnapshot, startPostgres } from '@platform/testkit';
import { snapshotTargets } from './lib/schema-snapshots.js';

const server = await startPostgres();
try {
  for (const target of snapshotTargets) {
    const database = await createTestDatabase({ migrations: [target.migrations], adminUrl: server.url });
    try {
      await writeFile(target.file, await schemaSnapshot(database.url, target));
      process.stdout.write(`wrote ${target.file}\n`);
    } finally {
      await database.drop();
    }
  }
} finally {
  await server.destroy();
}
