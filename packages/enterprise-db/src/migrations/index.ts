import type { MigrationSet } from '@platform/service-kit';
import { schemaMigration } from './0001-schema.js';
import { securityMigration } from './0002-security.js';

/** The enterprise schema, roles, RLS and read surface; its own migration table. */
export const enterpriseMigrations: MigrationSet = {
  name: 'enterprise',
  table: 'enterprise_migrations',
  migrations: {
    '0001_schema': schemaMigration,
    '0002_security': securityMigration,
  },
};
