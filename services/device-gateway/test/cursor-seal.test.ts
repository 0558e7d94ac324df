// The list cursors' seal when its key cannot be read: the API's problem (503), not a raw database error, and a
// later call tries again (src/http/cursor-seal.ts). No database listens at the address: a failover's moment.
import { describe, expect, it } from '@jest/globals';
import { createDb, DomainError } from '@platform/service-kit';
import type { GatewayDatabase } from '../src/db/tables.js';
import { CursorSeal } from '../src/http/cursor-seal.js';

describe('CursorSeal.ready without a database', () => {
  it('throws 503 backend_unavailable, each time it is asked', async () => {
    const gone = createDb<GatewayDatabase>('postgres://nobody:nothing@127.0.0.1:9/none', {
      max: 1,
      connectionTimeoutMs: 500,
      logger: { warn: () => undefined },
    });
    try {
      const seal = new CursorSeal(gone);
      for (let i = 0; i < 2; i++) {
        const err = await seal.ready().then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(err).toBeInstanceOf(DomainError);
        expect({ code: (err as DomainError).code, status: (err as DomainError).status }).toEqual({
          code: 'backend_unavailable',
          status: 503,
        });
      }
    } finally {
      await gone.destroy();
    }
  });
});
