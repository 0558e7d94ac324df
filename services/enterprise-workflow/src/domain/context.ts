// What the workflow's use cases are given: storage handles, limits, a clock and counters. Built once
// at boot (main.ts or a test) and passed in; no module-level state.
import type { Logger } from '@platform/service-kit';
import type { Kysely } from 'kysely';
import type { Registry } from '@platform/service-kit';
import type { WorkflowDb } from '../db/database.js';
import type { MediaLimits } from './media-rules.js';
import type { WorkflowMetrics } from './counters.js';
import type { MediaStorage, PortalUser } from './ports.js';

export interface WorkflowContext {
  /** Connected as `enterprise_api_login`; every use goes through a claims-carrying transaction. */
  db: Kysely<WorkflowDb>;
  storage: MediaStorage;
  media: MediaLimits & { uploadUrlTtlS: number; downloadUrlTtlS: number };
  /** When and how files are uploaded in parts (design §4.4). */
  multipart: MultipartSettings;
  /** How long an Idempotency-Key answer is replayed, in seconds. */
  idempotencyTtlS: number;
  metrics: Registry | undefined;
  counters: WorkflowMetrics;
  now: () => Date;
}

/** When and how files are uploaded in parts (design §4.4; the defaults: multipart-uploads.ts). */
export interface MultipartSettings {
  /** Files larger than this are uploaded in parts. */
  thresholdBytes: number;
  /** Preferred part size; raised (to a whole MiB) when the file would need more than 10,000 parts. */
  partSizeBytes: number;
  /** How long an upload in parts may take, from its intent to its completion, in seconds. */
  uploadTtlS: number;
  /**
   * The most uploads in parts one user may have open (pending, intent not expired), across sites; a further
   * intent is 409 `too_many_open_uploads`. Default: defaultMultipartSettings.
   */
  maxOpenPerUser?: number;
  /** The most uploads in parts open at one site, whoever started them. Default: defaultMultipartSettings. */
  maxOpenPerSite?: number;
}

/** The caller of one portal request. */
export interface UserScope {
  user: PortalUser;
  requestId: string;
  log: Logger;
}

/** The webhook's request: the caller is the object store, not a user. */
export interface ServiceScope {
  requestId: string;
  log: Logger;
}
