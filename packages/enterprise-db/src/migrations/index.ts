import { setRolePasswords, type MigrationSet } from '@platform/service-kit';
import { API_LOGIN, AUTHENTICATOR, devRolePasswords } from '../roles.js';
import type { RolePasswords } from '../roles.js';
import { schemaMigration } from './0001-schema.js';
import { securityMigration } from './0002-security.js';
import { cheaperAccessFunctionsMigration } from './0003-cheaper-access-functions.js';
import { companyHintMigration } from './0004-company-hint.js';
import { uploadIntentKeysMigration } from './0005-upload-intent-keys.js';
import { decisionHistoryMigration } from './0006-decision-history.js';
import { multipartUploadsMigration } from './0007-multipart-uploads.js';
import { peopleInViewsMigration } from './0008-people-in-views.js';
import { unclaimedUploadsMigration } from './0009-unclaimed-uploads.js';
import { multipartIntentFirstMigration } from './0010-multipart-intent-first.js';
import { multipartOwnershipMigration } from './0011-multipart-ownership-in-the-database.js';
import { connectGrantsMigration } from './0012-connect-grants.js';
import { sweepProgressMigration } from './0013-sweep-progress.js';
import { connectionLimitsMigration } from './0014-connection-limits.js';
import { multipartGatesMigration } from './0016-multipart-gates.js';

/**
 * The enterprise schema, roles, RLS and read surface; its own migration table. The logins' passwords
 * are an argument: the entry point that runs migrations reads them from its environment
 * (`rolePasswordsFromEnv`), nothing in here does.
 */
export function enterpriseMigrationsWith(passwords: RolePasswords): MigrationSet {
  return {
    name: 'enterprise',
    table: 'enterprise_migrations',
    // Explicit passwords (the environment's) are given again at every run: 0002 sets them only once, a login may
    // change its own, and a rotation is a re-run (operations §3). Development passwords are not: roles are
    // cluster-wide and every test database would rewrite them.
    ...(passwords.explicit
      ? {
          everyRun: setRolePasswords({
            [AUTHENTICATOR]: passwords.authenticator,
            [API_LOGIN]: passwords.enterpriseApi,
          }),
        }
      : {}),
    migrations: {
      '0001_schema': schemaMigration,
      '0002_security': securityMigration(passwords),
      '0003_cheaper_access_functions': cheaperAccessFunctionsMigration,
      '0004_company_hint': companyHintMigration,
      '0005_upload_intent_keys': uploadIntentKeysMigration,
      '0006_decision_history': decisionHistoryMigration,
      '0007_multipart_uploads': multipartUploadsMigration,
      '0008_people_in_views': peopleInViewsMigration,
      '0009_unclaimed_uploads': unclaimedUploadsMigration,
      '0010_multipart_intent_first': multipartIntentFirstMigration,
      '0011_multipart_ownership_in_the_database': multipartOwnershipMigration,
      '0012_connect_grants': connectGrantsMigration,
      '0013_sweep_progress': sweepProgressMigration,
      '0014_connection_limits': connectionLimitsMigration,
      '0016_multipart_gates': multipartGatesMigration,
    },
  };
}

/** With the development passwords (`devRolePasswords`): tests and benchmarks on a private database. */
export const enterpriseMigrations: MigrationSet = enterpriseMigrationsWith(devRolePasswords);
