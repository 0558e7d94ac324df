// One way to call the object store from a use case (design §4.4): what its failures mean to the caller.
import type { Logger } from '@platform/service-kit';
import { ERRORS } from './errors.js';
import { StorageRefusedError, StorageUnavailableError } from './ports.js';

/**
 * Runs `call` against the store. An outage is 503 `backend_unavailable` (the edge adds Retry-After). So is a
 * refusal of our own request (typically 403: this service's credentials or bucket policy lack a permission):
 * the caller's request is sound, we could not carry it out, and for an object event acknowledging would lose
 * it for good — a 503 lets the store redeliver from its queue once an operator has fixed the access that the
 * error line reports. Anything else is rethrown.
 */
export async function storeCall<T>(
  log: Logger,
  what: string,
  call: () => Promise<T>,
  meta: Record<string, unknown> = {},
): Promise<T> {
  try {
    return await call();
  } catch (err) {
    if (err instanceof StorageRefusedError) {
      log.error(`object store refused ${what}`, { ...meta, store_status: err.status, error: err.message });
      throw ERRORS.storeRefused(err);
    }
    if (err instanceof StorageUnavailableError) {
      throw ERRORS.storeUnreachable(err);
    }
    throw err;
  }
}
