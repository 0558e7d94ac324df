export {
  createDb,
  PINNED_SESSION_OPTIONS,
  RESET_OWN_DEFAULTS_SQL,
  resetOwnDefaults,
  sideSession,
} from './create-db.js';
export type { CreateDbOptions, DbLogger, SideSession } from './create-db.js';
export { MigrationError, migrateToLatest, setRolePasswords, withGeneratedSql } from './migrate.js';
export type { AppliedMigration, EveryRunContext, MigrationSet } from './migrate.js';
export { isConnectionError, isRetryableTransactionError, mapDbError, sqlState } from './errors.js';
export { databaseUrl } from './url.js';
