// The schema snapshots checked in beside each migration set: which schemas and roles each one lists, and
// where its file lives. `npm run schema:snapshot` writes them; each set's tests regenerate and compare.
import { fileURLToPath } from 'node:url';
import {
  AUTHENTICATOR,
  API_LOGIN,
  API_ROLE,
  AUTHZ_OWNER,
  enterpriseMigrations,
  MEDIA_INGEST_OWNER,
  PORTAL_ANON,
  PORTAL_ROLE,
} from '@platform/enterprise-db';
import { gatewayMigrations, GATEWAY_LOGIN_ROLE } from '@platform/device-gateway';
import type { MigrationSet } from '@platform/service-kit';
import type { SchemaSnapshotOptions } from '@platform/testkit';

export interface SnapshotTarget extends SchemaSnapshotOptions {
  migrations: MigrationSet;
  file: string;
}

const repo = (path: string): string => fileURLToPath(new URL(`../../../${path}`, import.meta.url));

export const snapshotTargets: readonly SnapshotTarget[] = [
  {
    migrations: enterpriseMigrations,
    file: repo('packages/enterprise-db/schema.sql'),
    schemas: ['enterprise', 'enterprise_api', 'postgrest'],
    roles: [AUTHENTICATOR, PORTAL_ROLE, PORTAL_ANON, API_ROLE, API_LOGIN, AUTHZ_OWNER, MEDIA_INGEST_OWNER],
  },
  {
    migrations: gatewayMigrations,
    file: repo('services/device-gateway/schema.sql'),
    schemas: ['device_gateway'],
    roles: [GATEWAY_LOGIN_ROLE],
  },
];
