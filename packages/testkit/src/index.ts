export { freePort } from './ports.js';
export { startPostgres } from './postgres.js';
export type { PostgresServer, StartPostgresOptions } from './postgres.js';
export { createTestDatabase, databaseUrl, migrationFingerprint } from './database.js';
export type { CreateTestDatabaseOptions, TestDatabase } from './database.js';
