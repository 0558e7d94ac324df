// The local stack's database (npm start): the migrations and seed themselves live in @platform/deploy
// (deploy/src/platform-database.ts), the runtime code of the operations image.
import pg from 'pg';
import { databaseUrl } from '@platform/service-kit';

/** Creates `database` on the cluster of `adminUrl` unless it exists (the local stack's first start). */
export async function ensureDatabase(adminUrl: string, database: string): Promise<string> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    const found = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [database]);
    if (found.rowCount === 0) await client.query(`CREATE DATABASE "${database.replaceAll('"', '""')}"`);
  } finally {
    await client.end();
  }
  return databaseUrl(adminUrl, database);
}
