// The one place the testkit reads its environment. jest's globalSetup (../jest/global-setup.js) starts
// PostgreSQL and exports TEST_DATABASE_URL to the workers; a developer or CI may set it instead.
import { delimiter } from 'node:path';

/** Superuser URL of the PostgreSQL server that test databases are created on: `given`, else the environment's. */
export function testDatabaseAdminUrl(given?: string): string {
  const url = given ?? process.env['TEST_DATABASE_URL'];
  if (url === undefined || url === '') {
    throw new Error(
      'TEST_DATABASE_URL is not set: run the tests through jest (its globalSetup starts PostgreSQL) ' +
        'or set it to a superuser URL of a PostgreSQL server',
    );
  }
  return url;
}

/** The directories the testkit looks in for the external commands it starts (Ceph's, for rgw.ts): PATH's. */
export function commandSearchPath(): string[] {
  return (process.env['PATH'] ?? '').split(delimiter).filter((dir) => dir !== '');
}
